"""The closed loop end to end on the REAL control plane (../shared/tools/kube, CONTROL_PLANE=1):
a daily step in demand, replayed on the simulated clock through the router, with the forecaster
daemon or the HPA controller scaling the real Deployment and the stand-in node warming Pods.

Skipped (with the reason) when the tools or their built binaries are missing; run
``COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler" ../shared/tools/kube/build.sh``
first. About 2 x 3 minutes of wall time on an idle machine (9 minutes with four other jobs).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from sim.loop import LoopConfig, run_loop
from sim.loop.config import _default_kube_tools

pytestmark = [pytest.mark.kube, pytest.mark.slow]

KUBE_BIN = Path(os.environ.get("KUBE_HOME", "/var/cache/promptedge-kube")) / "bin"
STEP_MINUTE = 15  # the step comes 15 simulated minutes into the segment
LOW, HIGH = 0.1, 0.6  # requests/s before and after the step
CAPACITY = 0.2  # requests/s per replica the autoscalers plan with: 1 replica before, 4 after


def _needs_control_plane() -> None:
    tools = _default_kube_tools()
    if not (tools / "start.sh").is_file():
        pytest.skip(f"no Kubernetes tools at {tools} (set PROMPTEDGE_KUBE_TOOLS)")
    missing = [
        b
        for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        if not (KUBE_BIN / b).exists()
    ]
    if missing:
        pytest.skip(
            f"not built in {KUBE_BIN}: {', '.join(missing)} "
            f'(COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler" {tools}/build.sh)'
        )


def _daily_step_trace(path: Path, days: int = 8) -> float:
    """10-minute counts: LOW all day except HIGH from 12:00 to 13:00 UTC, every day. Returns
    the segment start hour (day ``days - 1``, STEP_MINUTE minutes before the step)."""
    start = datetime(2026, 1, 1)
    lines = ["timestamp,value"]
    for i in range(days * 144):
        t = start + timedelta(minutes=10 * i)
        rate = HIGH if 12 <= t.hour < 13 else LOW
        lines.append(f"{t:%Y-%m-%d %H:%M:%S},{rate * 600:g}")
    path.write_text("\n".join(lines) + "\n")
    return (days - 1) * 24 + 12 - STEP_MINUTE / 60


def _first_ready_at(report: dict, policy: str, replicas: int) -> float | None:  # type: ignore[type-arg]
    for row in report["policies"][policy]["minutes"]:
        if row["ready"] is not None and row["ready"] >= replicas:
            return float(row["minute"])  # ready at the end of this minute
    return None


# Gates CI. It did not on 2 December: 2 of 4 runs failed, once Ready late (with the sampled
# history, since switched off) and once with 56 requests answered 503 in one policy. Those were
# a scale-down's draining replicas: each refused new requests while discovery still listed it,
# and least-load dispatch sent it more (fixed in the router: a refusing replica is backed off
# and a request tries up to 8 of them; tests/router/test_draining_replicas.py). It failed stop
# 23's CI with the third replica Ready in minute 15, seconds after the step, as it then did on
# every run here: the 5-minute rate reached the step's level two minutes in, so the step's
# replicas were ordered a decision late (fixed in forecaster.plan: ``smoothing_s``), and the
# segment started at a random second against the counters' minutes (sim.loop.run.segment_start).
# After both it passed both runs here, and a predictive-only run of the same set-up had the
# third replica Ready in minute 13, two minutes before the step.
def test_predictive_is_ready_before_the_step_reactive_after_and_nothing_fails(tmp_path: Path) -> None:
    _needs_control_plane()
    trace = tmp_path / "step.csv"
    start_hour = _daily_step_trace(trace)
    cfg = LoopConfig(
        trace=trace,
        start_hour=start_hour,
        hours=2 * STEP_MINUTE / 60,
        speedup=15.0,
        warmup_s=120.0,
        policies=("predictive", "reactive"),
        capacity_rps=CAPACITY,
        peak_replicas=4,
        max_replicas=6,
        history_days=7.0,
        max_generated=32,
        log_dir=tmp_path / "logs",
        progress=False,
    )
    report = run_loop(cfg)
    needed = 3  # the forwarded (miss) demand after the step needs 3-4 replicas; before it, 1
    predictive = _first_ready_at(report, "predictive", needed)
    reactive = _first_ready_at(report, "reactive", needed)
    assert predictive is not None and predictive < STEP_MINUTE, report["policies"]["predictive"]["minutes"]
    assert reactive is not None and reactive > STEP_MINUTE, report["policies"]["reactive"]["minutes"]
    for policy in ("predictive", "reactive"):
        assert report["policies"][policy]["failed_requests"] == 0, report["policies"][policy]["errors"]
        assert report["policies"][policy]["scale_events"] >= 1


def test_an_actor_that_dies_marks_its_run_invalid_instead_of_a_normal_looking_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Attack round: a forecaster daemon killed mid-run left a normal row (85.8 % SLO) and exit 0.
    # Here the real daemon exits at start-up (a setting it refuses, exit 2), a real process death.
    _needs_control_plane()
    monkeypatch.setenv("PROMPTEDGE_FORECASTER_RATE_WINDOW_S", "inf")
    trace = tmp_path / "step.csv"
    start_hour = _daily_step_trace(trace)
    cfg = LoopConfig(
        trace=trace,
        start_hour=start_hour,
        hours=3 / 60,
        speedup=15.0,
        warmup_s=120.0,
        policies=("predictive",),
        capacity_rps=CAPACITY,
        peak_replicas=2,
        max_replicas=3,
        history_days=1.0,
        max_generated=16,
        log_dir=tmp_path / "logs",
        progress=False,
    )
    report = run_loop(cfg)
    invalid = report["policies"]["predictive"]["invalid"]
    assert invalid and "forecaster exited with code 2" in invalid[0], invalid
    from sim.loop import render

    assert "INVALID: predictive: forecaster exited with code 2" in render(report)


def test_an_api_server_killed_mid_replay_marks_the_run_invalid(tmp_path: Path) -> None:
    # Attack round: a kube-apiserver SIGKILLed during the replay gave a normal-looking row (92.9 %
    # SLO) and exit 0, its Deployment unseen for 13 of 15 minutes. Here the real one is killed.
    import signal
    import threading
    import time

    import psutil

    _needs_control_plane()
    trace = tmp_path / "step.csv"
    start_hour = _daily_step_trace(trace)
    log_dir = tmp_path / "logs"
    cfg = LoopConfig(
        trace=trace,
        start_hour=start_hour,
        hours=3 / 60,
        speedup=15.0,
        warmup_s=120.0,
        policies=("fixed_peak",),
        capacity_rps=CAPACITY,
        peak_replicas=2,
        max_replicas=3,
        history_days=1.0,
        max_generated=16,
        log_dir=log_dir,
        progress=False,
    )
    killed: list[int] = []
    done = threading.Event()

    def kill_api_server_once_the_router_serves() -> None:
        while not done.is_set() and not killed:
            if (log_dir / "fixed_peak" / "router.log").exists() and "router.access" in (
                log_dir / "fixed_peak" / "router.log"
            ).read_text(errors="replace"):
                for proc in psutil.process_iter(["cmdline"]):
                    cmd = " ".join(proc.info["cmdline"] or [])
                    if "kube-apiserver" in cmd and str(log_dir) in cmd:
                        proc.send_signal(signal.SIGKILL)
                        killed.append(proc.pid)
            time.sleep(0.1)

    killer = threading.Thread(target=kill_api_server_once_the_router_serves, daemon=True)
    killer.start()
    try:
        report = run_loop(cfg)
    finally:
        done.set()
        killer.join(timeout=5)
    assert killed, "the API server was never found to kill"
    invalid = report["policies"]["fixed_peak"]["invalid"]
    assert any("the API server failed" in reason for reason in invalid), (invalid, report["policies"]["fixed_peak"])
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(log_dir) in " ".join(p.info["cmdline"] or [])]


def test_an_interrupt_while_the_control_plane_starts_leaves_none_of_it_running(tmp_path: Path) -> None:
    # Attack round: SIGINT to `sim loop` while start.sh ran left etcd and kube-apiserver running
    # (adopted by init) after "interrupted: every loop process stopped". A SIGINT to the one
    # process, as `kill -INT` sends it (its own session: the servers do not get it too).
    import signal
    import subprocess
    import sys
    import time

    import psutil

    _needs_control_plane()
    run_dir = tmp_path / "kube"
    script = (
        "import time\nfrom pathlib import Path\nfrom sim.loop.config import _default_kube_tools\n"
        "from sim.loop.world import ControlPlane\n"
        f"with ControlPlane(_default_kube_tools(), Path({str(run_dir)!r})):\n    time.sleep(600)\n"
    )

    def ours() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if str(run_dir) in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        return found

    loop = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not any("kube-apiserver" in " ".join(p.info["cmdline"] or []) for p in ours()):
            assert loop.poll() is None and time.monotonic() < deadline, "no kube-apiserver started"
            time.sleep(0.05)
        loop.send_signal(signal.SIGINT)  # start.sh still waits for the API server's health
        loop.wait(timeout=90)
        deadline = time.monotonic() + 30
        while ours() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [" ".join(p.info["cmdline"] or [])[:120] for p in ours()]
        assert left == [], left
    finally:
        if loop.poll() is None:
            loop.kill()
        for proc in ours():
            proc.kill()
