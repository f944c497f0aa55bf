"""The demo end to end: embedded Redis, three sim replicas, the router and the forecaster as
processes, replaying the first minutes of the real Azure conv trace with QQP questions."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sim.demo import DemoConfig, run_demo
from sim.stack import pid_alive


@pytest.mark.slow
def test_demo_replays_the_azure_conv_trace_through_the_router(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMPTEDGE_REDIS_URL", raising=False)  # the default: embedded Redis
    monkeypatch.setenv("PROMPTEDGE_FORECASTER_TIME_BUDGET_S", "2")
    monkeypatch.delenv("PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA", raising=False)
    # On the shared, overloaded test machine a Redis round trip can outlast the demo's 0.5 s
    # bound; the cache then serves and counts nothing for a second, and the counts below drift.
    monkeypatch.setenv("PROMPTEDGE_CACHE_REDIS_TIMEOUT_S", "3")
    cfg = DemoConfig(
        trace=data_dir / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
        questions=data_dir / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz",
        speedup=60,
        duration_s=6,
        max_token_rate=4500,
        log_dir=tmp_path,
        progress=False,
        profiles=("a100", "a100", "a100"),  # a T4 takes ~30 s for the trace's 1,000-token answers
    )
    # Processes of other tests' session fixtures (a Redis Cluster, say) are not the demo's.
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    report = run_demo(cfg)

    assert report["requests"] > 40
    assert report["ok"] == report["requests"], report["errors"]
    stats = report["router_cache_stats"]
    assert stats["requests"] == report["requests"]
    assert stats["exact_hits"] == report["exact_hits"]
    assert stats["misses"] == report["requests"] - report["exact_hits"] - report["semantic_hits"]
    # Repeated prompts hit once the first answer is stored; new questions never do. Most repeats
    # here are sent while their first answer is still generating (answers take seconds), so the
    # count of hits follows the machine's speed; every repeat sent after an answer must hit.
    after = report["repeats_after_answer"]
    assert after["exact_hits"] == after["requests"]
    assert report["by_kind"]["repeat"]["exact_hits"] > 0
    assert report["by_kind"]["new"]["exact_hits"] == 0
    forwarded = report["requests"] - report["exact_hits"] - report["semantic_hits"]
    assert set(report["replica_share"]) <= {r["url"] for r in report["replicas"]}
    assert len(report["replica_share"]) == 3 and forwarded > 0
    assert sum(report["replica_share"].values()) == pytest.approx(1.0, abs=0.01)
    assert report["ttft_ms"]["p50"] <= report["latency_ms"]["p50"]
    plan = report["forecast_plan"]
    assert plan, report.get("forecast_error")
    assert all(set(step) == {"minute", "forecast", "upper", "replicas"} for step in plan)
    assert all(step["replicas"] >= 1 for step in plan)
    # the report can be checked: the capacity the forecaster used (the demo's 15 requests per wall
    # second at 60x), every request in its simulated minute, the history it read, the picture
    assert report["forecast_planner"]["capacity_per_replica"] == pytest.approx(15 / 60)
    assert sum(row["sent"] for row in report["demand_minutes"]) == report["requests"]
    series = report["forecast_series"]
    assert series["demand_unit"] == "cache misses/s"
    # the 14-day window reaches back before the demo's router: those minutes are counted apart
    assert series["buckets"] > series["missing_buckets"] >= series["missing_before_first"] > 0
    assert Path(report["plot"]).stat().st_size > 10_000
    # Every process the demo started is gone (the embedded Redis: see test_sim_demo.py).
    assert not [c for c in psutil.Process().children(recursive=True) if c.pid not in before and pid_alive(c.pid)]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_demo_leaves_no_process_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int) -> None:
    monkeypatch.delenv("PROMPTEDGE_REDIS_URL", raising=False)
    demo = subprocess.Popen(
        [sys.executable, "-m", "sim", "demo", "--duration", "30", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    started: list[psutil.Process] = []
    deadline = time.monotonic() + 60
    while len(started) < 4 and time.monotonic() < deadline:  # three replicas and the router
        started = [c for c in psutil.Process(demo.pid).children() if "serve" in c.cmdline()]
        time.sleep(0.2)
    assert len(started) == 4, demo.stdout.read().decode() if demo.poll() is not None else "no children"
    router = next(c for c in started if "router" in c.cmdline())
    socket_path = router.environ()["PROMPTEDGE_REDIS_URL"].removeprefix("unix://").split("?")[0]
    redis_server = [p for p in psutil.process_iter(["cmdline"]) if socket_path in " ".join(p.info["cmdline"] or [])]
    assert len(redis_server) == 1
    time.sleep(1.0)
    demo.send_signal(sig)
    output = demo.communicate(timeout=30)[0].decode()
    assert demo.returncode == 130, output
    assert "interrupted: all demo processes stopped" in output
    assert "Traceback" not in output
    assert not [p.pid for p in started + redis_server if pid_alive(p.pid)]
