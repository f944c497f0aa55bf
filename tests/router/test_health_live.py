"""Replica health judged on the replica's behaviour, not on a client's (docs/architecture.md): real sim
replicas with faults set at run time (``POST /sim/faults``) behind a real router.

Issue 13, finding 6: three 500s closed a one-replica pool for 5 s, and 48 slow P2 requests
(their short time-to-first-byte timed out) made 28 of 71 normal P1 requests fail with 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter

from tests.router.conftest import CHAT, FAST

URL = "/v1/chat/completions"


def hold_circuits_open(router, seconds: float = 60.0) -> None:
    """Keep an opened circuit open for ``seconds`` rather than 5 s, so that what a test sends
    after it opened does not meet the half-open trial on a slow, loaded machine."""
    for replica in router.app.state.router.pools.all():
        replica.health.config = dataclasses.replace(replica.health.config, open_s=seconds)


def ask(i: int, **fields) -> dict:
    return {**CHAT, "messages": [{"role": "user", "content": f"question {i}"}], **fields}


async def _ttft_samples(client, url: str, headers: dict[str, str]) -> None:  # noqa: ANN001
    """44 short streamed requests round robin: >= min_samples (20) TTFT samples on each of two replicas."""
    for i in range(44):
        answer = await client.post(url, json=ask(i, stream=True, max_tokens=1), headers=headers)
        assert answer.status_code == 200


async def test_server_errors_do_not_close_a_one_replica_pool(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    hold_circuits_open(router)
    await client.post(replica.url + "/sim/faults", json={"fail_rate": 1.0})
    failed = [await client.post(router.url + URL, json=ask(i)) for i in range(3)]
    assert [a.status_code for a in failed] == [502] * 3
    assert {a.json()["error"]["code"] for a in failed} == {"replica_error"}
    await client.post(replica.url + "/sim/faults", json={"fail_rate": 0.0})
    answer = await client.post(router.url + URL, json=ask(3))
    assert answer.status_code == 200, answer.text  # was 503 no_replica for 5 s

    # Even a rate of errors that opens the circuit leaves the pool's last replica in use while
    # it answers: a 502 from the replica, never a 503 for everyone.
    await client.post(replica.url + "/sim/faults", json={"fail_rate": 1.0})
    failed = [await client.post(router.url + URL, json=ask(10 + i)) for i in range(12)]
    assert [a.status_code for a in failed] == [502] * 12
    assert router.app.state.router.pools.all()[0].health.circuit(time.monotonic()) == "open"
    await client.post(replica.url + "/sim/faults", json={"fail_rate": 0.0})
    answer = await client.post(router.url + URL, json=ask(30))
    assert answer.status_code == 200, answer.text


async def test_a_replica_failing_at_a_rate_is_ejected_while_another_serves(start_replica, start_router, client) -> None:
    bad = await start_replica()
    good = await start_replica()
    router = await start_router([bad.url, good.url])
    hold_circuits_open(router)
    await client.post(bad.url + "/sim/faults", json={"fail_rate": 1.0})
    statuses = Counter()
    for i in range(30):
        statuses[(await client.post(router.url + URL, json=ask(i))).status_code] += 1
    assert statuses[502] >= 10  # the evidence: a rate over at least 10 answers
    later = [await client.post(router.url + URL, json=ask(100 + i)) for i in range(6)]
    assert [a.status_code for a in later] == [200] * 6
    assert {a.headers["x-promptedge-replica"] for a in later} == {good.url}


async def test_slow_low_priority_requests_do_not_open_the_circuit_for_everyone(
    start_replica, start_router, client
) -> None:
    # Room for every request in the batch, so nothing queues and no request is shed: only
    # health decides who is served.
    roomy = dataclasses.replace(FAST, max_num_seqs=128, max_num_batched_tokens=8192, kv_capacity_tokens=200_000)
    replicas = [await start_replica(roomy), await start_replica(roomy)]
    # P2's time to first byte is short; a non-stream request's first byte comes after its
    # whole generation (300 tokens x 5 ms = 1.5 s), so every P2 request here times out.
    # Connect timeouts are generous: everything here shares one event loop on a loaded 2-core
    # machine, and a loopback connect that waits over 1 s for the loop is a connect failure.
    # No shedding either: in one full test run (Dec 4) 24 of the 72 P1 requests were shed (429
    # pool_saturated), so both replicas' scrapes showed at least twice the queue limit (4)
    # waiting. Likely the sims' engine loops lagging behind the 48 arrivals on the shared event
    # loop; not reproduced alone (3 runs) nor beside 3 or 6 busy loops (3 runs). Shedding is
    # admission, not health, which is what this test is about.
    router = await start_router(
        [r.url for r in replicas],
        timeouts={"P1": {"connect_s": 10.0}, "P2": {"ttfb_s": 0.2, "connect_s": 10.0}},
        queue_limit=10_000,
    )
    slow = [
        asyncio.create_task(client.post(router.url + URL, json=ask(i, max_tokens=300), headers={"x-priority": "P2"}))
        for i in range(48)
    ]
    normal: list[int] = []
    for batch in range(18):
        answers = await asyncio.gather(
            *(client.post(router.url + URL, json=ask(1000 + 4 * batch + j)) for j in range(4))
        )
        normal += [a.status_code for a in answers]
    p2 = Counter(a.status_code for a in await asyncio.gather(*slow))
    assert Counter(normal) == Counter({200: 72}), Counter(normal)
    assert p2[504] > 0 and set(p2) <= {200, 504}, p2


async def test_a_long_prompt_does_not_eject_a_healthy_replica(start_replica, start_router, client) -> None:
    # Regression A9: one client's long prompt (~2.5 s prefill, max_tokens 1) made the TTFT
    # p99 of a healthy replica exceed 2 s and ejected it for 10 s (/health: ready 1 of 2).
    slow_prefill = dataclasses.replace(
        FAST, max_model_len=12000, kv_capacity_tokens=24000, max_num_batched_tokens=8192, prefill_s_per_token=0.0005
    )
    replicas = [await start_replica(profile=slow_prefill) for _ in range(2)]
    router = await start_router([r.url for r in replicas], policy="round_robin")
    url = router.url + URL
    fresh = {"cache-control": "no-cache, no-store"}
    await _ttft_samples(client, url, fresh)
    long_prompt = "lorem " * 5000  # ~5000 tokens: ~2.5 s of prefill
    answer = await client.post(
        url,
        json=ask(0, stream=True, max_tokens=1, messages=[{"role": "user", "content": long_prompt}]),
        headers=fresh,
        timeout=30,
    )
    assert answer.status_code == 200
    health = (await client.get(router.url + "/health")).json()
    assert health["pools"][CHAT["model"]]["ready"] == 2, health


async def test_a_client_uploading_its_body_slowly_does_not_eject_a_healthy_replica(
    start_replica, start_router, client
) -> None:
    # Regression (attack, Dec 2): the TTFT sample ran from the start of the request, before its
    # body was read, so one client trickling its body for 2.5 s ejected a healthy replica for
    # 10 s (/health: ready 1 of 2). The replica's TTFT runs from when the request was forwarded.
    replicas = [await start_replica() for _ in range(2)]
    router = await start_router([r.url for r in replicas], policy="round_robin")
    url = router.url + URL
    fresh = {"cache-control": "no-cache, no-store"}
    await _ttft_samples(client, url, fresh)
    body = json.dumps(ask(99, stream=True, max_tokens=1)).encode()

    async def trickle():  # type: ignore[no-untyped-def]
        for part in (body[:10], body[10:20], body[20:]):
            yield part
            await asyncio.sleep(1.25)

    for _ in range(2):  # one slow upload on each replica (round robin)
        answer = await client.post(
            url, content=trickle(), headers={**fresh, "content-type": "application/json"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
    health = (await client.get(router.url + "/health")).json()
    assert health["pools"][CHAT["model"]]["ready"] == 2, health
