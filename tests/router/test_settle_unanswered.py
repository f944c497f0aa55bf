"""A request that got no whole answer gives back the tokens admission took for it.

Admission charges a key's token bucket the prompt estimate + ``max_tokens`` before the request
is sent; the replica's reported usage settles it afterwards. A request that ends without that
usage (a replica killed mid-stream, a pool with no replica, a shed, a replica's 4xx) used to
stay charged in full: during an incident every retry of a client spent its whole budget for
tokens no replica generated, and the retries were then refused as rate-limited."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.router.conftest import CHAT, MODEL
from tests.router.raw_replica import RawReplica
from tests.router.test_faults import ROOT, free_port

MAX_TOKENS = 2000  # the sim streams them for ~20 s: plenty of time to kill it mid-stream
# a bucket a little over one request's charge (prompt estimate + MAX_TOKENS): unsettled, a
# second charge of the same size waits about a minute for the refill
BUDGET = {"*": {"tokens_per_min": MAX_TOKENS + 100}}


async def _charge_fits_now(router, tokens: int) -> bool:
    """Whether the anonymous key's bucket admits ``tokens`` now (and takes them)."""
    return await router.app.state.router.limiter.wait_s("", tokens) == 0


@pytest.mark.slow
async def test_a_stream_cut_by_a_killed_replica_is_charged_what_was_streamed(start_router, client, caplog) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sim", "serve", "--port", str(port), "--model", MODEL],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
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
    replica.answer = json.dumps({"object": "error", "message": "max_tokens is too large", "type": "BadRequestError",
                                 "param": None, "code": 400}).encode()
    try:
        router = await start_router([replica.url], rate_limits=BUDGET)
        body = {**CHAT, "max_tokens": MAX_TOKENS}
        for _ in range(3):
            answer = await client.post(router.url + "/v1/chat/completions", json=body)
            assert answer.status_code == 400, answer.text
        assert replica.requests == 3
    finally:
        await replica.stop()
