"""The real router process (``python -m router serve``: uvicorn, uvloop, httptools) for tests that
attack it over real sockets: start it with extra environment (and an optional open-files limit),
find its port, read its RSS and its log."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from opskit.redis_client import sync_redis

REDIS_URL = os.environ.get("PROMPTEDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
MODEL = "m"
# A pool whose only replica never answers (the discard port): requests are parsed, cached or
# refused by the router itself, then answered 503 no_replica.
REPLICAS = json.dumps([{"url": "http://127.0.0.1:9", "model": MODEL, "metrics_path": None}])


@dataclass
class RouterProcess:
    """A running ``python -m router serve`` on 127.0.0.1:``port``; its log is ``log``."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """The process's resident set size now (``VmRSS``), or its peak since
        :meth:`reset_peak_rss` (``VmHWM``), bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field}")

    def reset_peak_rss(self) -> None:
        """Start a new peak (VmHWM := VmRSS; Linux's clear_refs, ``5``)."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def connect(self, timeout: float = 10.0) -> socket.socket:
        """A new TCP connection to the router."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_router(
    tmp_path: Path, env: dict[str, str] | None = None, nofile: int | None = None, args: tuple[str, ...] = ()
) -> RouterProcess:
    """Start the router as a user would on a flushed test Redis database, with ``env`` added to
    the environment, ``args`` added to ``serve``'s command line and, if given,
    ``nofile`` as both soft and hard RLIMIT_NOFILE of the process; waits until it listens."""
    full_env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": REDIS_URL,
        "PROMPTEDGE_ROUTER_REPLICAS": REPLICAS,
        "PROMPTEDGE_ROUTER_HEALTH_INTERVAL_S": "5",
        **(env or {}),
    }

    def limit_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    # any topology (a Sentinel URL in bench/redis_failover.py): its master's database
    flush = sync_redis(full_env["PROMPTEDGE_REDIS_URL"], socket_connect_timeout=1)
    flush.flushdb()  # no cache entry of an earlier test can answer this one's requests
    flush.close()
    log = tmp_path / f"router-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "router", "serve", "--port", "0", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            preexec_fn=limit_files,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", log.read_text())
        if match is not None:
            router = RouterProcess(proc, int(match.group(1)), log)
            try:  # with --workers the supervisor listens (and says so) before a worker has started
                httpx.get(router.url + "/health", timeout=max(30.0, deadline - time.monotonic()))
            except httpx.HTTPError:  # not left running when it does not answer
                router.stop()
                raise
            return router
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise AssertionError(f"router did not start:\n{log.read_text()}")


def read_response(sock: socket.socket, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response with a Content-Length from ``sock``: (status, headers, body)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the peer closes ``sock`` (EOF or reset) within ``seconds``; data is discarded."""
    sock.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_replica(tmp_path: Path, max_model_len: int = 64) -> tuple[subprocess.Popen[bytes], str]:
    """A simulated vLLM replica process (``python -m sim serve``, A100 profile) serving ``MODEL``,
    ready (``/health`` 200); returns the process and its base URL."""
    port = free_port()
    log = tmp_path / f"replica-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim",
                "serve",
                "--port",
                str(port),
                "--model",
                MODEL,
                "--warmup-s",
                "0",
                "--max-model-len",
                str(max_model_len),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise AssertionError(f"replica did not start:\n{log.read_text()}")
