"""Never twice (docs/architecture.md): a request is retried on another replica only when it provably never
reached one. Replicas fail at each stage of the exchange on real loopback sockets (nothing
listening, closed on accept, closed after reading the request, died mid-headers, died
mid-body) and a real ``python -m sim serve`` replica is SIGKILLed while generating; each case
runs on both upstream transports. The test counts what each replica saw and what the client got.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import pytest

from router.dispatch.signals import parse_metrics
from tests.router.conftest import CHAT, sse_data
from tests.router.raw_replica import RawReplica
from tests.router.sim_process import free_port, start_sim, wait_healthy

TRANSPORTS = ["aiohttp", "httpx"]
URL = "/v1/chat/completions"


@pytest.fixture()
async def raw_replicas():
    """``await raw_replicas(n)``: n started RawReplicas, all stopped at the test's end."""
    started: list[RawReplica] = []

    async def start(n: int) -> list[RawReplica]:
        for _ in range(n):
            started.append(await RawReplica().start())
        return started[-n:]

    yield start
    for replica in started:
        await replica.stop()


async def quiet_router(start_router, urls: list[str], transport: str):
    """A router whose probes and scrapes ran once at start (all replicas up) and not again
    during the test, so only the completion request touches the replicas."""
    return await start_router(urls, upstream_transport=transport, health_interval_s=60, scrape_interval_s=60)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_nothing_listening_is_retried_on_another_replica(transport, raw_replicas, start_router, client) -> None:
    gone, also_gone, alive = await raw_replicas(3)
    router = await quiet_router(start_router, [gone.url, also_gone.url, alive.url], transport)
    await gone.stop()
    await also_gone.stop()  # connection refused: provably nothing sent
    answer = await client.post(router.url + URL, json=CHAT)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-promptedge-replica"] == alive.url
    assert alive.requests == 1
    assert await retries(client, router) == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["close_on_accept", "close_after_request", "partial_headers", "partial_body"])
async def test_a_replica_failing_after_the_connection_is_not_retried(
    transport, mode, raw_replicas, start_router, client
) -> None:
    replicas = await raw_replicas(3)
    router = await quiet_router(start_router, [r.url for r in replicas], transport)
    for replica in replicas:
        replica.mode = mode
    answer = await client.post(router.url + URL, json=CHAT)
    # The request may have reached the replica: it is not sent again anywhere else. (A replica
    # that closes on accept resets the request it never read, so the router probes its port
    # (router/forward/unread.py): those connects carry nothing, but count as connections here.)
    assert [r.connections > 0 for r in replicas].count(True) == 1, [r.connections for r in replicas]
    if mode != "close_on_accept":
        assert sum(r.connections for r in replicas) == 1, [r.connections for r in replicas]
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "replica_error")
    assert await retries(client, router) == 0
    assert [r.inflight for r in router.app.state.router.pools.all()] == [0, 0, 0]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_stream_broken_mid_body_is_not_retried(transport, raw_replicas, start_router, client) -> None:
    replicas = await raw_replicas(3)
    router = await quiet_router(start_router, [r.url for r in replicas], transport)
    for replica in replicas:
        replica.mode = "partial_body"
    answer = await client.post(router.url + URL, json={**CHAT, "stream": True})
    assert sum(r.connections for r in replicas) == 1
    events = sse_data(answer.text)
    # the headers went out before the break: one error event, then [DONE]
    assert answer.status_code == 200 and events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "replica_error")


async def retries(client: httpx.AsyncClient, router) -> float:
    """The router's retries so far (``promptedge_router_retries_total``, 0 before the first)."""
    text = (await client.get(router.url + "/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("promptedge_router_retries_total{")
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_keep_alive_connection_the_replica_closed_while_idle_is_not_used(
    transport, start_router, client
) -> None:
    # The replica closes idle connections sooner than the router expires them (0.3 s < 2 s):
    # the transports see the close while the connection sits in the pool and open a new one,
    # so the next request is neither lost nor a 502.
    replica = await RawReplica(idle_close_s=0.3).start()
    try:
        router = await quiet_router(start_router, [replica.url], transport)
        answers = []
        for i in range(3):
            answers.append(await client.post(router.url + URL, json={**CHAT, "temperature": 0.1 * i}))
            await asyncio.sleep(0.6)
        assert [a.status_code for a in answers] == [200] * 3
        assert replica.requests == 3 and replica.idle_closes >= 2
    finally:
        await replica.stop()


async def _work_seen(client: httpx.AsyncClient, url: str) -> float:
    """Requests running or waiting on a sim replica, plus the prompt tokens it ever prefilled
    (0 for a replica that never saw a request)."""
    text = (await client.get(url + "/metrics")).text
    signals = parse_metrics(text.encode())
    prefilled = sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total")
    )
    return (signals.running or 0) + (signals.waiting or 0) + prefilled


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_replica_killed_mid_generation_is_not_answered_by_another(
    transport, stream, start_router, client
) -> None:
    ports = [free_port(), free_port()]
    procs = [start_sim(port) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url in urls:
            await wait_healthy(client, url)
        router = await start_router(urls, upstream_transport=transport)
        body = {**CHAT, "max_tokens": 2000, "stream": stream}  # ~20 s of generation

        async def kill_the_one_generating() -> int:
            while True:
                for i, url in enumerate(urls):
                    if procs[i].poll() is None and await _work_seen(client, url) > 0:
                        os.kill(procs[i].pid, signal.SIGKILL)
                        procs[i].wait()
                        return i
                await asyncio.sleep(0.05)

        killer = asyncio.create_task(kill_the_one_generating())
        answer = await client.post(router.url + URL, json=body, timeout=60)
        victim = await asyncio.wait_for(killer, 30)
        survivor = urls[1 - victim]
        # the survivor never saw the request: nothing running, waiting or ever prefilled
        assert await _work_seen(client, survivor) == 0
        if stream:
            events = sse_data(answer.text)
            assert answer.status_code == 200 and events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
        else:
            assert answer.status_code == 502, answer.text
            error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "replica_error")
        assert urls[victim] in error["message"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
