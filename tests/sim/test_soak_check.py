"""bench/soak.py's wrong-answer check against real sim answers: it accepts a request's own
answer and rejects the answer of any other request (another prompt or another max_tokens)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.bench_script import load_bench

soak = load_bench("soak")


async def test_check_accepts_own_answer_and_rejects_anothers(serve_replica) -> None:
    url = await serve_replica(model=soak.MODEL)
    prompts = soak.Prompts(seed=0)
    asked = [prompts.next() for _ in range(6)]
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        answers = []
        for prompt, max_tokens in asked:
            body = {"model": soak.MODEL, "prompt": prompt, "max_tokens": max_tokens, "echo": True}
            answers.append((await client.post("/v1/completions", json=body)).json())
    for i, (prompt, max_tokens) in enumerate(asked):
        assert soak.check(answers[i], prompt, max_tokens)
        for j, other in enumerate(answers):
            if asked[j] != asked[i]:
                assert not soak.check(other, prompt, max_tokens)
    assert not soak.check({"error": {"message": "x"}}, *asked[0])


def test_every_phase_has_a_before_and_after() -> None:
    schedule = soak.Schedule.of(180.0)
    phases = [schedule.phase_at(t) for t in range(180)]
    assert phases[0] == "warmup" and phases[-1] == "after_router_worker"
    assert sorted(set(phases), key=phases.index) == schedule.phases()


@pytest.mark.parametrize("minutes", [1.5, 3, 30])
def test_every_fault_is_scheduled_whatever_the_length(minutes: float) -> None:
    schedule = soak.Schedule.of(minutes * 60)
    actions = {action for _, action, _ in schedule.events if action}
    assert actions == {
        "kill_redis",
        "start_redis",
        "kill_replica",
        "start_replica",
        "hang_replica",
        "release_replica",
        "stop_engine",
        "resume_engine",
        "kill_forecaster",
        "start_forecaster",
        "kill_router_worker",
    }
    kinds = [kind for _, kind in schedule.oversized()]
    assert kinds.count("body_200mb_streamed") == 1 and "header_16mb" in kinds and "body_20mb" in kinds
    assert all(schedule.events[0][0] <= at < schedule.duration_s for at, _ in schedule.oversized())


def test_a_refusal_must_name_its_limit() -> None:
    error = {
        "error": {
            "message": f"request body over {soak.MAX_BODY_BYTES} bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "body_too_large",
        }
    }
    assert soak.check_refusal("body_20mb", 413, json.dumps(error).encode())
    assert not soak.check_refusal("body_20mb", 400, json.dumps(error).encode())
    assert not soak.check_refusal("header_16mb", 413, json.dumps(error).encode())  # a 431 was due
    unnamed = {"error": {**error["error"], "message": "request body too large"}}
    assert not soak.check_refusal("body_20mb", 413, json.dumps(unnamed).encode())
    assert not soak.check_refusal("body_20mb", 413, b"<html>413</html>")


def _decision(process: int, at: float, replicas: int) -> object:
    return soak.ForecastDecision(process, at, at, replicas, "keep")


def test_a_restarted_forecaster_below_its_predecessor_within_the_window_is_a_violation() -> None:
    before = [_decision(0, t, 8) for t in (0, 60, 120)]
    after = [_decision(1, 200, 8), _decision(1, 260, 1), _decision(1, 600, 5)]
    # 260 s is within 300 s of the restarted process's first decision; 600 s is past the window
    assert [d.at for d in soak.restart_violations(before, after, 300)] == [260]
    assert soak.restart_violations(before, [], 300) == [] and soak.restart_violations([], after, 300) == []


def test_decisions_are_read_from_the_forecasters_json_log(tmp_path) -> None:
    log = tmp_path / "forecaster-0.log"
    lines = [
        {
            "timestamp": "2026-01-01T00:00:00.000+00:00",
            "level": "INFO",
            "logger": "forecaster",
            "message": "decision 8 (keep, exit 0) at 1767225660.5 (2026-01-01T00:01:00Z) on last_value: keep 8",
        },
        {
            "timestamp": "2026-01-01T00:00:01.000+00:00",
            "level": "WARNING",
            "logger": "forecaster",
            "message": "hold: source unavailable",
        },
    ]
    log.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    [decision] = soak.read_decisions(log, 3)
    assert (decision.process, decision.replicas, decision.action, decision.at) == (3, 8, "keep", 1767225660.5)
