"""Verification of a semantic candidate: reject near-duplicates that ask for something else.

Sentence embeddings place "turn on the lights" next to "turn off the lights", "PDF to HTML"
next to "HTML to PDF", "round 1" next to "round 2". After the nearest-neighbour search finds a
candidate above the similarity threshold, ``verify`` compares the two texts word by word and
rejects the pair when one of these differs:

- negation: "not", "never", "without", "n't", ... present in one text only;
- numbers: digits and number words ("two" == "2") as sets;
- opposite words: one text uses a word and the other its antonym (on/off, allow/deny, ...);
- direction: the same content words in a swapped order around "to", "from", "vs", "than", ...
  or with two shared content words in opposite order;
- named entities: a capitalised word (not sentence-initial) replaced by a different one.

Pure functions on strings; the rules were chosen by reading QQP false positives (see
cache/README.md for the measured effect).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|\d+(?:[.,]\d+)*")

NEGATIONS = frozenset("not no never without cannot nor none nobody nothing neither nowhere n't".split())

_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
_NUMBER_WORDS.update(
    {
        "thirty": "30",
        "forty": "40",
        "fifty": "50",
        "sixty": "60",
        "seventy": "70",
        "eighty": "80",
        "ninety": "90",
        "hundred": "100",
        "thousand": "1000",
        "million": "1e6",
        "billion": "1e9",
        "first": "1st",
        "second": "2nd",
        "third": "3rd",
        "fourth": "4th",
        "fifth": "5th",
        "sixth": "6th",
        "seventh": "7th",
        "eighth": "8th",
        "ninth": "9th",
        "tenth": "10th",
    }
)

# each pair: opposite meanings that an embedding places close together
_ANTONYMS = [
    ("on", "off"),
    ("enable", "disable"),
    ("enabled", "disabled"),
    ("allow", "deny"),
    ("allowed", "denied"),
    ("accept", "reject"),
    ("open", "close"),
    ("start", "stop"),
    ("increase", "decrease"),
    ("up", "down"),
    ("buy", "sell"),
    ("add", "remove"),
    ("lock", "unlock"),
    ("before", "after"),
    ("more", "less"),
    ("best", "worst"),
    ("max", "min"),
    ("maximum", "minimum"),
    ("true", "false"),
    ("yes", "no"),
    ("include", "exclude"),
    ("import", "export"),
    ("upload", "download"),
    ("encrypt", "decrypt"),
    ("win", "lose"),
    ("positive", "negative"),
    ("male", "female"),
    ("men", "women"),
    ("man", "woman"),
    ("boy", "girl"),
    ("husband", "wife"),
    ("pros", "cons"),
    ("advantages", "disadvantages"),
    ("benefits", "drawbacks"),
    ("good", "bad"),
    ("high", "low"),
    ("higher", "lower"),
    ("highest", "lowest"),
    ("big", "small"),
    ("bigger", "smaller"),
    ("largest", "smallest"),
    ("fast", "slow"),
    ("faster", "slower"),
    ("cheap", "expensive"),
    ("hot", "cold"),
    ("rich", "poor"),
    ("old", "new"),
    ("older", "younger"),
    ("gain", "lose"),
    ("love", "hate"),
    ("like", "dislike"),
    ("legal", "illegal"),
    ("possible", "impossible"),
    ("always", "never"),
    ("all", "none"),
    ("first", "last"),
    ("north", "south"),
    ("east", "west"),
    ("left", "right"),
    ("light", "dark"),
    ("input", "output"),
    ("inside", "outside"),
    ("send", "receive"),
    ("encode", "decode"),
    ("compress", "decompress"),
    ("install", "uninstall"),
    ("subscribe", "unsubscribe"),
    ("block", "unblock"),
    ("follow", "unfollow"),
    ("connect", "disconnect"),
    ("mount", "unmount"),
    ("zip", "unzip"),
    ("join", "leave"),
    ("push", "pull"),
    ("read", "write"),
    ("show", "hide"),
    ("visible", "hidden"),
    ("public", "private"),
    ("online", "offline"),
    ("asc", "desc"),
    ("ascending", "descending"),
    ("plus", "minus"),
    ("sum", "difference"),
    ("day", "night"),
    ("summer", "winter"),
    ("right", "wrong"),
    ("correct", "incorrect"),
    ("success", "failure"),
]
_OPPOSITE: dict[str, frozenset[str]] = {}
for _a, _b in _ANTONYMS:
    _OPPOSITE[_a] = _OPPOSITE.get(_a, frozenset()) | {_b}
    _OPPOSITE[_b] = _OPPOSITE.get(_b, frozenset()) | {_a}

_DIRECTION_WORDS = frozenset("to into from than vs versus against over onto toward towards".split())

_STOPWORDS = frozenset(
    """a an the is are was were be been being am do does did doing have has had having i me my
    we our you your he him his she her it its they them their what which who whom whose this that
    these those how why when where there here of in on at by for with about as into to from and or
    but if so than too very can could should would will shall may might must just also any some
    such own same other s t get got make way ways best good really ever way much many one use
    using used vs""".split()
)


@dataclass(frozen=True)
class Verdict:
    """Outcome of verification: ok, or the name of the rule that rejected the pair."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class _Text:
    """What the rules compare of one text, derived once per text (``_parse`` caches it: a
    stored text is compared on every lookup it is a candidate of)."""

    words: tuple[str, ...]  # lower case, contractions split ("don't" -> "do", "n't")
    capitals: frozenset[str]  # lower-cased capitalised words that are not sentence-initial
    word_set: frozenset[str]
    stems: frozenset[str]  # of word_set
    numbers: frozenset[str]  # _numbers(words)
    neighbours: frozenset[tuple[str, str, str]]  # _neighbours(words)
    content: frozenset[str]  # _content(words)


