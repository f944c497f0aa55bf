"""bench/soak.py end to end: a short soak (1.5 minutes of load) on the real stack, every fault of
issue 31 on its schedule (Redis and an idle replica SIGKILLed, a replica hung, an engine
SIGSTOPped behind a live ``/health``, the forecaster SIGKILLed and restarted, a router worker
restarted with SIGTERM, oversized requests), and nothing lost, nothing wrong."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_script import BENCH

ROOT = BENCH.parent
FAULTS = [
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
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_a_short_soak_loses_nothing_and_answers_nothing_wrong(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "soak.py"),
            "--minutes",
            "1.5",
            "--no-semantic",
            "--json",
            str(report_path),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
        cwd=ROOT,
    )
    assert report_path.exists(), done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    table = done.stdout

    totals = report["totals"]
    # the worker restart is graceful (SIGTERM): nothing it had in flight may be lost
    assert totals["lost"] == 0 and totals["lost_at_worker_kill"] == 0, (table, report["failures"])
    assert totals["wrong"] == 0, (table, report["failures"])
    assert done.returncode == (1 if totals["lost"] else 0), table + done.stderr
    # every fault ran, at its phase, and each phase had traffic
    assert [f["action"] for f in report["faults"]] == FAULTS
    phases = {row["phase"]: row for row in report["phases"]}
    for phase in (
        "redis_down",
        "replica_killed",
        "replica_hung",
        "engine_stopped",
        "forecaster_down",
        "after_forecaster_restart",
        "router_worker_killed",
        "after_router_worker",
    ):
        assert phases[phase]["sent"] > 0, phase
    faults = {f["action"]: f for f in report["faults"]}
    assert faults["kill_replica"]["idle_at_kill"], faults["kill_replica"]  # killed while idle
    assert faults["stop_engine"]["requests_on_engine_at_stop"], faults["stop_engine"]  # stopped while generating
    assert faults["kill_router_worker"]["replaced_by"], faults["kill_router_worker"]  # the supervisor replaced it
    # the oversized requests were each refused with the error naming the limit
    for kind, row in report["oversized"].items():
        assert row["sent"] >= 1 and row["refused"] + row["lost"] == row["sent"] and row["wrong"] == 0, (kind, row)
    # the restarted forecaster decided, and never below its predecessor's last decision in the window
    forecaster = report["forecaster"]
    assert set(forecaster["decisions_per_process"]) == {"0", "1"}, forecaster
    assert forecaster["violations"] == [], forecaster
