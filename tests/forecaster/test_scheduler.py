"""Daemon scheduling: UTC, no overlapping runs, a failed run does not stop it, SIGTERM stops it."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import UTC

import pytest

from forecaster.scheduler import ExitCode, build_scheduler, guarded, run_daemon


def test_exit_codes_are_the_documented_ones() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "HOLD": 1,
        "BAD_INPUT": 2,
        "ACTUATION_FAILED": 3,
    }


def test_scheduler_is_utc_single_instance_coalescing() -> None:
    scheduler = build_scheduler(lambda: None, 60)
    (job,) = scheduler.get_jobs()
    assert scheduler.timezone == UTC
    assert job.trigger.timezone == UTC and job.trigger.interval.total_seconds() == 60
    assert (job.max_instances, job.coalesce, job.misfire_grace_time) == (1, True, None)


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        build_scheduler(lambda: None, 0)


def test_guarded_logs_and_swallows_a_failed_run(caplog: pytest.LogCaptureFixture) -> None:
    def boom() -> None:
        raise RuntimeError("source exploded")

    with caplog.at_level(logging.ERROR, logger="forecaster.scheduler"):
        guarded(boom)()
    assert "forecaster run failed" in caplog.text and "source exploded" in caplog.text


def test_daemon_survives_a_failed_run_never_overlaps_and_stops_on_sigterm(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    active = 0
    most_active = 0
    lock = threading.Lock()

    def job() -> None:
        nonlocal active, most_active
        with lock:
            active += 1
            most_active = max(most_active, active)
            runs.append(len(runs) + 1)
            number = len(runs)
        try:
            if number == 1:
                raise RuntimeError("first run fails")
            time.sleep(0.2)  # longer than the interval: later ticks must wait, not overlap
            if number == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        finally:
            with lock:
                active -= 1

    previous = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.INFO, logger="forecaster.scheduler"):
        run_daemon(job, interval_s=0.05)

    assert runs[:3] == [1, 2, 3]
    assert most_active == 1
    assert "first run fails" in caplog.text and "stopping the daemon" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is previous
