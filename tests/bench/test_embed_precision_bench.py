"""bench/embed_precision.py: the default stage it runs is the cache's, and the decisions that
differ between precisions are counted by what changed for the user."""

from __future__ import annotations

import numpy as np

from cache.settings import CacheSettings
from tests.bench_script import load_bench

ep = load_bench("embed_precision")


def test_differences_are_split_by_whether_the_changed_answer_was_right() -> None:
    right = [lambda s, o=o: s == o for o in ("a", "b", "c", "d", "e", "f")]
    served = {
        "fp32": ["a", None, "c", "x", None, "f"],  # f: both serve it, no difference
        "int8": [None, "b", "y", None, "q", "f"],  # lost right, gained right, other entry, lost wrong, gained wrong
    }
    cos = {"fp32": np.array([0.97, 0.95, 0.99, 0.96, 0.5, 1.0]), "int8": np.array([0.95, 0.96, 0.98, 0.95, 0.5, 1.0])}
    vec = {t: np.eye(3)[0] for t in ("a", "b")}
    row = ep.compare("set", served, right, cos, ["a", "b"], {"fp32": vec, "int8": vec})
    assert row["changed"] == {"gained_right": 1, "gained_wrong": 1, "lost_right": 1, "lost_wrong": 1, "other_entry": 1}
    assert row["differ"] == 5 and row["agreement"] == round(1 - 5 / 6, 4)
    assert row["fp32"] == {"hits": 4, "right": 3, "wrong": 1, "precision": 0.75, "hit_rate": round(4 / 6, 4)}
    assert row["int8"]["hits"] == 4 and row["int8"]["right"] == 2
    assert row["pair_cosine_shift"]["max"] == 0.02 and row["pair_cosine_shift"]["mean_signed"] < 0


def test_the_default_stage_is_the_caches_learned_verifier_with_the_rules_vetoes() -> None:
    decide = ep.default_stage(CacheSettings())
    same = "How do I reset my password?"
    assert decide(same, [(same, 0.999)]) == 0  # a near-identical text is served
    assert decide(same, [("How do I not reset my password?", 0.999)]) is None  # a rule vetoes it
    assert decide(same, [("What is the capital of France?", 0.5)]) is None  # below the learned prefilter
    assert decide(same, []) is None


def test_the_rules_stage_is_the_caches_rules() -> None:
    decide = ep.default_stage(CacheSettings(verifier="rules"))
    same = "How do I reset my password?"
    assert decide(same, [(same, 0.999)]) == 0
    assert decide(same, [(same, 0.95)]) is None  # below the rules' 0.96
