"""One simulated clock: the forecaster's "now", schedule and lead time follow
PROMPTEDGE_FORECASTER_CLOCK_ORIGIN / _CLOCK_SCALE with the router's semantics."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from forecaster.actuate.warmup import Warmup
from forecaster.clock import SimClock
from forecaster.settings import ForecasterSettings

ROOT = Path(__file__).resolve().parents[2]


def test_clock_runs_scale_times_faster_from_its_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [1_000.0]
    monkeypatch.setattr(time, "time", lambda: wall[0])
    clock = SimClock(origin=400.0, scale=60.0)
    assert clock.now() == 400.0 + 600.0 * 60  # the wall clock was already 600 s past the origin
    wall[0] += 2.0
    assert clock.now() == 400.0 + 602.0 * 60
    assert clock.to_wall(60.0) == 1.0 and clock.to_simulated(5.0) == 300.0
    assert SimClock(origin=400.0, scale=1.0).now() == 1_002.0  # scale 1 is the wall clock


def test_clock_rejects_a_scale_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="scale"):
        SimClock(0.0, 0.0)


def test_settings_read_the_clock_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_FORECASTER_CLOCK_ORIGIN", "1700000000")
    monkeypatch.setenv("PROMPTEDGE_FORECASTER_CLOCK_SCALE", "60")
    clock = ForecasterSettings().clock()
    assert (clock.origin, clock.scale) == (1_700_000_000.0, 60.0)


def test_measured_warmup_is_converted_to_simulated_seconds(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """Pods' Ready - creation times are wall seconds; the planner must get simulated ones."""
    from forecaster import live
    from forecaster.actuate import ActuatorSettings
    from forecaster.sources import RedisCounterSource

    class Unscaled:  # the actuator is not what this test is about; it never gets called
        def read_current(self) -> None:
            return None

    seen: list[float | None] = []
    monkeypatch.setattr(live, "measure_warmup", lambda _s: Warmup(5.0, "pods", 3, "P90 of 3 pods"))

    def fake_run_once(settings, source, now, store, current, lead, cache=None):  # noqa: ANN001, ANN202
        seen.append(lead)
        raise SystemExit  # the lead time is all this test needs

    monkeypatch.setattr(live, "run_once", fake_run_once)
    settings = ForecasterSettings(redis_url=redis_url, clock_scale=60.0, clock_origin=0.0)
    actuator_settings = ActuatorSettings(deployment="vllm")
    with pytest.raises(SystemExit):
        live.cycle(settings, actuator_settings, RedisCounterSource(redis_url, None, 3600), Unscaled())  # type: ignore[arg-type]
    assert seen == [300.0]


@pytest.mark.slow
def test_daemon_at_scale_60_decides_once_per_simulated_minute_on_the_counters(redis_url: str, tmp_path: Path) -> None:
    """A real daemon process at CLOCK_SCALE=60 on counters preloaded in simulated minutes: each
    decision reads the demand of the simulated minute before it, and decisions come one
    simulated minute apart (every wall second), not one wall minute apart."""
    origin = float(int(time.time() // 60) * 60)  # simulated and wall time coincide here
    first = int(origin // 60) - 120
    client = redis.Redis.from_url(redis_url)
    for minute in range(first, first + 360):  # 2 h before the origin, 4 h after it
        rate = minute - first + 1  # requests/s in this minute: tells minutes apart
        client.hset(f"promptedge:traffic:m:{minute // 1440}", f"{minute}:requests", rate * 60)
    client.sadd("promptedge:traffic:models", "m")
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_ACTUATOR_MODE": "dry-run",
        "PROMPTEDGE_FORECASTER_HISTORY_S": "3600",
        "PROMPTEDGE_FORECASTER_TIME_BUDGET_S": "1",
        "PROMPTEDGE_FORECASTER_MODELS": '["last_value"]',
        "PROMPTEDGE_FORECASTER_METRICS_PORT": "0",
        "PROMPTEDGE_FORECASTER_CLOCK_ORIGIN": str(origin),
        "PROMPTEDGE_FORECASTER_CLOCK_SCALE": "60",
        "PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA": "1000",
        "PROMPTEDGE_FORECASTER_RATE_WINDOW_S": "60",
    }  # demand = the last minute as counted
    for key in ("PROMPTEDGE_ACTUATOR_DEPLOYMENT", "KUBECONFIG"):
        env.pop(key, None)
    log = tmp_path / "daemon.log"
    pattern = re.compile(
        r"decision \d+ \(\w+, exit \d\) at ([\d.]+) \([^)]*\) on \w+: .*current demand ([\d.e+]+) needs"
    )
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "forecaster", "daemon"], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 90  # without the scale, the third run would come after 120 s
            while len(pattern.findall(log.read_text())) < 4:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
    text = log.read_text()
    assert "one run every 1 wall s" in text
    runs = [(float(at), float(seen)) for at, seen in pattern.findall(text)]
    for at, seen in runs:
        assert origin <= at <= origin + (time.time() - origin) * 60
        previous_minute = int(at // 60) - 1
        assert seen == pytest.approx(previous_minute - first + 1, rel=1e-3), (at, seen, text)
    gaps = [b[0] - a[0] for a, b in zip(runs, runs[1:])]
    assert all(gap > 0 for gap in gaps)
    # one simulated minute per run (a run delayed on a busy machine is coalesced: a multiple)
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(60.0, abs=30.0), gaps
    assert runs[-1][0] > time.time() + 120  # simulated time ran ahead of the wall clock


def test_daemon_adds_the_last_runs_duration_in_simulated_seconds_to_the_lead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run decides at its start and scales at its end: at scale 60 a 2 s run is 2 simulated
    minutes late, so the next run plans that much further ahead."""
    from forecaster import live
    from forecaster.actuate import ActuatorSettings
    from forecaster.plan import Decision
    from forecaster.run import RunResult
    from forecaster.scheduler import ExitCode

    wall = [100.0]
    delays: list[float] = []

    def fake_cycle(
        settings,
        actuator_settings,
        source,
        actuator,
        now=None,
        clock=None,
        run_delay_s=0.0,  # noqa: ANN001, ANN202
        cache=None,
        store=None,
    ):
        delays.append(run_delay_s)
        wall[0] += 2.0  # the run takes 2 wall seconds
        return live.Cycle(RunResult(Decision(1, "r"), 0.0), None, ExitCode.OK)

    monkeypatch.setattr(live, "cycle", fake_cycle)
    monkeypatch.setattr(time, "monotonic", lambda: wall[0])
    job = live.daemon_job(ForecasterSettings(), ActuatorSettings(), None, None, SimClock(0.0, 60.0))  # type: ignore[arg-type]
    job()
    job()
    assert delays == [0.0, 120.0]


def test_run_delay_lengthens_the_lead_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from forecaster import live
    from forecaster.actuate import ActuatorSettings

    seen: list[float | None] = []

    class Unscaled:
        def read_current(self) -> None:
            return None

    def fake_run_once(settings, source, now, store, current, lead, cache=None):  # noqa: ANN001, ANN202
        seen.append(lead)
        raise SystemExit

    monkeypatch.setattr(live, "run_once", fake_run_once)
    with pytest.raises(SystemExit):
        live.cycle(ForecasterSettings(warmup_s=300.0), ActuatorSettings(), None, Unscaled(), now=0.0, run_delay_s=120.0)  # type: ignore[arg-type]
    assert seen == [420.0]
