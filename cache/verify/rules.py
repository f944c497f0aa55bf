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
- named entities: a capitalised word (not sentence-initial) replaced by a different one;
- contrast words (issue 34, attack round), when the texts differ only there (at most 3 edits
  between their common prefix and suffix): a preposition for its counterpart (to/from,
  into/out of, before/after/during, above/below; "direction"; with/without is a negation),
  two operands trading places ("a if b" / "b if a", "direction"), another time reference
  (last/this/next year, today/tomorrow) or an offset's sign ("i+1" / "i-1", both "number"), a
  comparative against "less" + its base ("healthier" / "less healthy", "opposite"). They
  extend the five rules rather than add one: ``RULES`` is also the learned verifier's feature
  list. A pronoun swap ("do I pay" / "do you pay") is no contrast: a question to an assistant
  uses the generic you.

Pure functions on strings; the rules were chosen by reading QQP false positives (see
cache/README.md for the measured effect).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
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
    # attack round (issue 34): opposite adjectives an embedding treats as one topic
    ("safe", "dangerous"),
    ("safe", "unsafe"),
    ("safer", "dangerous"),
    ("healthy", "unhealthy"),
    ("healthier", "unhealthier"),
    ("cheaper", "expensive"),
    ("cheapest", "expensive"),
    ("easy", "difficult"),
    ("easy", "hard"),
    ("easier", "harder"),
    ("strong", "weak"),
    ("stronger", "weaker"),
    ("better", "worse"),
    ("early", "late"),
    ("earlier", "later"),
    ("above", "below"),
    ("over", "under"),
    ("inbound", "outbound"),
    ("incoming", "outgoing"),
    ("upstairs", "downstairs"),
    # second attack round (issue 34): what the learned default served with another answer
    ("reads", "writes"),
    ("reading", "writing"),
    ("directed", "starred"),
    ("directed", "produced"),
    ("wrote", "produced"),
    ("wrote", "directed"),
    ("while", "after"),
    ("while", "before"),
]
# periods: a word of one group against a word of another is another request ("every day" /
# "every hour", "30 seconds" / "30 minutes"); within a group they are one ("daily" / "every day")
_PERIODS = [
    ("millisecond", "milliseconds", "ms"),
    ("seconds", "secs"),
    ("minute", "minutes", "mins"),
    ("hour", "hours", "hourly"),
    ("day", "days", "daily"),
    ("week", "weeks", "weekly"),
    ("month", "months", "monthly"),
    ("year", "years", "yearly", "annually", "annual"),
]
_ANTONYMS += [(a, b) for i, group in enumerate(_PERIODS) for other in _PERIODS[i + 1 :] for a in group for b in other]
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
    signed: frozenset[tuple[str, str]]  # ("+" or "-", number) of offsets such as "i+1"


_IDIOMS = re.compile(r"\b(?:why or why not|or not|whether or not|or no)\b", re.IGNORECASE)
# written negations the tokenizer would split: "w/o eggs", "gluten-free" (read as "without")
_WITHOUT = re.compile(r"\bw/o\b|(?<=[A-Za-z])-free\b", re.IGNORECASE)
# an offset's sign: "+"/"-" after an identifier or a closing bracket, before a number ("a[i-1]",
# "x + 2"); _WORD drops the sign, and "2-3 days" (a range) is no offset
_SIGNED = re.compile(r"(?<=[A-Za-z_\])])\s*([+-])\s*(\d+(?:\.\d+)?)")
_MISSPELT_NEGATIONS = frozenset(
    "cant dont doesnt isnt arent wasnt werent wont didnt wouldnt shouldnt couldnt hasnt havent".split()
)


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


@lru_cache(maxsize=8192)
def _parse(text: str) -> _Text:
    # "or not" / "why or why not" ask the same question; they are not a negation
    text = _IDIOMS.sub(" ", text.replace("\u2019", "'").replace("\u2018", "'"))
    text = _WITHOUT.sub(" without ", text)
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
        frozenset((m.group(1), m.group(2)) for m in _SIGNED.finditer(text)),
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


# Contrast words (attack round, issue 34): two texts that differ only where one has a word of a
# closed list and the other its counterpart ("flights to london" / "flights from london"). A
# set comparison misses most of them: "to" is in both texts of "get to the airport" / "get
# from the airport". So the two word sequences are aligned (difflib) and each replaced span is
# looked up; only when the texts' words differ by one of these words at all (a set test, cheap).
# Each pair: (span of one text, span of the other), the rule it counts for.
_CONTRAST_SPANS: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
for _rule, _pairs in (
    (
        "direction",
        [
            ("to", "from"),
            ("into", "from"),
            ("into", "out of"),
            ("in to", "out of"),
            ("in", "out"),
            ("onto", "off"),
            ("toward", "away from"),
            ("towards", "away from"),
            ("before", "after"),
            ("before", "during"),
            ("after", "during"),
            ("before", "when"),
            ("above", "below"),
            ("over", "under"),
        ],
    ),
    (
        "number",  # a time reference names another date, as another year's number does
        [
            ("this", "last"),
            ("this", "next"),
            ("last", "next"),
            ("this", "previous"),
            ("next", "previous"),
            ("today", "yesterday"),
            ("today", "tomorrow"),
            ("yesterday", "tomorrow"),
            ("tonight", "tomorrow"),
            ("tonight", "yesterday"),
        ],
    ),
):
    for _x, _y in _pairs:
        _CONTRAST_SPANS[(tuple(_x.split()), tuple(_y.split()))] = _rule
        _CONTRAST_SPANS[(tuple(_y.split()), tuple(_x.split()))] = _rule
