"""`python -m forecaster daemon` as a real process: runs on schedule, keeps going, stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_daemon_process_plans_every_interval_and_exits_0_on_sigterm(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    last = int(time.time() // 60) - 1
    for minute in range(last - 59, last + 3):  # an hour up to now, and the minutes the run may reach
        client.hset(f"promptedge:traffic:m:{minute // 1440}", f"{minute}:requests", 120)
    client.sadd("promptedge:traffic:models", "m")
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_ACTUATOR_MODE": "dry-run",
        "PROMPTEDGE_FORECASTER_HISTORY_S": "3600",
        "PROMPTEDGE_FORECASTER_TIME_BUDGET_S": "1",
        # no fixed metrics port: another process on the machine may hold 9464
        "PROMPTEDGE_FORECASTER_METRICS_PORT": "0",
    }
    for key in ("PROMPTEDGE_ACTUATOR_DEPLOYMENT", "KUBECONFIG"):
        env.pop(key, None)
    log = tmp_path / "daemon.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "forecaster", "daemon", "--interval", "1"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while log.read_text().count('"logger": "forecaster", "message": "decision') < 2:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    text = log.read_text()
    assert code == 0, text
    assert text.count("dry-run default/-: would scale ? -> 2;") >= 2  # every run reached the actuator
    assert "signal SIGTERM: stopping the daemon" in text
