"""Features of a (query, cached text) pair for the learned verifier (cache/verify/learned.py).

Pure functions on strings plus the pair's cosine similarity. The features are meant to carry
to other wordings than the training set's (QQP): the embedder's similarity, the rule flags of
cache/verify/rules.py as inputs instead of vetoes, lexical overlap (word and character 3-gram
Jaccard), differences in numbers, names and negation, the question word and the length
ratio. No feature looks at which words a text contains, so the model cannot learn QQP's
vocabulary.

``FEATURES`` names the columns; ``pair_features`` returns them as one float64 row. The order
is part of the verifier file's format (the file stores the names and the loader checks them).
"""

from __future__ import annotations

import math
import re
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


def _jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
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
    )


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
    ]
    return np.asarray(row, dtype=np.float64)


def feature_matrix(pairs: list[tuple[str, str]], cosines: np.ndarray) -> np.ndarray:
    """``pair_features`` of many pairs: shape (len(pairs), len(FEATURES))."""
    if not pairs:
        return np.zeros((0, len(FEATURES)))
    return np.stack([pair_features(a, b, float(c)) for (a, b), c in zip(pairs, cosines, strict=True)])