_IDIOMS = re.compile(r"\b(?:why or why not|or not|whether or not|or no)\b", re.IGNORECASE)
_MISSPELT_NEGATIONS = frozenset(
    "cant dont doesnt isnt arent wasnt werent wont didnt wouldnt shouldnt couldnt hasnt havent".split()
)


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


@lru_cache(maxsize=8192)
def _parse(text: str) -> _Text:
    # "or not" / "why or why not" ask the same question; they are not a negation
    text = _IDIOMS.sub(" ", text.replace("\u2019", "'").replace("\u2018", "'"))
    words: list[str] = []
    capitals: set[str] = set()
    sentence_start = True
    for match in _WORD.finditer(text):
        raw = match.group()
        lower = raw.lower()
        if lower in ("cannot", "can't"):
            words.extend(["can", "n't"])
        elif lower.endswith("n't"):
            # "do n't", as tokenised text writes it: the negation alone, no empty word
            words.extend([lower[:-3], "n't"] if len(lower) > 3 else ["n't"])
        elif lower in _MISSPELT_NEGATIONS:
            words.extend([lower[:-1], "n't"])
        else:
            lower = lower.split("'")[0]  # possessive / contraction: "trump's" -> "trump"
            words.append(lower)
            if raw[0].isupper() and not sentence_start and lower != "i" and lower not in _STOPWORDS:
                capitals.add(_stem(lower))
        sentence_start = text[match.end() : match.end() + 2].lstrip(" ")[:1] in (".", "?", "!", ":")
    parsed = tuple(words)
    word_set = frozenset(parsed)
    return _Text(
        parsed,
        frozenset(capitals),
        word_set,
        frozenset(map(_stem, word_set)),
        _numbers(parsed),
        _neighbours(parsed),
        frozenset(_content(parsed)),
    )


def _numbers(words: tuple[str, ...]) -> frozenset[str]:
    found = set()
    for word in words:
        if word[0].isdigit():
            found.add(word.replace(",", ""))
        elif word in _NUMBER_WORDS:
            found.add(_NUMBER_WORDS[word])
    # "one"/"first" are mostly a pronoun or filler ("which one", "my first book"), and "1" is
    # the same word in digits; a different count still shows as the other number
    return frozenset(found - {"1", "1st"})


def _content(words: tuple[str, ...]) -> list[str]:
    return [w for w in words if w not in _STOPWORDS and w not in NEGATIONS and not w[0].isdigit()]


def _opposites(a: frozenset[str], b: frozenset[str]) -> str | None:
    for word in a - b:
        for opposite in _OPPOSITE.get(word, ()):
            if opposite in b and opposite not in a:
                return f"{word}/{opposite}"
    return None


_ASYMMETRIC = frozenset("to into from than about of in on for by over onto towards toward against".split())
_SYMMETRIC = frozenset("and or vs versus between".split())


def _between(words: tuple[str, ...], i: int, j: int) -> frozenset[str]:
    lo, hi = min(i, j), max(i, j)
    return frozenset(words[lo + 1 : hi])


def _neighbours(words: tuple[str, ...]) -> frozenset[tuple[str, str, str]]:
    """(x, connector, y) for each directional word with the nearest content words around it;
    one pass each way (it was quadratic in the words: 1,900-character texts dominated the
    verification's p99)."""
    after: list[str | None] = [None] * len(words)
    following: str | None = None
    for i in range(len(words) - 1, -1, -1):
        after[i] = following
        if words[i] not in _STOPWORDS:
            following = words[i]
    found: set[tuple[str, str, str]] = set()
    before: str | None = None
    for i, word in enumerate(words):
        nearest_after = after[i]
        if word in _ASYMMETRIC and before is not None and nearest_after is not None:
            found.add((before, word, nearest_after))
        if word not in _STOPWORDS:
            before = word
    return frozenset(found)


