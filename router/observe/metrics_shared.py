"""``/metrics`` of ``router serve --workers N``: every worker's series in every scrape, through
prometheus_client's multiprocess mode.

Each scrape reaches one worker. Without this, it answered with its own counters only, so
successive scrapes saw different workers' counts and ``rate()`` over them was garbage. The
supervisor (router/process/launch.py) creates a fresh ``PROMETHEUS_MULTIPROC_DIR`` before it starts the
workers (prometheus_client reads it at import: every counter and histogram a worker creates then
keeps its values in a file there), marks a worker that is gone with ``mark_process_dead`` and
removes the directory at exit. A supervisor killed with SIGKILL cannot: the supervisor and
each worker hold a lock in the directory while they run (:func:`new_dir`, :func:`hold`), and
the next supervisor to start removes it once none holds it. Then:

- counters and histograms (the router's and the cache's) are read from every worker's file by
  ``MultiProcessCollector`` and summed: a counter is the total over all workers, those that died
  included, so it never goes down when a worker is replaced;
- the series computed at scrape time from a worker's own state (custom collectors: replica
  gauges, discovery, ``cache_up``, ``process_*``), which multiprocess mode cannot read in another
  process, are copied by each worker into file-backed gauges (``multiprocess_mode`` by meaning,
  :data:`GAUGE_MODES`) and counters (their increments) every ``PUBLISH_S`` and before it answers
  a scrape; a dead worker's gauges leave with it;
- multiprocess mode cannot remove a series (prometheus_client's ``remove()`` only warns there:
  the values stay in the files while the workers live), so a series labelled with a replica
  that no running worker discovers now is left out of the answer instead. Each worker marks its
  current replicas 1 and those it dropped 0 in one more file-backed gauge (:data:`DISCOVERED`,
  ``livemax``, not exposed): a replica is shown while some worker marks it 1. The same set in
  every worker, whatever the answering worker discovers itself: one started after the replica
  left, or one whose discovery is empty for a moment (just started, its source failing),
  neither shows a replica no worker has nor hides one another worker has.

With one worker (no ``PROMETHEUS_MULTIPROC_DIR``) none of this runs.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

log = logging.getLogger("router.server")
ENV = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "promptedge-metrics-"  # then the supervisor's pid (for people), "-", mkdtemp's random part
# In each directory: flock()ed shared by its supervisor and every worker while they run, tried
# exclusively by a later supervisor before it removes the directory. flock works across PID
# namespaces on one kernel; the kernel lets go of it when a holder dies, SIGKILL included.
LOCK = "owner.lock"  # prometheus_client reads only *.db
_held: dict[str, int] = {}  # directory -> this process's open lock, held until it ends
PUBLISH_S = 1.0  # how stale another worker's gauges can be in a scrape
# Per worker and replica: 1 while the worker discovers it, 0 once it dropped it (read, not exposed)
DISCOVERED = "promptedge_router_worker_discovers_replica"
# How the workers' values of one gauge make the one value of a scrape (live*: only running
# workers'). A gauge not listed is exposed per worker (``liveall``: a ``pid`` label).
GAUGE_MODES = {
    "promptedge_router_replica_inflight": "livesum",  # the router's open requests: all workers'
    "promptedge_router_replica_up": "livemax",  # 1 while some worker sends to it (alert: none in a pool)
    "promptedge_router_replica_score": "livemax",  # each worker's own in-flight in it: the worst view
    "promptedge_router_scrape_age_seconds": "livemax",  # the stalest worker's scrape (alert: > 10 s)
    "promptedge_router_replica_seconds_per_token": "livemax",  # learned per worker: the slowest
    "promptedge_router_replica_stuck": "livemax",  # 1 while some worker judges its generation stuck
    "promptedge_router_cache_up": "livemin",  # 0 while any worker serves without its cache
    "promptedge_router_discovery_endpoints": "livemax",  # every worker discovers the same set
    "promptedge_router_discovery_sync_age_seconds": "livemax",
    "process_resident_memory_bytes": "livesum",
    "process_virtual_memory_bytes": "livesum",
    "process_open_fds": "livesum",
    "process_max_fds": "livemin",
    "process_start_time_seconds": "livemin",  # the oldest running worker's start
}


def shared_dir() -> str | None:
    """The multiprocess directory when this process is one of several workers, else None."""
    return os.environ.get(ENV) or None


class SharedSeries:
    """One worker's side of the shared ``/metrics``: :meth:`publish` copies ``collectors``' series
    and the worker's current replicas (``replicas()``, URLs) into the files, :meth:`render`
    answers a scrape with every worker's series."""

    def __init__(self, collectors: Sequence[Collector], replicas: Callable[[], set[str]]) -> None:
        self.collectors, self.replicas = collectors, replicas
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, Counter] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}  # counter values already added
        self._discovered = Gauge(
            DISCOVERED,
            "1 while this worker discovers the replica",
            ["replica"],
            registry=None,
            multiprocess_mode="livemax",
        )
        self._marked: set[str] = set()  # replicas marked 1

    def publish(self) -> None:
        """Copy the collectors' current values: gauges set, counters increased by what they
        counted since the last copy (a counter that went down is not copied back); mark the
        replicas this worker discovers now 1, those it dropped since the last copy 0."""
        self.mark()
        for collector in self.collectors:
            for family in collector.collect():
                if family.type == "gauge":
                    self._set(family)
                elif family.type == "counter":
                    self._count(family)

    def mark(self) -> None:
        """Mark the replicas this worker discovers now 1, those it dropped since the last mark 0
        (part of :meth:`publish`; call it too when discovery removes replicas, so that no other
        worker shows them meanwhile)."""
        now = self.replicas()
        for url in self._marked - now:
            self._discovered.labels(url).set(0)
        for url in now - self._marked:
            self._discovered.labels(url).set(1)
        self._marked = now

    def _set(self, family: Metric) -> None:
        for sample in family.samples:
            gauge = self._gauges.get(family.name)
            if gauge is None:
                gauge = self._gauges[family.name] = Gauge(
                    family.name,
                    family.documentation,
                    list(sample.labels),
                    registry=None,
                    multiprocess_mode=GAUGE_MODES.get(family.name, "liveall"),
                )  # type: ignore[arg-type]
            (gauge.labels(*sample.labels.values()) if sample.labels else gauge).set(sample.value)

    def _count(self, family: Metric) -> None:
        for sample in family.samples:
            if not sample.name.endswith("_total"):  # _created
                continue
            counter = self._counters.get(family.name)
            if counter is None:
                counter = self._counters[family.name] = Counter(
                    family.name, family.documentation, list(sample.labels), registry=None
                )
            key = (family.name, tuple(sample.labels.values()))
            child = counter.labels(*key[1]) if sample.labels else counter  # shown at 0 as in one process
            added = sample.value - self._counted.get(key, 0.0)
            if added > 0:
                child.inc(added)
                self._counted[key] = sample.value

    def render(self) -> bytes:
        """Text exposition of every worker's series (after publishing this worker's), without
        those labelled with a ``replica`` that no running worker discovers now (discovery
        removed it everywhere). A series whose ``replica`` is empty (a cache hit, no replica)
        or that has no such label is kept."""
        self.publish()
        registry = CollectorRegistry()
        registry.register(_OnlyReplicas(MultiProcessCollector(None)))
        return generate_latest(registry)


