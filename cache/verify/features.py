"""Features of a (query, cached text) pair for the learned verifier (cache/verify/learned.py).

Pure functions on strings plus the pair's cosine similarity. The features are meant to carry
to other wordings than the training set's (QQP): the embedder's similarity, the rule flags of
cache/verify/rules.py as inputs instead of vetoes, lexical overlap (word and character 3-gram
Jaccard), differences in numbers, names and negation, the question word and the length
ratio, and word order (issue 34: word-bigram Jaccard and the share of shared content words
whose order differs, for near-misses that reuse every word in another role, "a dog is licking a
baby" / "a baby is licking a dog", the kind PAWS (Zhang et al., 2019) showed bag-of-words
similarity cannot tell apart). No feature looks at which words a text contains, so the model
cannot learn QQP's vocabulary.

``FEATURES`` names the columns; ``pair_features`` returns them as one float64 row. The order
is part of the verifier file's format (the file stores the names and the loader checks them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cache.verify.rules import NEGATIONS, RULES, entities_of, numbers_of, parsed_words, rule_flags

FEATURES: tuple[str, ...] = (
    "cosine",
    *(f"rule_{name}" for name in RULES),
    "rules_any",
    "word_jaccard",
    "content_jaccard",
    "char3_jaccard",
    "content_only_one_side",
    "number_diff",
    "entity_diff",
    "negation_diff",
    "question_word_differs",
    "length_ratio",
    "log_min_words",
    "word_bigram_jaccard",
    "order_discordance",
)

# function words: overlap on them says little about meaning (a shorter list than verify's:
# "best", "way", "good" are content here)
_FUNCTION = frozenset(
    """a an the is are was were be been being am do does did have has had i me my we our you
    your he him his she her it its they them their this that these those of in on at by for with
    about as into to from and or but if so than too very can could should would will shall may
    might must just also any some there here s t""".split()
)
_QUESTION_WORDS = (
    "what",
    "how",
    "why",
    "when",
    "where",
    "who",
    "whom",
    "whose",
    "which",
    "is",
    "are",
    "can",
    "do",
    "does",
    "did",
    "should",
    "will",
    "would",
    "could",
)
_SPACES = re.compile(r"\s+")


def _jaccard(a: AbstractSet[object], b: AbstractSet[object]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _char3(text: str) -> set[str]:
    t = " " + _SPACES.sub(" ", text.lower()).strip() + " "
    return {t[i : i + 3] for i in range(len(t) - 2)}


def _question_word(words: tuple[str, ...]) -> str:
    for word in words[:6]:
        if word in _QUESTION_WORDS:
            return word
    return ""


@dataclass(frozen=True)
class _Profile:
    """What the features need of one text, computed once per text (a cached entry's text is
    compared with many queries)."""

    words: tuple[str, ...]
    word_set: frozenset[str]
    content: frozenset[str]
    char3: frozenset[str]
    numbers: frozenset[str]
    entities: frozenset[str]
    negations: int
    question_word: str
    bigrams: frozenset[tuple[str, str]]
    content_order: tuple[str, ...]  # stemmed content words in text order


@lru_cache(maxsize=16384)
def _profile(text: str) -> _Profile:
    words = parsed_words(text)
    word_set = frozenset(words)
    return _Profile(
        words=words,
        word_set=word_set,
        content=frozenset(_stem(w) for w in word_set if w not in _FUNCTION and w not in NEGATIONS),
        char3=frozenset(_char3(text)),
        numbers=numbers_of(text),
        entities=entities_of(text),
        negations=sum(w in NEGATIONS for w in words),
        question_word=_question_word(words),
        bigrams=frozenset(zip(words, words[1:], strict=False)),
        content_order=tuple(_stem(w) for w in words if w not in _FUNCTION and w not in NEGATIONS),
    )


def _order_discordance(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    """Share of pairs of content words found once in each text whose order differs (0: same
    order or fewer than two such words, 1: reversed): a Kendall distance on the shared words."""
    once_a = {w for w in a if a.count(w) == 1}
    once_b = {w for w in b if b.count(w) == 1}
    shared = [w for w in a if w in once_a and w in once_b]
    if len(shared) < 2:
        return 0.0
    rank = {w: i for i, w in enumerate(w for w in b if w in once_a and w in once_b)}
    order = [rank[w] for w in shared]
    n = len(order)
    discordant = sum(order[i] > order[j] for i in range(n) for j in range(i + 1, n))
    return discordant / (n * (n - 1) / 2)


def pair_features(query: str, candidate: str, cosine: float) -> np.ndarray:
    """One row of ``FEATURES`` (float64, shape (len(FEATURES),)) for a pair; symmetric in the
    two texts. cosine: the embedder's similarity of the pair, -1..1."""
    a, b = _profile(query), _profile(candidate)
    flags = rule_flags(query, candidate)
    na, nb = len(a.words), len(b.words)
    row = [
        cosine,
        *(float(flags[name]) for name in RULES),
        float(any(flags.values())),
        _jaccard(a.word_set, b.word_set),
        _jaccard(a.content, b.content),
        _jaccard(a.char3, b.char3),
        float(max(len(a.content - b.content), len(b.content - a.content))),
        float(len(a.numbers ^ b.numbers)),
        float(len(a.entities ^ b.entities)),
        float(abs(a.negations - b.negations)),
        float(a.question_word != b.question_word),
        min(na, nb) / max(na, nb) if max(na, nb) else 1.0,
        math.log1p(min(na, nb)),
        _jaccard(a.bigrams, b.bigrams) if a.bigrams or b.bigrams else 1.0,
        _order_discordance(a.content_order, b.content_order),
    ]
    return np.asarray(row, dtype=np.float64)


def feature_matrix(pairs: list[tuple[str, str]], cosines: np.ndarray) -> np.ndarray:
    """``pair_features`` of many pairs: shape (len(pairs), len(FEATURES))."""
    if not pairs:
        return np.zeros((0, len(FEATURES)))
    return np.stack([pair_features(a, b, float(c)) for (a, b), c in zip(pairs, cosines, strict=True)])
