"""Real Redis topologies on one machine, for tests and benchmarks: a Redis Cluster of three
masters and a Sentinel group (one master, one replica, sentinels), all ``redis-server``
processes on 127.0.0.1 without persistence, in a temporary folder removed at stop.

``LocalCluster``: three ``--cluster-enabled`` servers joined by ``redis-cli --cluster create
... --cluster-replicas 0 --cluster-yes`` (16,384 slots split in three); ``url`` is
``redis+cluster://127.0.0.1:p1,...`` (opskit/_redis_url.py).

``LocalSentinel``: a master, a replica (``--replicaof``) and N sentinels (``redis-server
sentinel.conf --sentinel``) watching service ``SERVICE`` with ``down-after-milliseconds``
(default 1,000 ms) and ``failover-timeout`` (default 3,000 ms) set low so a failover takes a few
seconds; ``url`` is ``redis+sentinel://127.0.0.1:s1,.../SERVICE/0``. :meth:`LocalSentinel.kill_master`
SIGKILLs the current master process (no goodbye to clients); :meth:`LocalSentinel.wait_failover`
waits until the sentinels name another master that answers as one; replication is asynchronous,
so :meth:`LocalSentinel.wait_replica_synced` first makes sure the replica has every write.

Both raise StackError when ``redis-server`` / ``redis-cli`` is missing or a step does not finish
in time (the message says which). Ports: free ports from a high range whose cluster-bus twin
(port + 10,000) is free too.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from sim.stack.processes import RedisServer, StackError, port_free

SERVICE = "promptedge"


def binaries_missing() -> str | None:
    """Why the topologies cannot start here (``redis-server`` or ``redis-cli`` not on PATH), or None."""
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            return f"{binary} not found on PATH"
    return None


def high_ports(n: int) -> list[int]:
    """``n`` distinct free ports in 20,000..29,999 whose +10,000 twin (the cluster bus) is free too."""
    found: list[int] = []
    for _ in range(1000):
        port = random.randint(20000, 29999)
        if port not in found and port_free(port) and port_free(port + 10000):
            found.append(port)
            if len(found) == n:
                return found
    raise StackError("no free high ports for a local Redis topology")


def _cli(port: int, *args: str, timeout: float = 5.0) -> str:
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done.stdout


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        time.sleep(0.1)
    raise StackError(f"{what} not reached within {timeout_s:.0f} s")


class LocalCluster:
    """Three cluster-mode masters on 127.0.0.1 with the slots split between them (module doc)."""

    def __init__(self, masters: int = 3) -> None:
        self.masters = masters
        self.folder: Path | None = None
        self.servers: list[RedisServer] = []

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> LocalCluster:
        reason = binaries_missing()
        if reason:
            raise StackError(reason)
        self.folder = Path(tempfile.mkdtemp(prefix="promptedge-cluster-"))
        try:
            for port in high_ports(self.masters):
                self.servers.append(
                    RedisServer(
                        port,
                        extra_args=[
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            f"nodes-{port}.conf",
                            "--cluster-node-timeout",
                            "2000",
                            "--dir",
                            str(self.folder),
                        ],
                    ).start()
                )
            created = subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{p}" for p in self.ports),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
            if created.returncode != 0:
                raise StackError(f"redis-cli --cluster create failed: {created.stdout[-500:]} {created.stderr[-500:]}")
            _wait(
                "cluster_state:ok on every node",
                lambda: all("cluster_state:ok" in _cli(p, "cluster", "info") for p in self.ports),
                20,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.kill()
        self.servers = []
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LocalSentinel:
    """A master, one replica and ``sentinels`` sentinels (quorum: a majority) on 127.0.0.1."""

    def __init__(self, sentinels: int = 3, down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.folder: Path | None = None
        self.data: dict[int, RedisServer] = {}  # port -> master or replica
        self.sentinels: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{SERVICE}/0"

    def master_port(self) -> int | None:
        """The master's port as the first sentinel that answers names it, or None."""
        for sentinel in self.sentinels:
            try:
                lines = _cli(sentinel.port, "sentinel", "get-master-addr-by-name", SERVICE, timeout=2).split()
            except (subprocess.SubprocessError, OSError):
                continue
            if len(lines) == 2 and lines[1].isdigit():
                return int(lines[1])
        return None

    def start(self) -> LocalSentinel:
        reason = binaries_missing()
        if reason:
            raise StackError(reason)
        self.folder = Path(tempfile.mkdtemp(prefix="promptedge-sentinel-"))
        try:
            master_port, replica_port, *sentinel_ports = high_ports(2 + self.sentinel_count)
            self.data[master_port] = RedisServer(master_port).start()
            self.data[replica_port] = RedisServer(
                replica_port, extra_args=["--replicaof", "127.0.0.1", str(master_port)]
            ).start()
            _wait(
                "the replica in sync", lambda: "master_link_status:up" in _cli(replica_port, "info", "replication"), 20
            )
            quorum = self.sentinel_count // 2 + 1
            for port in sentinel_ports:
                conf = self.folder / f"sentinel-{port}.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} {quorum}\n"
                    f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
                # --save "" etc. come after the file, and --sentinel makes the server a sentinel
                self.sentinels.append(RedisServer(port, config=conf, extra_args=["--sentinel"]).start())
            others = self.sentinel_count - 1

            def ready() -> bool:
                for s in self.sentinels:
                    info = _cli(s.port, "sentinel", "master", SERVICE).split()
                    fields = dict(zip(info[::2], info[1::2]))
                    if fields.get("num-slaves") != "1" or fields.get("num-other-sentinels") != str(others):
                        return False
                return True

            _wait("every sentinel seeing the replica and the other sentinels", ready, 30)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_replica_synced(self, timeout_ms: int = 5000) -> None:
        """Wait until the replica acknowledged every write the master has (``WAIT 1``): what
        was written before this returns survives a failover."""
        port = self.master_port()
        acked = _cli(port, "wait", "1", str(timeout_ms), timeout=timeout_ms / 1000 + 5).strip() if port else ""
        if acked != "1":
            raise StackError(f"the replica did not acknowledge the master's writes within {timeout_ms} ms")

    def kill_master(self) -> int:
        """SIGKILL the current master's process; returns its port."""
        port = self.master_port()
        if port is None or port not in self.data:
            raise StackError("no sentinel names a master")
        self.data[port].kill()
        return port

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Wait until the sentinels name a master other than ``old_port`` that reports
        ``role:master`` and that every sentinel flags plain ``master`` (no ``s_down``/``o_down``:
        redis-py's Sentinel client refuses a master so flagged, "No master found"); returns
        its port."""
        found: list[int] = []

        def promoted() -> bool:
            port = self.master_port()
            if port is None or port == old_port or "role:master" not in _cli(port, "info", "replication"):
                return False
            if not all(_flags(sentinel.port) == "master" for sentinel in self.sentinels):
                return False
            found.append(port)
            return True

        _wait("a failover to the replica", promoted, timeout_s)
        return found[-1]

    def stop(self) -> None:
        for server in [*self.sentinels, *self.data.values()]:
            server.kill()
        self.sentinels, self.data = [], {}
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _flags(sentinel_port: int) -> str | None:
    """The ``flags`` a sentinel reports for ``SERVICE``'s master (``master``, ``master,s_down``, ...)."""
    try:
        fields = [line.strip() for line in _cli(sentinel_port, "sentinel", "master", SERVICE, timeout=2).splitlines()]
    except (subprocess.SubprocessError, OSError):
        return None
    pairs = dict(zip(fields[::2], fields[1::2]))
    return pairs.get("flags")
