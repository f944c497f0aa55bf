"""A request the replica provably never processed is retried; one it may have processed never is
(issue 31, item 1; router/forward/unread.py has the reasoning).

Real replica *processes* (tests/router/unread_replica.py) on loopback sockets, killed with real
signals, in front of an in-process router on each upstream transport:

- a process that accepted the connection but never read the request, SIGKILLed once the whole
  request sits in its receive buffer: its kernel resets the connection and its port is closed,
  so the router retries on another replica and the client gets 200;
- a process that read the whole request and then ended (``os._exit``): a clean end of stream,
  its port just as closed, and still a 502, never sent again;
- a connection reset (``SO_LINGER`` 0) while the process and its port live on (a middlebox, one
  process of several): a 502, never sent again.

The pure part, which transport errors count as "reset by the peer", is tested without I/O.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import httpcore
import httpx
import pytest

from router.forward.unread import port_closed, reset_by_peer
from tests.router.conftest import CHAT, MODEL
from tests.router.raw_replica import RawReplica
from tests.router.sim_process import ROOT

TRANSPORTS = ["aiohttp", "httpx"]
URL = "/v1/chat/completions"


class UnreadReplica:
    """One ``python -m tests.router.unread_replica MODE`` process on its own port."""

    def __init__(self, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.router.unread_replica", mode], cwd=ROOT, stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith("listening "), line
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    async def said(self, timeout_s: float = 10.0) -> str:
        """The process's next line (``unread N``, ``read N``, ``reset N``)."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout_s)
        return line.decode().strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture()
async def unread_replica() -> AsyncIterator[Callable[[str], UnreadReplica]]:
    started: list[UnreadReplica] = []

    def start(mode: str) -> UnreadReplica:
        started.append(UnreadReplica(mode))
        return started[-1]

    yield start
    for replica in started:
        replica.kill()


async def router_for(start_router, victim: str, alive: str, transport: str):
    """A router over ``victim`` and ``alive`` whose probes and scrapes ran once at start, whose
    next request goes to ``victim`` (round robin, its ticket set so)."""
    router = await start_router(
        [alive, victim], upstream_transport=transport, policy="round_robin", health_interval_s=60, scrape_interval_s=60
    )
    state = router.app.state.router
    eligible = [r.url for r in state.pools.eligible(MODEL, time.monotonic())]
    assert sorted(eligible) == sorted([alive, victim]), eligible
    state.ticket = eligible.index(victim) - 1 + len(eligible)  # round_robin picks views[(ticket + 1) % n]
    return router


