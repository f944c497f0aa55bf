"""The router's use of the semantic cache over HTTP: hit headers, stream replay of a semantic
hit, tenants from API keys, per-request threshold/TTL headers, DELETE /cache, cache metrics."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.router.conftest import MODEL, sse_data

pytestmark = pytest.mark.slow

QUESTION = "How do I turn on the lights in the kitchen?"
PARAPHRASE = "How can I turn on the kitchen lights?"


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


async def post_until_stored(client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None) -> None:
    """Send a miss and wait until the router has stored it (it stores after responding)."""
    first = await client.post(url, json=body, headers=headers)
    assert first.headers["x-cache"] == "miss"
    for _ in range(100):
        again = await client.post(url, json=body, headers={**(headers or {}), "cache-control": "no-store"})
        if again.headers["x-cache"] == "exact":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the miss was never stored")


async def test_semantic_hit_headers_and_stream_replay(start_replica, start_router, client) -> None:
    # clients without a key share semantic answers only when the operator allows it
    router = await start_router([(await start_replica()).url], anonymous_cache="semantic", admin_key="key-admin")
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION))
    hit = await client.post(url, json=chat(PARAPHRASE))
    assert hit.headers["x-cache"] == "semantic"
    assert 0.96 <= float(hit.headers["x-cache-similarity"]) <= 1.0
    streamed = await client.post(url, json=chat(PARAPHRASE, stream=True, stream_options={"include_usage": True}))
    assert streamed.headers["x-cache"] == "semantic"
    events = sse_data(streamed.text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(chunks) > 2  # chunks, not one blob
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == hit.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    strict = await client.post(url, json=chat(PARAPHRASE), headers={"x-cache-threshold": "1"})
    assert strict.headers["x-cache"] == "miss"
    stats = (await client.get(router.url + "/cache/stats", headers={"authorization": "Bearer key-admin"})).json()
    assert stats["semantic_hits"] == 2 and stats["per_tenant"]["default"]["semantic_hits"] == 2
    metrics = (await client.get(router.url + "/metrics")).text
    assert 'promptedge_cache_lookups_total{model="sim-llama-8b",outcome="semantic",tenant="default"} 2.0' in metrics


async def test_api_keys_are_tenants_that_never_share(start_replica, start_router, client) -> None:
    router = await start_router([(await start_replica()).url], api_keys={"key-a1": "acme", "key-a2": "acme"})
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION), {"authorization": "Bearer key-a1"})
    same_tenant = await client.post(url, json=chat(PARAPHRASE), headers={"authorization": "Bearer key-a2"})
    assert same_tenant.headers["x-cache"] == "semantic"
    for other in ({"authorization": "Bearer key-b"}, {}):  # unlisted key, no key: tenant "default"
        response = await client.post(url, json=chat(QUESTION), headers={**other, "cache-control": "no-store"})
        assert response.headers["x-cache"] == "miss"


async def test_unlisted_api_keys_are_separate_tenants(start_replica, start_router, client) -> None:
    # Regression: every unlisted key used to share the tenant "default", so one customer's
    # answer could reach another customer whose key was simply not in the mapping.
    router = await start_router([(await start_replica()).url])
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION), {"authorization": "Bearer key-x"})
    other = await client.post(
        url, json=chat(QUESTION), headers={"authorization": "Bearer key-y", "cache-control": "no-store"}
    )
    assert other.headers["x-cache"] == "miss"
    again = await client.post(url, json=chat(QUESTION), headers={"authorization": "Bearer key-x"})
    assert again.headers["x-cache"] == "exact"


async def test_ttl_header_bounds_the_entry(start_replica, start_router, client) -> None:
    router = await start_router([(await start_replica()).url])
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION), {"x-cache-ttl": "1"})
    await asyncio.sleep(1.2)
    assert (await client.post(url, json=chat(PARAPHRASE), headers={"cache-control": "no-store"})).headers[
        "x-cache"
    ] == "miss"


async def test_delete_cache_needs_the_admin_key(start_replica, start_router, client) -> None:
    replica = await start_replica()
    closed = await start_router([replica.url])
    assert (await client.delete(closed.url + "/cache", params={"tenant": "default"})).status_code == 403
    router = await start_router([replica.url], admin_key="s3cret", anonymous_cache="semantic")
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION))
    wrong = await client.delete(
        router.url + "/cache", params={"tenant": "default"}, headers={"authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    admin = {"authorization": "Bearer s3cret"}
    unfiltered = await client.delete(router.url + "/cache", headers=admin)
    assert unfiltered.status_code == 400 and unfiltered.json()["error"]["param"] == "tenant"
    deleted = await client.delete(router.url + "/cache", params={"tenant": "default", "model": MODEL}, headers=admin)
    assert deleted.status_code == 200 and deleted.json()["deleted"] == {"exact": 1, "semantic": 1}
    for text in (QUESTION, PARAPHRASE):
        response = await client.post(url, json=chat(text), headers={"cache-control": "no-store"})
        assert response.headers["x-cache"] == "miss"


async def test_embedding_model_failure_degrades_health_but_exact_cache_serves(
    start_replica, start_router, client, monkeypatch
) -> None:
    monkeypatch.setenv("PROMPTEDGE_CACHE_EMBEDDING_MODEL", "/nonexistent/model")
    router = await start_router([(await start_replica()).url])
    health = (await client.get(router.url + "/health")).json()
    assert health["status"] == "degraded" and health["cache"] is False and health["semantic"] == "failed"
    # A fresh user read `"cache": false` alone as "the cache is down": /health says why, and the
    # reason names the setting's value, as the log line does.
    assert "/nonexistent/model" in health["semantic_error"], health
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION))
    assert (await client.post(url, json=chat(QUESTION))).headers["x-cache"] == "exact"
    assert (await client.post(url, json=chat(PARAPHRASE), headers={"cache-control": "no-store"})).headers[
        "x-cache"
    ] == "miss"


async def test_a_bad_query_parameter_is_an_openai_400_not_a_fastapi_422(start_replica, start_router, client) -> None:
    # Regression (issue 13, M1): DELETE /cache?all=maybe gave FastAPI's 422 {"detail": [...]}.
    replica = await start_replica()
    router = await start_router([replica.url], admin_key="s3cret")
    answer = await client.delete(
        router.url + "/cache", params={"all": "maybe"}, headers={"authorization": "Bearer s3cret"}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "error": {
            "message": answer.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": "all",
            "code": "invalid_value",
        }
    }
