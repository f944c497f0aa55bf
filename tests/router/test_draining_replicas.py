"""A scale-down drains several replicas at once: the router must not lose requests to them.

Real replica processes (``python -m sim serve``) and a real router on real sockets. Four of
five replicas get SIGTERM while a long stream runs on each, so they drain for several seconds,
answering new requests 503 ``replica is shutting down`` as vLLM refuses them, while the router
still lists them: its next ``/health`` probe is 30 s away, as a discovery update can be seconds
behind the kubelet's SIGTERM. In the closed loop a scale-down 5 -> 1 did exactly this, and the
requests whose first three picks were draining replicas came back 503 (issue 10).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack

import httpx
import pytest

from sim.stack import free_port
from tests.router.conftest import CHAT, MODEL, Served
from tests.router.raw_replica import RawReplica
from tests.sim.replica_process import start_replica as start_replica_process


@pytest.fixture
def processes() -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for _ in range(5):
            port = free_port()
            proc = start_replica_process(port, "--profile", "a100", "--model", MODEL, "--warmup-s", "0")
            started.append((proc, f"http://127.0.0.1:{port}"))
        yield started
    finally:
        for proc, _ in started:
            proc.kill()
            proc.wait()


async def _ready(client: httpx.AsyncClient, router: str, n: int) -> None:
    for _ in range(300):
        if (await client.get(router + "/health")).json()["pools"][MODEL]["ready"] == n:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the router never saw {n} ready replicas")


@pytest.mark.usefixtures("exact_only")
async def test_requests_find_the_one_replica_left_while_four_drain(
    processes: list[tuple[subprocess.Popen[bytes], str]], start_router: Callable[..., Awaitable[Served]]
) -> None:
    router = await start_router([url for _, url in processes], health_interval_s=30.0)
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
        await _ready(client, router.url, 5)
        running = []  # the line iterators: one garbage-collected would close its stream
        for proc, url in processes[:4]:
            # a100: about 9 ms a decode step, so 10,000 tokens keep the replica draining ~90 s
            stream = await stack.enter_async_context(
                client.stream(
                    "POST",
                    url + "/v1/completions",
                    json={"model": MODEL, "prompt": "long", "max_tokens": 10_000, "stream": True},
                )
            )
            lines = stream.aiter_lines()
            running.append(lines)
            while not await anext(lines):  # running on the replica
                pass
            proc.send_signal(signal.SIGTERM)
        refused = await client.post(
            processes[0][1] + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}
        )
        assert refused.status_code == 503  # draining, as the router will find it

        limit = asyncio.Semaphore(8)

        async def one(i: int) -> int:
            async with limit:
                body = {"model": MODEL, "prompt": f"question {i} while the pool scales down", "max_tokens": 4}
                return (await client.post(router.url + "/v1/completions", json=body)).status_code

        statuses = await asyncio.gather(*(one(i) for i in range(60)))

        assert all(proc.poll() is None for proc, _ in processes[:4]), "a replica stopped draining too soon"
        assert statuses.count(200) == len(statuses), {s: statuses.count(s) for s in set(statuses)}


@pytest.mark.usefixtures("exact_only")
async def test_a_pool_of_one_replica_that_refused_once_is_still_tried(
    start_router: Callable[..., Awaitable[Served]],
) -> None:
    # Attack review: one 429 with Retry-After 30 shut a one-replica pool for 30 s: every client
    # got 503 no_replica (no Retry-After) while the replica was answering again.
    replica = await RawReplica().start()
    try:
        router = await start_router([replica.url], health_interval_s=30.0)
        async with httpx.AsyncClient(timeout=30) as client:
            await _ready(client, router.url, 1)
            replica.status, replica.headers = b"429 Too Many Requests", b"Retry-After: 30\r\n"
            busy = await client.post(router.url + "/v1/chat/completions", json=CHAT)
            assert busy.status_code == 503 and busy.json()["error"]["code"] == "replica_busy"
            assert 1 <= int(busy.headers["retry-after"]) <= 30
            replica.status, replica.headers = b"200 OK", b""
            again = await client.post(router.url + "/v1/chat/completions", json=CHAT)
            assert again.status_code == 200, again.text
    finally:
        await replica.stop()
