"""The multi-turn context set (cache/training/multiturn.py) and `python -m cache eval --multi-turn`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cache.cli import app
from cache.training.multiturn import KINDS, build_cases, score_cases

# QQP-shaped labelled pairs: near-duplicates labelled different, paraphrases labelled the same
A = [
    "How do I learn Python?",
    "What is the best way to lose weight?",
    "How can I improve my English?",
    "Which laptop is best for programming?",
    "How do I start a small business?",
    "What is machine learning?",
]
B = [
    "How do I learn Java?",
    "What is the fastest way to lose weight?",
    "How do I get better at English?",
    "What laptop is best for coding?",
    "How do I start a company?",
    "What is deep learning?",
]
LABELS = [0, 0, 1, 1, 1, 0]


def word_encode(texts: list[str]) -> np.ndarray:
    """Unit bag-of-words vectors: equal texts have cosine 1, texts sharing words are close."""
    out = []
    for text in texts:
        v = np.zeros(256)
        for word in text.lower().replace("?", " ").split():
            v[int(hashlib.blake2b(word.encode(), digest_size=2).hexdigest(), 16) % 256] += 1.0
        out.append(v / np.linalg.norm(v))
    return np.stack(out)


def row(rows: list[dict], system: str, kind: str) -> dict:
    return next(r for r in rows if r["system"].startswith(system) and r["kind"] == kind)


def test_cases_follow_the_labels_of_the_pairs_they_come_from() -> None:
    cases = build_cases(A, B, LABELS, per_kind=10, seed=3)
    assert cases == build_cases(A, B, LABELS, per_kind=10, seed=3)
    by_kind = {k: [c for c in cases if c.kind == k] for k in KINDS}
    assert [len(by_kind[k]) for k in KINDS] == [3, 3, 3, 6]  # as many as the pairs allow
    for c in by_kind["other_context"]:  # the same follow-up after different questions: a wrong hit if served
        assert c.label == 0 and c.stored[-1] == c.query[-1] and c.stored[0] != c.query[0]
        assert c.stored[1] != c.query[1]
    for c in by_kind["other_question_same_answer"]:  # ... even after the same answer
        assert c.label == 0 and c.stored[1:] == c.query[1:] and c.stored[0] != c.query[0]
    for c in by_kind["paraphrased_context"]:  # same answer, same follow-up, the question reworded
        assert c.label == 1 and c.stored[1:] == c.query[1:] and c.stored[0] != c.query[0]
    for c in by_kind["same_context"]:
        assert c.stored[:2] == c.query[:2] and c.label == LABELS[A.index(c.stored[-1]["content"])]
    with pytest.raises(ValueError, match="labelled 0 and pairs labelled 1"):
        build_cases(A[:2], B[:2], [0, 0], per_kind=5)


def test_pairs_that_would_make_identical_conversations_labelled_different_are_left_out() -> None:
    # QQP has label-0 pairs equal but for a trailing space; as a case they would score a
    # correct refusal to serve an identical conversation as a wrong hit
    cases = build_cases([*A, "Is it safe?", ""], [*B, "Is it safe? ", "x"], [*LABELS, 0, 0], per_kind=50)
    assert all(c.stored != c.query for c in cases if c.label == 0)
    assert not any("Is it safe?" in str(c.stored) or c.stored[0]["content"] == "" for c in cases)


def test_only_a_cache_that_keys_the_context_refuses_the_same_follow_up_after_another_question() -> None:
    cases = build_cases(A, B, LABELS, per_kind=10, seed=0)
    rows = score_cases(cases, word_encode, threshold=0.96)
    # keyed by the last message, every other-context case is a wrong hit, at any threshold
    for system in ("gptcache default", "last message only"):
        assert row(rows, system, "other_context")["wrong"] == 3
    # PromptEdge's real scope (cache.scope.semantic_query) holds the context: none served
    for system in ("promptedge: scope", "promptedge: + rules"):
        assert row(rows, system, "other_context")["wrong"] == 0
        assert row(rows, system, "other_question_same_answer")["wrong"] == 0
        # the price: a reworded first turn is another scope, so its follow-up misses
        assert row(rows, system, "paraphrased_context")["correct"] == 0
    last_only = row(rows, "last message only", "paraphrased_context")
    assert last_only["correct"] == 3 and last_only["recall"] == 1.0
    total = row(rows, "promptedge: + rules", "all")
    assert total["cases"] == len(cases) and total["correct"] + total["wrong"] + total["miss"] == len(cases)
    # after a shared context the last turn is judged as a single turn: identical pairs would hit
    same = row(rows, "promptedge: scope", "same_context")
    assert same["wrong"] == 0  # no labelled-different pair here is as close as cosine 0.96


@pytest.mark.slow
def test_cli_reports_the_multi_turn_set(tmp_path: Path, encoder: object) -> None:
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps([{"text_a": a, "text_b": b, "label": y} for a, b, y in zip(A, B, LABELS)]))
    out = tmp_path / "report.json"
    result = CliRunner().invoke(
        app, ["eval", "--pairs", str(path), "--multi-turn", "10", "--json", str(out), "--threshold", "0.9"]
    )
    assert result.exit_code == 0, result.output
    assert "multi-turn context set" in result.output and "cosine >= 0.9]" in result.output
    report = json.loads(out.read_text())
    assert report["multi_turn"]["per_kind"] == 10 and report["multi_turn"]["threshold"] == 0.9
    assert report["multi_turn"]["cases_per_kind"] == {
        "other_context": 3,
        "other_question_same_answer": 3,
        "paraphrased_context": 3,
        "same_context": 6,
    }
    other = [r for r in report["multi_turn"]["rows"] if r["kind"] == "other_context"]
    assert {r["system"] for r in other} >= {"gptcache default (last message)", "promptedge: + learned verifier"}
    assert all(r["wrong"] == 0 for r in other if r["system"].startswith("promptedge"))
    positives = tmp_path / "mock.json"
    positives.write_text(json.dumps([{"origin": "a", "similar": "b"}]))
    bad = CliRunner().invoke(app, ["eval", "--pairs", str(positives), "--multi-turn", "5"])
    assert bad.exit_code == 2 and "labelled pairs" in bad.output
    one_split = tmp_path / "train_only.json"  # pairs 0, 2 and 3 are in the train split (cache/training/splits.py)
    one_split.write_text(json.dumps([{"text_a": A[i], "text_b": B[i], "label": LABELS[i]} for i in (0, 2, 3)]))
    empty = CliRunner().invoke(app, ["eval", "--pairs", str(one_split), "--split", "test", "--multi-turn", "5"])
    assert empty.exit_code == 2 and "split 'test' of this file is empty" in empty.output, empty.output


def test_the_what_if_row_compares_only_the_earlier_user_turns_by_meaning() -> None:
    cases = build_cases(A, B, LABELS, per_kind=10, seed=0)
    rows = score_cases(cases, word_encode, threshold=0.5)
    what_if = "what-if: earlier user turns by meaning"
    # other-context cases differ in their assistant turns too: never one context
    assert row(rows, what_if, "other_context")["wrong"] == 0
    # after the same answer, questions sharing words pass this loose cut: the what-if's risk
    assert row(rows, what_if, "other_question_same_answer")["wrong"] > 0
    # a reworded first question close enough (word vectors, cosine >= 0.5) makes one context
    paraphrased = row(rows, what_if, "paraphrased_context")
    assert 0 < paraphrased["correct"] <= 3 and row(rows, "promptedge: + rules", "paraphrased_context")["correct"] == 0
    # with the context identical it is the default decision
    same, default = row(rows, what_if, "same_context"), row(rows, "promptedge: + rules", "same_context")
    assert same["correct"] > 0 and (same["correct"], same["wrong"]) == (default["correct"], default["wrong"])