def _swapped(ta: _Text, tb: _Text) -> bool:
    """The same relation with its two sides swapped: "x to y" / "y to x" around one
    directional word ("PDF to HTML" / "HTML to PDF"); or, when two short texts use the same
    content words, two of them in opposite order with a directional word between them in both
    ("Indians find annoying about Americans" / the reverse). A symmetric word between them
    ("between A and B", "A or B") means the order does not matter."""
    if any((y, c, x) in tb.neighbours for x, c, y in ta.neighbours if x != y):
        return True
    if ta.content != tb.content or len(ta.content) > 6:
        return False  # reworded or long: reordering is style there, not meaning
    a, b = ta.words, tb.words
    pos_a = {w: i for i, w in reversed(list(enumerate(a))) if w not in _STOPWORDS}
    pos_b = {w: i for i, w in reversed(list(enumerate(b))) if w not in _STOPWORDS}
    shared = [w for w in pos_a if w in pos_b and w not in NEGATIONS]
    for x in range(len(shared)):
        for y in range(x + 1, len(shared)):
            u, v = shared[x], shared[y]
            if (pos_a[u] < pos_a[v]) == (pos_b[u] < pos_b[v]):
                continue
            between_a = _between(a, pos_a[u], pos_a[v])
            between_b = _between(b, pos_b[u], pos_b[v])
            if between_a & _ASYMMETRIC and between_b & _ASYMMETRIC and not (between_a | between_b) & _SYMMETRIC:
                return True
    return False


def verify(query: str, candidate: str) -> Verdict:
    """Whether ``candidate`` (a cached question) may answer ``query``; pure, case-insensitive
    except for the named-entity rule."""
    pa, pb = _parse(query), _parse(candidate)
    if bool(pa.word_set & NEGATIONS) != bool(pb.word_set & NEGATIONS):
        return Verdict(False, "negation")
    if pa.numbers != pb.numbers:
        return Verdict(False, "number")
    opposite = _opposites(pa.word_set, pb.word_set)
    if opposite is not None:
        return Verdict(False, "opposite")
    if _swapped(pa, pb):
        return Verdict(False, "direction")
    if (pa.capitals - pb.stems) and (pb.capitals - pa.stems):
        return Verdict(False, "entity")
    return Verdict(True)


RULES = ("negation", "number", "opposite", "direction", "entity")


def rule_flags(query: str, candidate: str) -> dict[str, bool]:
    """Every rule of ``verify`` evaluated on its own (True = the rule would reject the pair),
    keyed by the names of ``RULES``: the learned verifier's rule features (cache/verify/learned.py),
    where ``verify`` stops at the first rule that fires."""
    pa, pb = _parse(query), _parse(candidate)
    return {
        "negation": bool(pa.word_set & NEGATIONS) != bool(pb.word_set & NEGATIONS),
        "number": pa.numbers != pb.numbers,
        "opposite": _opposites(pa.word_set, pb.word_set) is not None,
        "direction": _swapped(pa, pb),
        "entity": bool(pa.capitals - pb.stems) and bool(pb.capitals - pa.stems),
    }


def parsed_words(text: str) -> tuple[str, ...]:
    """The text's words as the rules see them: lower case, contractions split ("don't" ->
    "do", "n't"), possessives dropped."""
    return _parse(text).words


def numbers_of(text: str) -> frozenset[str]:
    """The numbers a text names, digits and number words alike ("two" == "2"), without 1."""
    return _parse(text).numbers


def entities_of(text: str) -> frozenset[str]:
    """Lower-cased stems of the capitalised words that do not start a sentence (names)."""
    return _parse(text).capitals


def select(
    query: str, candidates: Sequence[tuple[str, float]], threshold: float, margin: float = 0.02
) -> tuple[int | None, Counter[str]]:
    """Which candidate may answer ``query``: candidates are (text, cosine similarity), most
    similar first. The first one with similarity >= threshold that verification accepts, if
    it is within ``margin`` of the most similar candidate (a much less similar text is a
    different question, not a better answer). Returns its index (or None) and the rejected
    candidates counted by rule.
    """
    rejected: Counter[str] = Counter()
    if not candidates:
        return None, rejected
    best = candidates[0][1]
    for i, (text, similarity) in enumerate(candidates):
        if similarity < threshold or similarity < best - margin:
            break
        verdict = verify(query, text)
        if verdict.ok:
            return i, rejected
        rejected[verdict.reason] += 1
    return None, rejected
