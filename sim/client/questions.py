"""Prompt texts for replay: a seeded mix of new questions, exact repeats and paraphrases.

Source: labelled question pairs ``{"text_a", "text_b", "label"}`` (label 1 = same question),
either GPTCache's QQP archive (``similiar_qqp_full.tar.gz``, a tar holding
``examples/benchmark/similiar_qqp_full.json``) or a plain ``.json`` list (the shipped sample).

The mix, drawn per request with a seeded RNG (deterministic for a given seed and pair file):

- ``repeat`` (default 30%): an earlier prompt text again, chosen uniformly among the distinct
  texts issued so far -> an exact cache hit once the first answer is stored;
- ``paraphrase`` (15%): the ``text_b`` of a duplicate pair (label 1) whose ``text_a`` was
  issued earlier -> a semantic hit for a semantic cache, a miss for an exact one;
- ``near_miss`` (5%): the ``text_b`` of a non-duplicate pair (label 0) whose ``text_a`` was
  issued earlier: similar words, different question -> a correct cache misses it;
- ``new`` (the rest, and whenever no candidate exists for the drawn kind): ``text_a`` of the
  next unused pair, in a seeded shuffle of all pairs.
"""

from __future__ import annotations

import json
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["new", "repeat", "paraphrase", "near_miss"]
KINDS: tuple[Kind, ...] = ("new", "repeat", "paraphrase", "near_miss")


class QuestionsFormatError(ValueError):
    """A question-pair file that cannot be read; names the file and the entry (0-based)."""


@dataclass(frozen=True)
class QuestionPair:
    text_a: str
    text_b: str
    duplicate: bool


@dataclass(frozen=True)
class Prompt:
    """One prompt text, why it was chosen, and ``source``: the question it derives from (its
    own text for new and repeated questions, the pair's ``text_a`` for paraphrases and near
    misses), so a replay can give derived questions the same request parameters."""

    text: str
    kind: Kind
    source: str


@dataclass(frozen=True)
class MixConfig:
    """Fractions (0..1, summing to at most 1) of repeats, paraphrases and near misses."""

    repeat: float = 0.30
    paraphrase: float = 0.15
    near_miss: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        parts = (self.repeat, self.paraphrase, self.near_miss)
        if min(parts) < 0 or sum(parts) > 1:
            raise ValueError("mix fractions must be >= 0 and sum to at most 1")


def load_pairs(path: Path | str) -> list[QuestionPair]:
    """Read question pairs from a GPTCache-style ``.tar.gz`` or a ``.json`` list.

    Raises QuestionsFormatError naming the file (and entry) on a bad file.
    """
    path = Path(path)
    try:
        if path.name.endswith((".tar.gz", ".tgz", ".tar")):
            with tarfile.open(path) as archive:
                member = next((m for m in archive.getmembers() if m.name.endswith(".json")), None)
                if member is None:
                    raise QuestionsFormatError(f"{path}: no .json file inside the archive")
                extracted = archive.extractfile(member)
                assert extracted is not None  # a regular member found above
                raw: Any = json.load(extracted)
        else:
            raw = json.loads(path.read_text())
    except (OSError, tarfile.TarError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise QuestionsFormatError(f"{path}: cannot read question pairs: {exc}") from None
    if not isinstance(raw, list):
        raise QuestionsFormatError(f"{path}: expected a JSON list of {{text_a, text_b, label}}")
    pairs = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise QuestionsFormatError(f"{path}: entry {i}: expected an object")
        a, b, label = entry.get("text_a"), entry.get("text_b"), entry.get("label")
        if not isinstance(a, str) or not isinstance(b, str):
            raise QuestionsFormatError(f"{path}: entry {i}: text_a and text_b must be strings")
        if label not in (0, 1):
            raise QuestionsFormatError(f"{path}: entry {i}: label must be 0 or 1, got {label!r}")
        a, b = a.strip(), b.strip()
        if a and b and a != b:  # identical texts would turn a paraphrase into an exact repeat
            pairs.append(QuestionPair(a, b, label == 1))
    if not pairs:
        raise QuestionsFormatError(f"{path}: no usable question pairs")
    return pairs


class QuestionMix:
    """Seeded generator of prompts; see the module docstring for the mix."""

    def __init__(self, pairs: list[QuestionPair], config: MixConfig = MixConfig()) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._fresh = list(pairs)
        self._rng.shuffle(self._fresh)
        self._next_fresh = 0
        self._issued: list[str] = []
        self._seen: set[str] = set()
        self._source: dict[str, str] = {}
        # (text_b, text_a) of pairs whose text_a was issued
        self._paraphrases: list[tuple[str, str]] = []
        self._near_misses: list[tuple[str, str]] = []

    def _issue(self, text: str, kind: Kind, source: str) -> Prompt:
        if text not in self._seen:
            self._seen.add(text)
            self._issued.append(text)
            self._source[text] = source
        return Prompt(text, kind, source)

    def _repeat(self) -> Prompt:
        text = self._issued[self._rng.randrange(len(self._issued))]
        return Prompt(text, "repeat", self._source[text])

    def _pop(self, pool: list[tuple[str, str]]) -> tuple[str, str] | None:
        while pool:
            text, source = pool.pop(self._rng.randrange(len(pool)))
            if text not in self._seen:
                return text, source
        return None

    def _new(self) -> Prompt | None:
        while self._next_fresh < len(self._fresh):
            pair = self._fresh[self._next_fresh]
            self._next_fresh += 1
            if pair.text_a in self._seen:
                continue
            (self._paraphrases if pair.duplicate else self._near_misses).append((pair.text_b, pair.text_a))
            return self._issue(pair.text_a, "new", pair.text_a)
        return None

    def next(self) -> Prompt:
        """The next prompt."""
        c = self.config
        u = self._rng.random()
        if u < c.repeat and self._issued:
            return self._repeat()
        if c.repeat <= u < c.repeat + c.paraphrase and (found := self._pop(self._paraphrases)):
            return self._issue(found[0], "paraphrase", found[1])
        if c.repeat + c.paraphrase <= u < c.repeat + c.paraphrase + c.near_miss and (
            found := self._pop(self._near_misses)
        ):
            return self._issue(found[0], "near_miss", found[1])
        prompt = self._new()
        return prompt if prompt is not None else self._repeat()  # every pair used: only repeats left

    @property
    def fresh_left(self) -> int:
        """Pairs not yet used for a new question; at 0 every further prompt is a repeat (all
        cache hits once answered), so a report must say so."""
        return len(self._fresh) - self._next_fresh

    def take(self, n: int) -> list[Prompt]:
        return [self.next() for _ in range(n)]
