"""Faults: a replica killed mid-stream, a hung replica, all replicas down, warming up, stale
metrics, a replica that vanishes between health probes (retried elsewhere)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import pytest

from router import ReplicaSpec, RouterSettings, create_app
from tests.router.conftest import CHAT, MODEL, Served, sse_data
from tests.router.sim_process import free_port, start_sim, wait_healthy


def served_by(responses: list[httpx.Response]) -> list[str]:
    return [r.headers.get("x-promptedge-replica", "") for r in responses]


@pytest.mark.slow
async def test_replica_killed_mid_stream_gives_a_clean_sse_error(start_router, client) -> None:
    port = free_port()
    proc = start_sim(port)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_healthy(client, url)
        router = await start_router([url])
        body = {**CHAT, "stream": True, "max_tokens": 2000}  # ~20 s of generation
        text = ""
        async with client.stream("POST", router.url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_text():
                text += chunk
                if proc.poll() is None and '"content":"' in text.replace(" ", "") and text.count("data:") >= 2:
                    os.kill(proc.pid, signal.SIGKILL)
        events = sse_data(text)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "upstream_error" and url in error["message"]
        assert all("error" not in json.loads(e) for e in events[:-2])
        assert [r.inflight for r in router.app.state.router.pools.all()] == [0]
        assert [r.prefill_tokens for r in router.app.state.router.pools.all()] == [0]
        # The broken answer was not cached: the same request is not a hit.
        retry = await client.post(router.url + "/v1/chat/completions", json={**body, "stream": False})
        assert retry.headers.get("x-cache") != "hit"
    finally:
        proc.kill()
        proc.wait()


async def test_hung_replica_times_out_and_others_are_unaffected(start_replica, start_router, client) -> None:
    hung = await start_replica(hang=True)
    healthy = await start_replica()
    router = await start_router([hung.url, healthy.url], timeouts={"P1": {"ttfb_s": 0.5}})
    bodies = [{**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(8)]
    answers = await asyncio.gather(*(client.post(router.url + "/v1/chat/completions", json=b) for b in bodies))
    for answer in answers:
        if answer.status_code == 200:
            assert answer.headers["x-promptedge-replica"] == healthy.url
        else:
            assert answer.status_code == 504 and answer.json()["error"]["code"] == "replica_timeout"
    assert any(a.status_code == 200 for a in answers) and any(a.status_code == 504 for a in answers)
    # Timeouts are a deadline (the priority's TTFB, chosen by the client), not evidence of ill
    # health: the hung replica stays in the pool (its /health answers), nothing becomes a 503.
    later = await asyncio.gather(
        *(
            client.post(
                router.url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": f"s{i}"}]}
            )
            for i in range(6)
        )
    )
    assert {a.status_code for a in later} <= {200, 504}
    assert all(a.headers["x-promptedge-replica"] == healthy.url for a in later if a.status_code == 200)
    assert {r.url: r.health.circuit(0.0) for r in router.app.state.router.pools.all()} == {
        hung.url: "closed",
        healthy.url: "closed",
    }
    assert {r.url: r.inflight for r in router.app.state.router.pools.all()} == {hung.url: 0, healthy.url: 0}
    # The timed-out prompts never got a first byte: their pending prefill is released with them,
    # or the hung replica would look busy to dispatch forever (router/dispatch/choice.py).
    assert {r.url: r.prefill_tokens for r in router.app.state.router.pools.all()} == {hung.url: 0, healthy.url: 0}


async def test_all_replicas_down_is_503_and_health_degraded(start_router, client) -> None:
    router = await start_router([f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"])
    response = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    health = (await client.get(router.url + "/health")).json()
    assert health["status"] == "degraded" and health["pools"][MODEL]["ready"] == 0


async def test_warming_up_replica_gets_no_traffic(start_replica, start_router, client) -> None:
    warming = await start_replica(warmup_s=30)
    ready = await start_replica()
    router = await start_router([warming.url, ready.url])
    answers = [
        await client.post(
            router.url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": f"w{i}"}]}
        )
        for i in range(4)
    ]
    assert served_by(answers) == [ready.url] * 4
    models = (await client.get(router.url + "/v1/models")).json()["data"]
    assert models[0]["replicas"] == 2 and models[0]["ready"] == 1


async def test_stale_metrics_do_not_attract_a_pile_of_requests(start_replica, client, servers, redis_url) -> None:
    stale = await start_replica()
    fresh = await start_replica()
    # The stale replica's GPU exporter is unreachable, so its scrapes fail and its snapshot ages.
    specs = [
        ReplicaSpec(url=stale.url, model=MODEL, gpu_metrics_url=f"http://127.0.0.1:{free_port()}/metrics"),
        ReplicaSpec(url=fresh.url, model=MODEL),
    ]
    settings = RouterSettings(replicas=specs, redis_url=redis_url, scrape_interval_s=0.05, stale_after_s=0.2)
    router = await Served(create_app(settings)).start()
    servers.append(router)
    await asyncio.sleep(0.3)
    bodies = [{**CHAT, "max_tokens": 60, "messages": [{"role": "user", "content": f"p{i}"}]} for i in range(10)]
    answers = await asyncio.gather(*(client.post(router.url + "/v1/chat/completions", json=b) for b in bodies))
    share = served_by(answers).count(stale.url)
    # the bug was a pile: a frozen, idle-looking snapshot drew (nearly) every request. Distrusted,
    # the stale replica is scored on the router's own open requests and stays in use. The split
    # is not exactly even: the default dispatch (predicted TTFT) weighs each replica's learned
    # step and prefill times, which on a loaded CI machine differ between two identical
    # simulated replicas (2 of 10 was seen once)
    assert 1 <= share <= 7


async def test_replica_gone_between_probes_is_retried_on_another(start_replica, start_router, client) -> None:
    doomed = await start_replica()
    survivor = await start_replica()
    router = await start_router([doomed.url, survivor.url], health_interval_s=60)
    await doomed.stop()  # the router's probes have not noticed yet
    answers = [
        await client.post(
            router.url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": f"g{i}"}]}
        )
        for i in range(4)
    ]
    assert [a.status_code for a in answers] == [200] * 4
    assert served_by(answers) == [survivor.url] * 4
    text = (await client.get(router.url + "/metrics")).text
    assert f'promptedge_router_retries_total{{pool="{MODEL}"}}' in text


async def test_a_replica_coming_and_going_is_logged(
    start_replica, start_router, client, caplog: pytest.LogCaptureFixture
) -> None:
    # Found in a README trial: a replica that went down or came back showed only in /health,
    # nothing in the router's log.
    caplog.set_level("INFO", logger="router.scraper")  # up is INFO, down WARNING
    replica = await start_replica()
    router = await start_router([replica.url], health_interval_s=0.05, health_fall=1)

    async def ready() -> int:
        return (await client.get(router.url + "/health")).json()["pools"][MODEL]["ready"]

    for _ in range(200):
        if await ready() == 1:
            break
        await asyncio.sleep(0.05)
    await replica.stop()
    for _ in range(200):
        if await ready() == 0:
            break
        await asyncio.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if r.name == "router.scraper"]
    assert f"replica {replica.url} of pool {MODEL} is up (/health answered 200)" in lines
    assert any(line.startswith(f"replica {replica.url} of pool {MODEL} is down (/health failed: ") for line in lines), (
        lines
    )