class _OnlyReplicas(Collector):
    """Every worker's series, those of replicas no worker marks in :data:`DISCOVERED` left out
    (and that gauge itself)."""

    def __init__(self, inner: MultiProcessCollector) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        families = list(self.inner.collect())
        replicas = {
            s.labels["replica"]
            for family in families
            if family.name == DISCOVERED
            for s in family.samples
            if s.value > 0
        }
        for family in families:
            if family.name == DISCOVERED:
                continue
            family.samples = [
                s for s in family.samples if not s.labels.get("replica") or s.labels["replica"] in replicas
            ]
            yield family


async def publish_every(series: SharedSeries, seconds: float = PUBLISH_S) -> None:
    """Publish ``series`` every ``seconds`` until cancelled (a task of the worker's lifespan)."""
    while True:
        series.publish()
        await asyncio.sleep(seconds)


def new_dir(parent: str | None = None) -> str:
    """In the supervisor, before its workers start: make this run's multiprocess directory under
    ``parent`` (default the temp directory, ``TMPDIR``), named ``promptedge-metrics-{pid}-...``
    and held (:func:`hold`) until this process ends or :func:`remove_dir`; first remove those
    that supervisors killed with SIGKILL left there: a directory is removed when no process
    holds its lock (neither its supervisor nor a worker that outlived it and still writes
    there). A pid is no evidence: a router in another PID namespace on the same ``/tmp`` has
    the same pids (two containers are both pid 1). A directory of another user, or without the
    lock (made by an older version, which may still run), is left alone. Returns the path."""
    parent = tempfile.gettempdir() if parent is None else parent
    for path in Path(parent).glob(PREFIX + "*"):
        if _remove_if_unheld(path):
            log.info("removed %s, the metrics directory of a supervisor that was killed", path)
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent)
    # locked before it has the lock's name: a directory without it is never removed
    fd, unnamed = tempfile.mkstemp(prefix=".lock-", dir=path)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.rename(unnamed, os.path.join(path, LOCK))
    _held[path] = fd
    return path


def hold(path: str) -> None:
    """In a worker: hold ``path``'s lock (shared, as its supervisor and the other workers do)
    until this process ends, so that the directory is kept while the worker writes there, its
    supervisor killed or not. A directory without the lock is only logged."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        log.warning("metrics directory %s has no lock, a later supervisor may remove it: %s", path, exc)
        return
    fcntl.flock(fd, fcntl.LOCK_SH)
    _held[path] = fd


def remove_dir(path: str) -> None:
    """In the supervisor, at exit: remove its directory and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def _remove_if_unheld(path: Path) -> bool:
    try:
        if not path.is_dir() or path.is_symlink() or path.lstat().st_uid != os.getuid():
            return False
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # no lock (an older version's), removed meanwhile, not readable
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while any process holds it
    except OSError:
        return False
    else:
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def forget(pids: Iterable[int]) -> None:
    """In the supervisor: drop the live gauges of the worker processes ``pids``, which are gone
    (their counters stay: a counter of the router never goes down)."""
    for pid in pids:
        mark_process_dead(pid)
