"""Token buckets for requests that got no whole answer.

Admission charges a key's token bucket the prompt estimate + ``max_tokens`` before the request
is sent; the replica's reported usage settles it afterwards. A request that ended without that
usage used to stay charged in full, also when no replica generated anything for it (no
replica, shed, a replica's 4xx) or when its replica broke off: during an incident every retry
of a client spent its whole budget, and the retries were then refused as rate-limited. Those
now give back what was not generated; a request a replica may have generated for, which the
client left or let time out, stays charged (the attack round of Dec 4 showed a refund there
let a client generate without limit by leaving each request early)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal

import httpx
import pytest

from tests.router.conftest import CHAT
from tests.router.raw_replica import RawReplica
from tests.router.sim_process import free_port, start_sim, wait_healthy

MAX_TOKENS = 2000  # the sim streams them for ~20 s: plenty of time to kill it mid-stream
# a bucket a little over one request's charge (prompt estimate + MAX_TOKENS): unsettled, a
# second charge of the same size waits about a minute for the refill
BUDGET = {"*": {"tokens_per_min": MAX_TOKENS + 100}}


async def _charge_fits_now(router, tokens: int) -> bool:
    """Whether the anonymous key's bucket admits ``tokens`` now (and takes them)."""
    wait, _ = await router.app.state.router.limiter.admit("", tokens)
    return wait == 0


@pytest.mark.slow
async def test_a_stream_cut_by_a_killed_replica_is_charged_what_was_streamed(start_router, client, caplog) -> None:
    port = free_port()
    proc = start_sim(port)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_healthy(client, url)
        router = await start_router([url], rate_limits=BUDGET)
        body = {**CHAT, "stream": True, "max_tokens": MAX_TOKENS}
        text = ""
        with caplog.at_level(logging.INFO, logger="router.access"):
            async with client.stream("POST", router.url + "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                async for chunk in response.aiter_text():
                    text += chunk
                    if proc.poll() is None and text.count('"content":') >= 5:
                        os.kill(proc.pid, signal.SIGKILL)
            for _ in range(100):  # accounted for once the stream's clean-up ran
                lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "router.access"]
                if lines:
                    break
                await asyncio.sleep(0.05)
        streamed = text.count('"content":')
        assert 5 <= streamed < MAX_TOKENS
        assert '"error"' in text  # the cut was real: the client got the clean error event
        # the log line and the traffic counters say what was streamed, not 0
        assert 5 <= lines[0]["completion_tokens"] <= streamed + 2
        charge = lines[0]["prompt_tokens"] + MAX_TOKENS
        # what was not generated went back: a second request of the same size fits at once
        assert await _charge_fits_now(router, charge)
    finally:
        proc.kill()
        proc.wait()


async def test_requests_no_replica_answered_spend_no_tokens(start_router, client) -> None:
    # the pool's only replica is a closed port: every request is 503 no_replica; unsettled,
    # the second one was refused 429 rate_limited for tokens nothing generated
    router = await start_router(["http://127.0.0.1:9"], rate_limits=BUDGET)
    body = {**CHAT, "max_tokens": MAX_TOKENS}
    for _ in range(3):
        answer = await client.post(router.url + "/v1/chat/completions", json=body)
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "no_replica", answer.text


async def test_a_replicas_4xx_spends_no_tokens(start_router, client) -> None:
    replica = await RawReplica().start()
    replica.status = b"400 Bad Request"
    replica.answer = json.dumps(
        {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError", "param": None, "code": 400}
    ).encode()
    try:
        router = await start_router([replica.url], rate_limits=BUDGET)
        body = {**CHAT, "max_tokens": MAX_TOKENS}
        for _ in range(3):
            answer = await client.post(router.url + "/v1/chat/completions", json=body)
            assert answer.status_code == 400, answer.text
        assert replica.requests == 3
    finally:
        await replica.stop()


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_while_its_replica_generates_stays_charged(
    start_router, client, stream: bool
) -> None:
    # attack round (Dec 4): a client that dropped each non-stream request after 12 s got the
    # whole charge back (499) while the replica generated: 5 requests of 2,000 tokens passed
    # a 2,100-a-minute limit in 63 s
    port = free_port()
    proc = start_sim(port)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_healthy(client, url)
        router = await start_router([url], rate_limits=BUDGET)
        body = {**CHAT, "max_tokens": MAX_TOKENS, "stream": stream}
        async with httpx.AsyncClient(timeout=60) as leaving:

            async def ask() -> None:
                async with leaving.stream("POST", router.url + "/v1/chat/completions", json=body) as response:
                    async for _ in response.aiter_bytes():
                        pass

            task = asyncio.create_task(ask())
            await asyncio.sleep(3.0)  # the replica is generating (~20 s for all of it)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        state = router.app.state.router
        for _ in range(100):  # the router notices the disconnect and ends the request
            if [r.inflight for r in state.pools.all()] == [0]:
                break
            await asyncio.sleep(0.05)
        assert [r.inflight for r in state.pools.all()] == [0]
        await asyncio.sleep(0.3)  # and would have settled by now
        assert not await _charge_fits_now(router, MAX_TOKENS)
    finally:
        proc.kill()
        proc.wait()


async def test_an_admission_that_failed_open_took_nothing_to_give_back(redis_url: str) -> None:
    # attack round (Dec 4): with Redis stalled at admission (failed open, nothing taken) the
    # request was still recorded as charged, and its refund then filled the bucket
    import redis.asyncio as aioredis

    from router.forward.ratelimit import RateLimiter
    from router.settings import RateLimit

    down = aioredis.from_url("redis://127.0.0.1:9/0", socket_connect_timeout=0.5)
    try:
        assert await RateLimiter(down, {"*": RateLimit(tokens_per_min=100)}).admit("", 50) == (0.0, 0)
    finally:
        await down.aclose()
    up = aioredis.from_url(redis_url)
    try:
        limiter = RateLimiter(up, {"*": RateLimit(tokens_per_min=100)})
        assert await limiter.admit("", 60) == (0.0, 60)
        wait, taken = await limiter.admit("", 60)
        assert wait > 0 and taken == 0  # refused: nothing taken either
        assert await RateLimiter(up, {"other": RateLimit(requests_per_s=1.0)}).admit("other", 60) == (0.0, 0)
    finally:
        await up.flushdb()
        await up.aclose()
