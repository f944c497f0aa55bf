"""The router through its HTTP API: cache, stream relay and replay, bad input, faults, counters."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from tests.router.conftest import CHAT, MODEL, cache_entries, sse_data


async def test_miss_then_exact_hit_with_openai_defaults_filled_in(
    start_replica, start_router, client, redis_url
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    first = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert first.status_code == 200
    assert first.headers["x-cache"] == "miss"
    assert first.headers["x-promptedge-replica"] == replica.url
    assert first.json()["object"] == "chat.completion"
    await cache_entries(redis_url, 1)
    # temperature 1.0 is the OpenAI default: the same request as one without it.
    second = await client.post(router.url + "/v1/chat/completions", json={**CHAT, "temperature": 1.0})
    assert second.headers["x-cache"] == "exact"
    assert second.json()["choices"] == first.json()["choices"]
    other = await client.post(router.url + "/v1/chat/completions", json={**CHAT, "temperature": 0.2})
    assert other.headers["x-cache"] == "miss"
    stats = (await client.get(router.url + "/cache/stats")).json()
    assert (stats["requests"], stats["exact_hits"], stats["misses"]) == (3, 1, 2)
    assert stats["per_model"][MODEL]["exact_hits"] == 1


async def test_completions_endpoint_and_cache_control(start_replica, start_router, client, redis_url) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    body = {"model": MODEL, "prompt": "Say hi", "max_tokens": 5}
    first = await client.post(router.url + "/v1/completions", json=body, headers={"cache-control": "no-store"})
    assert first.status_code == 200 and first.json()["object"] == "text_completion"
    assert len(first.json()["choices"][0]["text"].split()) == 5
    second = await client.post(router.url + "/v1/completions", json=body)
    assert second.headers["x-cache"] == "miss"  # the first was not stored
    await cache_entries(redis_url, 1)
    third = await client.post(router.url + "/v1/completions", json=body)
    assert third.headers["x-cache"] == "exact"
    fourth = await client.post(router.url + "/v1/completions", json=body, headers={"cache-control": "no-cache"})
    assert fourth.headers["x-cache"] == "miss"


async def test_stream_is_relayed_then_replayed_from_the_cache(start_replica, start_router, client, redis_url) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    relayed = await client.post(router.url + "/v1/chat/completions", json=body)
    assert relayed.headers["x-cache"] == "miss"
    assert relayed.headers["content-type"].startswith("text/event-stream")
    events = sse_data(relayed.text)
    assert events[-1] == "[DONE]"
    relayed_text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1] if json.loads(e)["choices"]
    )
    assert len(relayed_text.split()) == 8
    await cache_entries(redis_url, 1)  # the assembled stream is stored when the response has ended

    replayed = await client.post(router.url + "/v1/chat/completions", json=body)
    assert replayed.headers["x-cache"] == "exact"
    chunks = [json.loads(e) for e in sse_data(replayed.text)[:-1]]
    assert sse_data(replayed.text)[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == relayed_text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    # The assembled stream is the non-stream answer too.
    plain = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert plain.headers["x-cache"] == "exact"
    assert plain.json()["choices"][0]["message"]["content"] == relayed_text


async def test_bad_input_gets_openai_error_json_naming_the_field(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    url = router.url + "/v1/chat/completions"
    cases = [
        (b"{not json", 400, None),
        (json.dumps({"model": MODEL}).encode(), 400, "messages"),
        (json.dumps({**CHAT, "temperature": "hot"}).encode(), 400, "temperature"),
        (json.dumps({**CHAT, "messages": [{"role": "user", "content": 5}]}).encode(), 400, "messages.0.content"),
        (json.dumps({**CHAT, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({**CHAT, "model": "no-such-model"}).encode(), 404, "model"),
    ]
    for raw, status, param in cases:
        response = await client.post(url, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == status, raw
        error = response.json()["error"]
        assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"
    missing_prompt = await client.post(router.url + "/v1/completions", json={"model": MODEL})
    assert missing_prompt.status_code == 400 and missing_prompt.json()["error"]["param"] == "prompt"
    unknown = await client.post(router.url + "/v1/audio/speech", json={"model": MODEL, "input": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == {
        "message": "Invalid URL (POST /v1/audio/speech)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    wrong_method = await client.get(url)
    assert wrong_method.status_code == 405 and "POST" in wrong_method.headers["allow"]
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    stats = (await client.get(router.url + "/cache/stats")).json()
    assert stats["requests"] == 0  # refused requests never reach the cache


async def test_replica_error_is_502_and_never_cached(start_replica, start_router, client) -> None:
    replica = await start_replica(fail_rate=1.0)
    router = await start_router([replica.url])
    own = (await client.post(replica.url + "/v1/chat/completions", json=CHAT)).text
    for _ in range(2):
        response = await client.post(router.url + "/v1/chat/completions", json=CHAT)
        assert response.status_code == 502
        assert response.json()["error"]["type"] == "upstream_error"
        # the replica's own error body stays in the router's log (it can hold internals)
        assert own[:40] not in response.text and response.headers["x-request-id"] in response.text
    await client.post(replica.url + "/sim/faults", json={"fail_rate": 0.0})
    response = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 200 and response.headers["x-cache"] == "miss"


async def test_redis_down_serves_uncached_and_health_is_degraded(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], redis_url="redis://127.0.0.1:1/0")
    for _ in range(2):
        response = await client.post(router.url + "/v1/chat/completions", json=CHAT)
        assert response.status_code == 200 and response.headers["x-cache"] == "miss"
    health = await client.get(router.url + "/health")
    assert health.status_code == 200
    assert health.json()["status"] == "degraded" and health.json()["redis"] is False
    assert (await client.get(router.url + "/cache/stats")).status_code == 503


async def test_health_models_and_metrics(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    health = (await client.get(router.url + "/health")).json()
    assert health["status"] == "ok" and health["pools"][MODEL] == {"replicas": 1, "ready": 1}
    models = (await client.get(router.url + "/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    await client.post(router.url + "/v1/chat/completions", json=CHAT)
    text = (await client.get(router.url + "/metrics")).text
    series = f'promptedge_router_requests_total{{cache="miss",pool="{MODEL}",replica="{replica.url}",status="200"}}'
    assert f"{series} 1.0" in text
    assert "promptedge_router_scrape_age_seconds" in text


async def test_traffic_counters_per_minute_in_redis(start_replica, start_router, client, redis_url) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    await client.post(router.url + "/v1/chat/completions", json=CHAT)
    await cache_entries(redis_url, 1)
    for _ in range(2):
        await client.post(router.url + "/v1/chat/completions", json=CHAT)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    totals: dict[str, int] = {}
    for _ in range(200):  # flushed every 50 ms in tests
        totals = {}
        for key in r.keys(f"promptedge:traffic:{MODEL}:*"):
            for name, value in r.hgetall(key).items():
                minute, kind = name.split(":")
                assert int(key.rsplit(":", 1)[1]) == int(minute) // 1440
                totals[kind] = totals.get(kind, 0) + int(value)
        if totals.get("requests") == 3 and "completion_tokens" in totals:
            break
        await asyncio.sleep(0.01)
    assert r.smembers("promptedge:traffic:models") == {MODEL}
    assert totals["requests"] == 3 and totals["misses"] == 1
    assert totals["completion_tokens"] == 3 * 8 and totals["prompt_tokens"] > 0
    assert all(14 * 86400 < r.ttl(key) <= 15 * 86400 for key in r.keys(f"promptedge:traffic:{MODEL}:*"))


async def test_the_cache_is_bounded_by_its_own_timeout_not_the_routers(
    start_replica, start_router, client, redis_url, monkeypatch
) -> None:
    # Regression: the exact cache's client connected within the router's redis_timeout_s (0.25 s),
    # not the cache's own bound; under a burst at start-up a new connection took longer, the cache
    # was marked down for 1 s and the demo e2e test counted 91 of 125 requests in CI.
    # The semantic stage still shares the router's client (a failed semantic store marks the
    # cache down for 1 s): exact only here.
    monkeypatch.setenv("PROMPTEDGE_CACHE_SEMANTIC_ENABLED", "false")
    replica = await start_replica()
    router = await start_router([replica.url], redis_timeout_s=1e-6)  # no router-level connect succeeds
    first = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)
    second = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert second.status_code == 200 and second.headers["x-cache"] == "exact"


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/", "/v1/models/"])
async def test_a_trailing_slash_is_an_openai_404_not_a_redirect_to_the_host_header(
    path, start_replica, start_router, client
) -> None:
    # Regression (attack, Dec 2): Starlette's redirect_slashes answered 307 Location: http://evil.example/...
    replica = await start_replica()
    router = await start_router([replica.url])
    response = await client.post(router.url + path, json=CHAT, headers={"host": "evil.example"})
    assert response.status_code in (404, 405) and "location" not in response.headers
    assert "error" in response.json()


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
async def test_the_router_does_not_publish_its_schema(path, start_replica, start_router, client) -> None:
    # An edge router answering the public internet need not list its admin routes to anyone.
    router = await start_router([(await start_replica()).url])
    response = await client.get(router.url + path)
    assert response.status_code == 404 and response.json()["error"]["type"] == "invalid_request_error"


async def test_an_unexpected_error_is_a_counted_500_with_the_request_id(
    start_replica, start_router, client, monkeypatch
) -> None:
    # Left from the third attack round: an exception outside APIError skipped the accounting, so
    # the 500 had no X-Request-ID to find its log line by and no access-log line at all.
    import router.forward.service

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals")

    router_ = await start_router([(await start_replica()).url])
    monkeypatch.setattr(router.forward.service, "_handle", broken)
    response = await client.post(
        router_.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "trace-me-42"}
    )
    assert response.status_code == 500 and response.headers.get("x-request-id") == "trace-me-42"
    assert response.json()["error"]["code"] == "internal_error" and "secret" not in response.text
    metrics = (await client.get(router_.url + "/metrics")).text
    assert any(
        'status="500"' in line for line in metrics.splitlines() if line.startswith("promptedge_router_requests_total")
    )