async def retries(client: httpx.AsyncClient, router) -> float:
    text = (await client.get(router.url + "/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("promptedge_router_retries_total{")
    )


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_request_left_unread_by_a_killed_replica_is_retried(
    transport, unread_replica, start_router, client
) -> None:
    victim = unread_replica("never_read")
    alive = await RawReplica().start()
    try:
        router = await router_for(start_router, victim.url, alive.url, transport)
        request = asyncio.create_task(client.post(router.url + URL, json=CHAT))
        said = await victim.said()
        assert said.startswith("unread "), said  # the whole request is in its buffer, unread
        victim.kill()
        answer = await request
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-promptedge-replica"] == alive.url
        assert alive.requests == 1
        assert await retries(client, router) == 1
        # the dead replica's failure is evidence for its circuit breaker, as a refused connect is
        dead = next(r for r in router.app.state.router.pools.all() if r.url == victim.url)
        assert dead.health._connect_failures == 1
    finally:
        await alive.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_replica_that_read_the_request_and_died_is_not_retried(
    transport, unread_replica, start_router, client
) -> None:
    victim = unread_replica("read_then_exit")
    alive = await RawReplica().start()
    try:
        router = await router_for(start_router, victim.url, alive.url, transport)
        answer = await client.post(router.url + URL, json=CHAT)
        assert (await victim.said()).startswith("read ")
        victim.proc.wait(timeout=10)
        assert refused(victim.port)  # its port is as closed as a killed replica's: no reset, no retry
        assert answer.status_code == 502, answer.text
        assert (answer.json()["error"]["code"], answer.headers.get("x-promptedge-replica")) == ("replica_error", None)
        assert alive.requests == 0
        assert await retries(client, router) == 0
    finally:
        await alive.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reset_while_the_port_stays_open_is_not_retried(
    transport, unread_replica, start_router, client
) -> None:
    victim = unread_replica("reset_keep_listening")
    alive = await RawReplica().start()
    try:
        router = await router_for(start_router, victim.url, alive.url, transport)
        answer = await client.post(router.url + URL, json=CHAT)
        assert (await victim.said()).startswith("reset ")
        assert victim.proc.poll() is None and not refused(victim.port)
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "replica_error"
        assert alive.requests == 0
        assert await retries(client, router) == 0
    finally:
        await alive.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reset_after_part_of_the_answer_is_not_retried(transport, unread_replica, start_router, client) -> None:
    """Bytes of an answer prove the replica had the request: a reset after them, even from a
    process that is gone at once, is a 502 (found by the attack round on d12362b: retried)."""
    victim = unread_replica("partial_head_reset_exit")
    alive = await RawReplica().start()
    try:
        router = await router_for(start_router, victim.url, alive.url, transport)
        answer = await client.post(router.url + URL, json=CHAT)
        assert (await victim.said()).startswith("answered ")
        victim.proc.wait(timeout=10)
        assert refused(victim.port)
        assert answer.status_code == 502, answer.text
        assert alive.requests == 0
        assert await retries(client, router) == 0
    finally:
        await alive.stop()


async def test_the_port_probe_asks_every_address_of_the_replicas_name(monkeypatch) -> None:
    """A name with several addresses (``localhost`` as ::1 and 127.0.0.1, DNS round robin): the
    replica is gone only when every address refuses. Before (found by the attack round), the
    first address alone was asked, so a live replica on the second was taken for dead and a
    reset it sent after reading the request was retried elsewhere."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def two_addresses(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host != "dual.test":
            return await real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),  # nothing listens here
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(loop, "getaddrinfo", two_addresses)
    with listener:
        assert not await port_closed("dual.test", port)  # the replica still listens on 127.0.0.1
    assert await port_closed("dual.test", port)  # now no address of the name accepts


def _chained(*chain: BaseException) -> BaseException:
    """``chain[0]`` raised from ``chain[1]`` raised from ... (``__cause__`` links)."""
    for outer, inner in itertools.pairwise(chain):
        outer.__cause__ = inner
    return chain[0]


def test_only_a_kernel_reset_counts_as_reset_by_the_peer() -> None:
    reset = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    # aiohttp (through httpx-aiohttp): httpx.ConnectTimeout from ClientOSError(ECONNRESET) from the OSError
    assert reset_by_peer(_chained(httpx.ConnectTimeout("x"), aiohttp.ClientOSError(*reset.args), reset))
    # httpcore: httpx.ReadError from httpcore.ReadError from the OSError
    assert reset_by_peer(_chained(httpx.ReadError("x"), httpcore.ReadError("x"), reset))
    assert reset_by_peer(_chained(httpx.RemoteProtocolError("x"), httpcore.RemoteProtocolError("x"), reset))
    # a clean end of stream (the replica may have read it all), a write into a transport aiohttp
    # already saw closing (why it closed is not known: errno None), a broken pipe, a timeout
    assert not reset_by_peer(_chained(httpx.ConnectTimeout("x"), aiohttp.ServerDisconnectedError()))
    assert not reset_by_peer(
        _chained(
            httpx.ConnectTimeout("x"),
            aiohttp.ClientOSError(None, "Can not write request body"),
            aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
        )
    )
    assert not reset_by_peer(
        _chained(httpx.ReadError("x"), httpcore.ReadError("x"), BrokenPipeError(errno.EPIPE, "Broken pipe"))
    )
    assert not reset_by_peer(_chained(httpx.RemoteProtocolError("Server disconnected without sending a response.")))
    assert not reset_by_peer(_chained(httpx.ReadTimeout("x"), TimeoutError()))
