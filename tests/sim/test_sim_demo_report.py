"""The demo's report tells the truth: which replica is which profile, when the question pool
ran out, what the forecaster saw, decided and (did not) scale, and a plan without 30 equal rows."""

from __future__ import annotations

from sim.demo import question_pool
from sim.questions import MixConfig, QuestionMix, QuestionPair
from sim.replay import PlannedRequest
from sim.report import render


def _report(**extra: object) -> dict:  # type: ignore[type-arg]
    base = {"requests": 100, "ok": 100, "failed": 0, "errors": {}, "exact_hits": 60, "semantic_hits": 10,
            "hit_ratio": 0.7, "latency_ms": {"p50": 1, "p95": 2, "p99": 3}, "ttft_ms": {"p50": 1, "p95": 2, "p99": 3},
            "lag_ms": {"p50": 0, "p95": 0, "p99": 0}, "wall_s": 60.0, "by_kind": {},
            "replica_share": {"http://127.0.0.1:1": 0.7, "http://127.0.0.1:2": 0.3},
            "replicas": [{"url": "http://127.0.0.1:1", "profile": "a100"}, {"url": "http://127.0.0.1:2", "profile": "t4"}]}
    return {**base, **extra}


def test_shares_name_each_replicas_gpu_profile() -> None:
    text = render(_report())
    assert "share http://127.0.0.1:1 (a100)" in text and "share http://127.0.0.1:2 (t4)" in text


def test_an_exhausted_question_pool_is_said_with_its_time() -> None:
    mix = QuestionMix([QuestionPair("a?", "b?", True), QuestionPair("c?", "d?", False)], MixConfig(seed=1))
    kinds = [mix.next().kind for _ in range(20)]
    assert mix.fresh_left == 0 and kinds.count("new") == 2
    plan = [PlannedRequest(float(i), k, 1, {}) for i, k in enumerate(kinds)]
    pool = question_pool(plan, 2, exhausted=True)
    assert pool["last_new_at_s"] == float(max(i for i, k in enumerate(kinds) if k == "new"))
    text = render(_report(questions=pool))
    assert "all 2 pairs used by" in text and "only repeat" in text
    assert "question pool" not in render(_report(questions={**pool, "exhausted": False}))


def test_forecast_says_what_it_saw_decided_and_scaled_and_folds_equal_minutes() -> None:
    plan = [{"minute": 29_000_000 + i, "forecast": 0.1, "upper": 0.12, "replicas": 1} for i in range(30)]
    plan.append({"minute": 29_000_030, "forecast": 0.5, "upper": 0.6, "replicas": 2})
    text = render(_report(forecast_plan=plan, forecast_model="last_value",
                          forecast_decision={"replicas": 1, "reason": "hold", "action": "dry-run"}))
    assert "saw: 30 of 100 requests reach a replica (30%)" in text
    assert "decided: 1 replicas (hold)" in text and "scaled: nothing (dry-run" in text
    assert "(30 minutes alike)" in text
    assert len([line for line in text.splitlines() if "0.100" in line and "0.120" in line]) == 1


def test_a_planned_scale_is_not_reported_as_done_in_the_dry_run_demo() -> None:
    # Found in a README trial: the report printed "scaled: set" (the planner's action) although
    # the demo's forecaster runs in dry-run and nothing was scaled.
    text = render(_report(forecast_plan=[], forecast_model="last_value",
                          forecast_decision={"replicas": 3, "reason": "scale up ahead of the forecast", "action": "set"}))
    assert "decided: 3 replicas" in text and "scaled: nothing (dry-run" in text and "scaled: set" not in text


def test_a_replay_that_fell_behind_the_trace_says_so_and_the_logs_are_named() -> None:
    # Fresh-clone trial: start lag p95 58 s under load 12 and the report said nothing; nor did
    # it say where the router's and replicas' logs were.
    late = render(_report(lag_ms={"p50": 900, "p95": 58_220, "p99": 59_748}, logs="out/demo-logs"))
    assert "up to 58 s (p95) after their trace time" in late and "out/demo-logs (router, replicas" in late
    assert "after their trace time" not in render(_report())
