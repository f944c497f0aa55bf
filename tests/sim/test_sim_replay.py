"""Replay over real HTTP against in-process sim replicas, and the report it produces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.client.questions import MixConfig, QuestionMix, load_pairs
from sim.client.replay import Outcome, ReplayConfig, plan_requests, run_plan
from sim.client.report import STORE_SLACK_S, render, summarize
from sim.client.sample import QUESTIONS_FILE, TRACE_FILE
from sim.client.traces import read_trace
from sim.client.workload import thinning_fraction


def test_plan_keeps_trace_timing_and_token_counts(data_dir: Path) -> None:
    trace = read_trace(data_dir / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv")
    cfg = ReplayConfig(target="http://x", speedup=60, duration_s=5)
    plan = plan_requests(trace, QuestionMix(load_pairs(QUESTIONS_FILE)), cfg)
    expected = [r for r in trace if r.offset_s / 60 < 5]
    assert len(plan) == len(expected) > 1000
    assert [p.at_s for p in plan] == [r.offset_s / 60 for r in expected]
    new = [(p, r) for p, r in zip(plan, expected) if p.kind == "new"]
    assert len(new) > 500 and all(p.max_tokens == r.generated_tokens for p, r in new)
    assert all(p.body["stream"] and len(p.body["messages"]) == 1 for p in plan)


def test_repeats_are_identical_requests_and_paraphrases_keep_their_source_parameters() -> None:
    pairs = load_pairs(QUESTIONS_FILE)
    source_of = {p.text_b: p.text_a for p in pairs}
    plan = plan_requests(read_trace(TRACE_FILE), QuestionMix(pairs), ReplayConfig(target="http://x"))
    first: dict[str, dict] = {}
    for p in plan:
        text = p.body["messages"][-1]["content"]
        if p.kind == "repeat":
            assert p.body == first[text]
        if p.kind in ("paraphrase", "near_miss"):
            assert p.max_tokens == first[source_of[text]]["max_tokens"]
        first.setdefault(text, p.body)
    assert sum(p.kind == "repeat" for p in plan) > 300


def test_padding_reaches_context_size_and_keeps_repeats_identical() -> None:
    trace = read_trace(TRACE_FILE)[:400]
    cfg = ReplayConfig(target="http://x", pad_context=True, max_context_tokens=1000)
    plan = plan_requests(trace, QuestionMix(load_pairs(QUESTIONS_FILE), MixConfig(seed=1)), cfg)
    first: dict[str, list] = {}
    for p, row in zip(plan, trace):
        question = p.body["messages"][-1]["content"]
        chars = sum(len(m["content"]) for m in p.body["messages"])
        first.setdefault(question, p.body["messages"])
        assert p.body["messages"] == first[question]
        if p.kind == "new":
            assert abs(chars / 4 - min(row.context_tokens, 1000)) <= 1 or len(question) / 4 > row.context_tokens
    assert any(p.kind == "repeat" for p in plan)


async def test_replay_against_a_replica_reports_every_request(serve_replica, fast_profile) -> None:
    url = await serve_replica(replace(fast_profile, max_num_seqs=64))
    cfg = ReplayConfig(target=url, speedup=600, duration_s=0.5, progress=False)
    plan = plan_requests(read_trace(TRACE_FILE), QuestionMix(load_pairs(QUESTIONS_FILE)), cfg)
    for p in plan:  # keep the test short: the test replica decodes 200 tokens/s per sequence
        p.body["max_tokens"] = min(p.max_tokens, 8)
    outcomes, wall = await run_plan(plan, cfg)
    report = summarize(outcomes, wall)
    assert report["requests"] == len(plan) > 20
    assert report["ok"] == report["requests"] and report["failed"] == 0
    assert report["exact_hits"] == 0  # a bare replica has no cache
    assert report["replica_share"] == {}  # and no X-PromptEdge-Replica header
    for key in ("latency_ms", "ttft_ms"):
        p = report[key]
        assert 0 < p["p50"] <= p["p95"] <= p["p99"]
    assert report["ttft_ms"]["p50"] <= report["latency_ms"]["p50"]
    assert "TTFT ms p50/p95/p99" in render(report)


async def test_failures_are_counted_by_reason(serve_replica) -> None:
    url = await serve_replica(fail_rate=1.0)
    cfg = ReplayConfig(target=url, speedup=600, duration_s=0.3, progress=False)
    plan = plan_requests(read_trace(TRACE_FILE), QuestionMix(load_pairs(QUESTIONS_FILE)), cfg)
    outcomes, wall = await run_plan(plan, cfg)
    report = summarize(outcomes, wall)
    assert report["failed"] == report["requests"] > 0
    assert report["errors"] == {"HTTP 500": report["requests"]}
    assert report["latency_ms"]["p50"] is None


def test_thinning_keeps_the_mean_token_rate_under_the_limit(data_dir: Path) -> None:
    trace = read_trace(data_dir / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv")
    fraction = thinning_fraction(trace, speedup=60, duration_s=60, max_token_rate=4500)
    tokens = sum(r.generated_tokens for r in trace)
    assert tokens * fraction / (trace[-1].offset_s / 60) == pytest.approx(4500, rel=1e-6)
    assert thinning_fraction(trace, 60, 10, max_token_rate=0) == 1.0
    assert thinning_fraction(read_trace(TRACE_FILE), 60, 60, max_token_rate=4500) == 1.0  # the sample is lighter
    cfg = ReplayConfig(target="http://x", speedup=60, duration_s=60, sample_fraction=fraction)
    plan = plan_requests(trace, QuestionMix(load_pairs(QUESTIONS_FILE)), cfg)
    assert len(plan) == pytest.approx(fraction * len(trace), rel=0.1)


def test_repeats_after_an_answer_are_the_ones_a_cache_must_hit() -> None:
    def outcome(kind: str, prompt: str, sent: float, cache: str | None, ok: bool = True) -> Outcome:
        return Outcome(kind, ok, None if ok else "HTTP 500", 1.0, 0.1, cache, None, 0.0, sent, prompt)

    outcomes = [
        outcome("new", "a", sent=0.0, cache="miss"),  # answered at 1.0
        outcome("repeat", "a", sent=1.5, cache="miss"),  # before the store slack: may miss
        outcome("repeat", "a", sent=1.0 + STORE_SLACK_S, cache="exact"),
        outcome("repeat", "a", sent=5.0, cache="miss"),  # must have hit: counted, not a hit
        outcome("new", "b", sent=0.0, cache=None, ok=False),  # never answered
        outcome("repeat", "b", sent=9.0, cache="miss"),
        # Regression (make demo: 17 of 658 "missed"): an answer served by the semantic stage is
        # not stored under its own body, so its repeat need not be an exact hit.
        outcome("new", "c", sent=0.0, cache="semantic"),
        outcome("repeat", "c", sent=5.0, cache="semantic"),
    ]
    after = summarize(outcomes, 10.0)["repeats_after_answer"]
    assert after == {"requests": 2, "exact_hits": 1}
    lines = render(summarize(outcomes, 10.0)).splitlines()
    assert "repeats after an answer 2 (exact hits 1)".split() in [line.split() for line in lines]
