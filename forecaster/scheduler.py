"""Scheduling: exit codes of ``run --once`` (for cron / CronJob) and the APScheduler daemon loop.

The daemon runs one job at a fixed interval in UTC; runs never overlap (one instance, late runs
coalesced into one), a failed run is logged and the schedule goes on, SIGTERM/SIGINT stop it
after the current run (Kubernetes sends SIGTERM on pod shutdown).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from enum import IntEnum
from types import FrameType

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger(__name__)


class ExitCode(IntEnum):
    """Exit codes of ``python -m forecaster run --once`` (documented in forecaster/README-actuation.md).

    OK: decision made and carried out (or nothing to change). HOLD: a source was unreachable,
    empty or gappy, so the fail-safe held the last decision (nothing scaled down); cron should
    alert if it repeats. BAD_INPUT: bad flags, settings or input file (retrying will not help).
    ACTUATION_FAILED: the decision could not be carried out (Kubernetes API 403/404/409 after
    retries/unreachable, or the KEDA store unreachable).
    """

    OK = 0
    HOLD = 1
    BAD_INPUT = 2
    ACTUATION_FAILED = 3


def guarded(job: Callable[[], None]) -> Callable[[], None]:
    """``job`` wrapped so that an exception is logged with its traceback and swallowed.

    This is the daemon's top-level handler: one failed run must not stop the schedule.
    BaseException (SystemExit, KeyboardInterrupt) still propagates.
    """

    def run() -> None:
        try:
            job()
        except Exception:  # top-level handler of one scheduled run
            log.exception("forecaster run failed; the daemon keeps its schedule")

    return run


def build_scheduler(job: Callable[[], None], interval_s: float) -> BlockingScheduler:
    """A UTC BlockingScheduler running ``guarded(job)`` every ``interval_s`` seconds, first run at once.

    One worker thread and ``max_instances=1`` mean no two runs overlap; ``coalesce`` turns runs
    missed while one was still going into a single run. Raises ValueError if ``interval_s <= 0``.
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    scheduler = BlockingScheduler(
        timezone=UTC,
        executors={"default": ThreadPoolExecutor(max_workers=1)},
    )
    scheduler.add_job(
        guarded(job),
        IntervalTrigger(seconds=interval_s, timezone=UTC),
        id="forecaster-run",
        name="forecaster run",
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,  # a run delayed by a long previous run still happens (once)
        next_run_time=datetime.now(UTC),
    )
    return scheduler


def run_daemon(job: Callable[[], None], interval_s: float) -> None:
    """Run ``job`` every ``interval_s`` seconds (UTC) until SIGTERM or SIGINT; blocks; call from the main thread.

    On a signal the scheduler stops taking new runs and waits for the current one to finish.
    """
    scheduler = build_scheduler(job, interval_s)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: stopping the daemon after the current run", signal.Signals(signum).name)
        scheduler.shutdown(wait=False)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("forecaster daemon: one run every %g wall s (UTC), no overlapping runs", interval_s)
    try:
        scheduler.start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