_CONTRAST_WORDS = frozenset(w for pair in _CONTRAST_SPANS for span in pair for w in span) | {"less", "least"}
# "this"/"last"/"next" are a time reference only before a unit of time ("this year")
_TIME_DEICTIC = frozenset("this last next previous".split())
_TIME_UNITS = frozenset(
    """year years week weeks month months day days weekend season night morning evening decade
    century quarter semester summer winter spring fall autumn time""".split()
)


# the texts may differ in this many places (the contrast word's included): "how do i get to"
# / "how can i get from" is still one question against the other
_MAX_EDITS = 3
# words between the texts' common prefix and suffix that are aligned at most (difflib is
# quadratic: 350-word texts that differ throughout took 13 ms)
_MAX_MIDDLE = 40


def _lessened(word: str, span: tuple[str, ...]) -> bool:
    """A comparative or superlative against "less"/"least" with its base: "healthier" / "less
    healthy", "safest" / "least safe" (the opposite degree; "more healthy" is a paraphrase)."""
    if len(span) != 2 or span[0] not in ("less", "least"):
        return False
    base = span[1]
    for suffix, cut in (("ier", "y"), ("iest", "y"), ("er", ""), ("est", ""), ("r", ""), ("st", "")):
        if word.endswith(suffix):
            stem = word[: -len(suffix)] + cut
            if stem == base or (len(stem) > 2 and stem[-1] == stem[-2] and stem[:-1] == base):  # bigger
                return True
    return False


def _transposed(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Two words trade places and nothing else changes ("x = a if b else c" / "x = b if a
    else c"), with no symmetric word between them ("tea or coffee" / "coffee or tea")."""
    if len(a) != len(b):
        return False
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) != 2:
        return False
    i, j = diff
    # neighbours trading places is word order ("why chemistry is" / "why is chemistry")
    return j > i + 1 and a[i] == b[j] and a[j] == b[i] and not _between(a, i, j) & _SYMMETRIC


def _contrasts(ta: _Text, tb: _Text) -> frozenset[str]:
    """The rules (of ``RULES``) that a contrast word between the two texts counts for:
    "direction" for a swapped preposition or transposed operands, "number" for another time
    reference or an offset's sign ("i+1" / "i-1"), "opposite" for "healthier" / "less healthy"."""
    found: set[str] = set()
    if any((("-" if s == "+" else "+"), n) in tb.signed for s, n in ta.signed - tb.signed):
        found.add("number")
    if ta.word_set == tb.word_set:
        if ta.words != tb.words and _transposed(ta.words, tb.words):
            found.add("direction")
        return frozenset(found)
    if not (ta.word_set ^ tb.word_set) & _CONTRAST_WORDS:
        return frozenset(found)
    a, b = ta.words, tb.words
    # align only what lies between the common prefix and suffix: linear, and the alignment
    # (quadratic) stays small; two long texts that differ far apart are left to the other rules
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    middle_a, middle_b = a[start : len(a) - end], b[start : len(b) - end]
    if max(len(middle_a), len(middle_b)) > _MAX_MIDDLE:
        return frozenset(found)
    edits = [op for op in SequenceMatcher(None, middle_a, middle_b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(edits) > _MAX_EDITS:
        return frozenset(found)  # reworded throughout: one changed preposition is no evidence there
    for tag, i1, i2, j1, j2 in edits:
        if tag != "replace":
            continue
        sa, sb = middle_a[i1:i2], middle_b[j1:j2]
        rule = _CONTRAST_SPANS.get((sa, sb))
        following = start + i2  # the word after the span in a
        if rule == "number" and sa[0] in _TIME_DEICTIC and (following >= len(a) or a[following] not in _TIME_UNITS):
            rule = None  # "this one" / "the last one": no time reference
        if rule is None and ((len(sa) == 1 and _lessened(sa[0], sb)) or (len(sb) == 1 and _lessened(sb[0], sa))):
            rule = "opposite"
        if rule is not None:
            found.add(rule)
    return frozenset(found)


def verify(query: str, candidate: str) -> Verdict:
    """Whether ``candidate`` (a cached question) may answer ``query``; pure, case-insensitive
    except for the named-entity rule."""
    pa, pb = _parse(query), _parse(candidate)
    if bool(pa.word_set & NEGATIONS) != bool(pb.word_set & NEGATIONS):
        return Verdict(False, "negation")
    contrasts = _contrasts(pa, pb)
    if pa.numbers != pb.numbers or "number" in contrasts:
        return Verdict(False, "number")
    opposite = _opposites(pa.word_set, pb.word_set)
    if opposite is not None or "opposite" in contrasts:
        return Verdict(False, "opposite")
    if "direction" in contrasts or _swapped(pa, pb):
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
    contrasts = _contrasts(pa, pb)
    return {
        "negation": bool(pa.word_set & NEGATIONS) != bool(pb.word_set & NEGATIONS),
        "number": pa.numbers != pb.numbers or "number" in contrasts,
        "opposite": _opposites(pa.word_set, pb.word_set) is not None or "opposite" in contrasts,
        "direction": "direction" in contrasts or _swapped(pa, pb),
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
