"""The fixed train / calibration / test split of labelled pairs (the learned verifier's).

A pair's split is decided by a keyed hash of its id, so it never depends on the file's order,
on sampling or on how many pairs are read: ``bucket = blake2b(id, key=seed) mod 100``; buckets
0-59 train, 60-79 calibration, 80-99 test (60/20/20). The id of a pair is its two texts joined
by a unit separator, so a pair listed twice falls in one split. Pure.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Split = Literal["train", "calibration", "test"]
SPLITS: tuple[Split, ...] = ("train", "calibration", "test")
SEED = 14  # the issue that introduced it; changing it re-draws every split
TRAIN_BELOW, CALIBRATION_BELOW = 60, 80


def pair_id(text_a: str, text_b: str) -> str:
    """The id of a labelled pair: its texts joined by U+001F (which neither text contains in QQP)."""
    return f"{text_a}\x1f{text_b}"


def bucket(text_a: str, text_b: str, seed: int = SEED) -> int:
    """0..99, uniform over pairs: keyed BLAKE2b of the pair id."""
    digest = hashlib.blake2b(pair_id(text_a, text_b).encode("utf-8"), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "big") % 100


def split_of(text_a: str, text_b: str, seed: int = SEED) -> Split:
    """The split of one pair: "train" (60 %), "calibration" (20 %) or "test" (20 %)."""
    b = bucket(text_a, text_b, seed)
    return "train" if b < TRAIN_BELOW else "calibration" if b < CALIBRATION_BELOW else "test"
