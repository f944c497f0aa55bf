"""How ``python -m router serve`` starts: the start-up checks shared by the one-process server
and by each of ``--workers N`` worker processes, and the worker supervisor.

With N > 1, uvicorn's own process supervisor (``uvicorn.supervisors.Multiprocess``, what
``uvicorn --workers`` runs) binds the port once in the parent and hands the listening socket to
N spawned workers, which all accept on it; it restarts a worker that dies or stops answering its
health pings, and on SIGINT/SIGTERM sends SIGTERM to every worker and waits for each. What it
pickles into a worker is a :class:`WorkerConfig`, whose :meth:`WorkerConfig.load` (run by uvicorn
in the worker, before serving) repeats the start-up checks and builds that worker's own app and
connection-limited protocol from the same environment, exactly as the one-process server does;
so each worker runs the whole lifespan (discovery, scraper, counters, cache and its semantic
index follower).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

import uvicorn
from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError
from tqdm import tqdm
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from cache import CacheSettings
from opskit import FORMATS, LogFormat
from opskit import configure as configure_logging
from opskit.redis_client import RedisURLError, check_redis_url
from router.app import create_app
from router.discovery import DiscoveryError, ReplicaSource, StaticSource, build_source
from router.errors import RouterError
from router.forward.credentials import CredentialError, Credentials
from router.observe.metrics_shared import ENV as SHARED_METRICS_ENV
from router.observe.metrics_shared import forget, hold, new_dir, remove_dir, shared_dir
from router.observe.tracing import TracingError, check_exporter
from router.process.heap import frozen_after_startup
from router.process.limits import ConnectionBudget, connection_budget
from router.process.server import not_cancelled, protocol_class, raise_open_files_limit
from router.settings import RouterSettings, error_location

log = logging.getLogger("router.server")
S = TypeVar("S", bound=BaseSettings)
# A worker's start-up (the embedding model's load, its first ONNX export: 10-30 s) must not be
# taken for a hang: the supervisor kills and replaces a worker that does not answer its ping
# within this many seconds (uvicorn's default is 5).
WORKER_HEALTHCHECK_S = 30


class StartupError(RouterError):
    """The router cannot start with these settings; ``lines`` are the messages for the log
    (:func:`report_startup_error`), which never repeat a secret; ``log_format`` is the router's
    setting when it could be read (None: the settings themselves failed)."""

    def __init__(self, lines: list[str], log_format: LogFormat | None = None) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.log_format = log_format


@dataclass(frozen=True)
class Launch:
    """What serving needs, checked: the settings (``max_connections`` already cut to the
    connection budget), the replica source, and the connection budget of this process."""

    settings: RouterSettings
    source: ReplicaSource
    budget: ConnectionBudget


def _read(cls: type[S], prefix: str) -> S:
    """``cls()`` from the environment and the settings file; an invalid value is a StartupError
    line per error naming its environment variable (``prefix`` + field, or the alias it was given
    as), never the value."""
    try:
        return cls()
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_url=False):
            field = error_location(error["loc"])  # API keys in a location are secrets
            if not field:  # a rule across fields (model validator): its message names them
                lines.append(f"settings {prefix}*: {error['msg']}")
                continue
            top = field.split(".")[0]  # a field, or an env name given as its alias (PROMPTEDGE_REDIS_URL)
            name = top if top.startswith("PROMPTEDGE_") else f"{prefix}{top.upper()}"
            lines.append(f"setting {name} ({field}): {error['msg']}")
        raise StartupError(lines) from None
    except SettingsError as exc:  # a list/dict setting that is not valid JSON
        raise StartupError([str(exc)]) from None


def prepare() -> Launch:
    """Read the settings from the environment (and PROMPTEDGE_SETTINGS_FILE), check the Redis
    URL, the tracing exporter, discovery and every backend key, and size connections to this
    process's open-files limit (raised to its hard limit first). Raises :class:`StartupError`
    (with the router's ``log_format`` once its settings are read)."""
    settings = _read(RouterSettings, "PROMPTEDGE_ROUTER_")
    try:
        return _check(settings)
    except StartupError as exc:
        exc.log_format = settings.log_format
        raise


def _check(settings: RouterSettings) -> Launch:
    # the cache's own settings, read again in each worker's lifespan: a bad one is a start-up error here
    _read(CacheSettings, "PROMPTEDGE_CACHE_")
    try:
        check_exporter(settings.otel_exporter)
        check_redis_url(settings.redis_url)
        source = build_source(settings)
        # read every backend key now: a missing one is a start-up error, not a 401 per request
        Credentials(settings.backend_keys).check(source.specs if isinstance(source, StaticSource) else ())
    except RedisURLError as exc:
        raise StartupError([f"setting PROMPTEDGE_REDIS_URL: {exc}"]) from None
    except (DiscoveryError, TracingError, CredentialError) as exc:
        raise StartupError([str(exc)]) from None
    try:  # client and upstream connections share the open-files limit (router/process/limits.py)
        budget = connection_budget(raise_open_files_limit(), settings.limits, settings.max_connections)
    except ValueError as exc:
        raise StartupError([str(exc)]) from None
    return Launch(settings.model_copy(update={"max_connections": budget.upstream}), source, budget)


def report_startup_error(exc: StartupError, log_level: str) -> None:
    """Log ``exc``'s lines as ERROR records of ``router.server`` (``cannot start: ...``) in the
    router's log format, as every other line of its log: JSON by default, so a log pipeline that
    parses each stderr line as JSON reads them too. When the settings themselves failed, the
    format is ``PROMPTEDGE_ROUTER_LOG_FORMAT`` if that alone is valid, else the default (json)."""
    fmt = exc.log_format
    if fmt is None:
        given = os.environ.get("PROMPTEDGE_ROUTER_LOG_FORMAT", "").strip().lower()
        fmt = given if given in FORMATS else RouterSettings.model_fields["log_format"].default
    configure_process_logging(fmt, log_level)
    for line in exc.lines:
        log.error("cannot start: %s", line)


def configure_process_logging(log_format: LogFormat, log_level: str) -> None:
    """This process's logging as the router's: every line in ``log_format`` (JSON: one
    object per line, with the ``pid`` of the process that wrote it), no per-scrape httpx lines,
    no progress bars, no tracebacks of requests cancelled by a forced shutdown."""
    configure_logging(log_format, log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape otherwise
    logging.getLogger("uvicorn.error").addFilter(not_cancelled)
    # A service log has no progress bars: loading the embedding model drew one (transformers'
    # "Loading weights", through tqdm, which reads TQDM_DISABLE from 4.66 on).
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class WorkerConfig(uvicorn.Config):
    """uvicorn's configuration of one of ``workers`` worker processes on ``host``:``port``.

    The supervisor pickles it into each worker (multiprocessing's spawn), so it holds only plain
    values; :meth:`load`, which uvicorn calls in the worker before it serves, builds the worker's
    app and protocol there."""

    def __init__(
        self, *, host: str, port: int, workers: int, log_format: LogFormat, log_level: str, keepalive_s: float
    ) -> None:
        super().__init__(
            "router.app:create_app",
            host=host,
            port=port,
            workers=workers,
            loop="uvloop",
            log_level=log_level,
            access_log=False,
            log_config=None,
            timeout_keep_alive=keepalive_s,
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        )
        self.router_log_format = log_format
        self.router_log_level = log_level

    def load(self) -> None:
        """In the worker: this process's logging (the supervisor's format), its hold on the shared
        metrics directory (router/observe/metrics_shared.py), the start-up checks
        (a failure logs the error and exits with uvicorn's STARTUP_FAILURE, 3, which stops the
        supervisor rather than restarting the worker forever), then the app and the limited
        protocol."""
        configure_process_logging(self.router_log_format, self.router_log_level)
        # SIGHUP is the supervisor's (it replaces the workers one by one); a hang-up sent to the
        # whole process group (a closed terminal, an orphaned group) killed every worker at once
        # with its streams (attack round: 10 of 10 cut). uvicorn's worker handles only INT/TERM.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if (metrics_dir := shared_dir()) is not None:  # kept while this worker writes there
            hold(metrics_dir)
        try:
            launch = prepare()
        except StartupError as exc:
            log.error("worker %d cannot start: %s", os.getpid(), exc)
            sys.exit(STARTUP_FAILURE)
        self.configure_logging()  # uvicorn's again, after ours: no uvicorn.access lines (access_log=False)
        # tqdm's default write lock is a named POSIX semaphore when the process was spawned
        # (registered with the supervisor's multiprocessing resource tracker, which printed a
        # plain-text "leaked semaphore objects" warning among the JSON lines at shutdown); a
        # thread lock does, since progress bars are off and the worker starts no processes.
        tqdm.set_lock(threading.RLock())
        if launch.budget.note:
            log.warning(
                "RLIMIT_NOFILE %d: %s to fit (router/README.md, Limits)", launch.budget.nofile, launch.budget.note
            )
        self.app: Any = frozen_after_startup(create_app(launch.settings, launch.source))
        self.http = protocol_class(launch.settings.limits, launch.budget)
        super().load()


class Supervisor(Multiprocess):
    """uvicorn's supervisor, which also tells prometheus_client when a worker is gone (died and
    replaced, replaced on SIGHUP, removed on SIGTTOU), so that its live gauges leave the shared
    ``/metrics`` with it (router/observe/metrics_shared.py)."""

    def keep_subprocess_alive(self) -> None:
        before = self._pids()
        super().keep_subprocess_alive()
        forget(before - self._pids())

    def handle_signals(self) -> None:
        before = self._pids()
        super().handle_signals()
        forget(before - self._pids())

    def _pids(self) -> set[int]:
        return {process.pid for process in self.processes if process.pid is not None}


def serve_workers(config: WorkerConfig) -> None:
    """Bind ``config``'s port once, run ``config.workers`` workers on it under uvicorn's
    supervisor until SIGINT or SIGTERM (each worker is sent SIGTERM and waited for), then return.
    The workers share a fresh ``PROMETHEUS_MULTIPROC_DIR`` (made here before they start, any
    inherited one replaced, removed at exit; those of killed supervisors removed first:
    :func:`router.observe.metrics_shared.new_dir`) so that each one's ``/metrics`` answers with all of
    their series. Exits with 3 (STARTUP_FAILURE) when the port cannot be bound or a worker fails
    to start."""
    sock = config.bind_socket()  # logs "Uvicorn running on ..." with the bound port
    # listening now, not when the first worker has started: a connection made meanwhile (or while
    # every worker restarts) waits in the backlog instead of being refused
    sock.listen(config.backlog)
    # a directory of an earlier run would add its counts to this one's: always a new one
    os.environ[SHARED_METRICS_ENV] = new_dir()
    try:
        supervisor = Supervisor(config, sockets=[sock])
        supervisor.run()
    finally:
        remove_dir(os.environ.pop(SHARED_METRICS_ENV))
    sock.close()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        sys.exit(STARTUP_FAILURE)
