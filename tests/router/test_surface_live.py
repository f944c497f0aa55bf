"""The rest of the API surface through the real router in front of real sim replicas (issue 12,
deliverable 3): GET /v1/models/{id}, POST /v1/embeddings (exact cache), vLLM's /tokenize and
/detokenize (forwarded, never cached, not counted as demand)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from tests.router.conftest import MODEL, cache_entries

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("exact_only")]
SLASHED = "org/sim-embed-v1"


async def demand(redis_url: str, model: str) -> int:
    """Requests the router counted for the forecaster (promptedge:traffic:{model}:*)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        total = 0
        for key in await client.keys(f"promptedge:traffic:{model}:*"):
            fields = await client.hgetall(key)
            total += sum(int(v) for k, v in fields.items() if k.endswith(b":requests"))
        return total
    finally:
        await client.aclose()


async def test_models_by_id_with_slashes_and_an_openai_404(start_replica, start_router, client) -> None:
    replica = await start_replica(model=SLASHED)
    router = await start_router([replica.url], model=SLASHED)
    entry = await client.get(f"{router.url}/v1/models/{SLASHED}")
    assert entry.status_code == 200
    assert entry.json() == {
        "id": SLASHED,
        "object": "model",
        "created": 0,
        "owned_by": "promptedge",
        "replicas": 1,
        "ready": entry.json()["ready"],
    }
    missing = await client.get(f"{router.url}/v1/models/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"] | {"message": ""} == {
        "message": "",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


async def test_embeddings_are_exact_cached(start_replica, start_router, client, redis_url) -> None:
    # never semantic (cache/semantic/scope.py: tests/cache/test_semantic_scope.py)
    router = await start_router([(await start_replica()).url], anonymous_cache="semantic")
    url = router.url + "/v1/embeddings"
    body = {"model": MODEL, "input": ["How do I turn on the kitchen lights?", "second text"]}
    miss = await client.post(url, json=body)
    assert miss.status_code == 200 and miss.headers["x-cache"] == "miss"
    assert [d["index"] for d in miss.json()["data"]] == [0, 1] and miss.json()["usage"]["prompt_tokens"] > 0
    await cache_entries(redis_url, 1)
    hit = await client.post(url, json=body)
    assert hit.headers["x-cache"] == "exact" and hit.content == miss.content
    paraphrase = {"model": MODEL, "input": ["How can I turn on the kitchen lights?", "second text"]}
    other_format = {**body, "encoding_format": "base64"}
    for other in (paraphrase, other_format):
        assert (await client.post(url, json=other)).headers["x-cache"] == "miss"
    assert isinstance((await client.post(url, json=other_format)).json()["data"][0]["embedding"], str)
    for bad, param in (
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
    ):
        refused = await client.post(url, json=bad)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    unknown = await client.post(url, json={"model": "nope", "input": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    await asyncio.sleep(0.2)  # counters flush every 0.05 s
    assert await demand(redis_url, MODEL) == 5  # miss, hit, paraphrase, base64 twice (the 400s and 404 are not)


async def test_tokenize_and_detokenize_are_forwarded_never_cached_not_demand(
    start_replica, start_router, client, redis_url
) -> None:
    replicas = [await start_replica(), await start_replica()]
    router = await start_router([r.url for r in replicas])
    text = "héllo wörld, 你好"
    served_by = set()
    for _ in range(4):
        tokens = await client.post(router.url + "/tokenize", json={"model": MODEL, "prompt": text})
        assert tokens.status_code == 200 and tokens.headers["x-cache"] == "miss"
        served_by.add(tokens.headers["x-promptedge-replica"])
        assert tokens.json()["count"] == len(tokens.json()["tokens"]) == 4
    assert served_by == {r.url for r in replicas}  # the same dispatch as completions
    back = await client.post(router.url + "/detokenize", json={"model": MODEL, "tokens": tokens.json()["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}
    refused = await client.post(router.url + "/detokenize", json={"model": MODEL, "tokens": ["a"]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens.0"
    await asyncio.sleep(0.2)
    assert await demand(redis_url, MODEL) == 0
    metrics = (await client.get(router.url + "/metrics")).text
    assert (
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("promptedge_router_requests_total{") and 'status="200"' in line
        )
        == 5
    )


async def test_other_paths_are_refused_or_forwarded_by_the_setting(start_replica, start_router, client) -> None:
    replica = await start_replica()
    refusing = await start_router([replica.url])
    refused = await client.post(refusing.url + "/sim/faults", json={"fail_rate": 0})
    assert refused.status_code == 404 and refused.json()["error"]["message"] == "Invalid URL (POST /sim/faults)"
    forwarding = await start_router([replica.url], other_paths="forward")
    operator = await client.post(forwarding.url + "/sim/faults", json={"fail_rate": 0})  # not an OpenAI path
    assert operator.status_code == 404 and operator.json()["error"]["message"] == "Invalid URL (POST /sim/faults)"
    relayed = await client.get(forwarding.url + "/v1/files?limit=1")  # the replica's own 404, as it said
    assert relayed.status_code == 404 and relayed.headers["x-promptedge-replica"] == replica.url
    unknown = await client.get(forwarding.url + "/v1/files", headers={"x-model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert (await client.get(forwarding.url + "/health")).json()["status"] in ("ok", "degraded")  # still the router's
