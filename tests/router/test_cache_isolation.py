"""Issue 13, findings 3-5, through the real router on a real Redis: the cache never serves
another pool's, another client's or another request's answer, and unknown API keys do not
each become a metrics label or a stats series."""

from __future__ import annotations

import json
import os

import pytest
import redis.asyncio

from router import ReplicaSpec
from tests.router.conftest import MODEL, cache_entries
from tests.router.test_cache_api import chat, post_until_stored

pytestmark = pytest.mark.slow

URL = "/v1/chat/completions"

# vLLM's output-changing request fields that the key used to ignore (issue 13, finding 3),
# each with a value that changes the answer of a real vLLM.
VLLM_FIELDS = {
    "min_tokens": 4,
    "ignore_eos": True,
    "stop_token_ids": [2],
    "guided_choice": ["yes", "no"],
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "structured_outputs": {"choice": ["yes", "no"]},
    "chat_template_kwargs": {"enable_thinking": False},
    "include_stop_str_in_output": True,
    "bad_words": ["kitchen"],
    "allowed_token_ids": [1, 2, 3],
    "truncate_prompt_tokens": 5,
    "continue_final_message": True,
    "verbosity": "low",
}


async def test_x_model_answer_is_not_served_to_the_body_model(start_replica, start_router, client) -> None:
    # Regression (finding 3): body `sim-llama-8b` with `X-Model: small-model` was stored under
    # sim-llama-8b's key, and the next plain sim-llama-8b request got small-model's answer.
    big = await start_replica()
    small = await start_replica()  # a replica that answers whatever model name it is sent
    router = await start_router(
        [], specs=[ReplicaSpec(url=big.url, model=MODEL), ReplicaSpec(url=small.url, model="small-model")]
    )
    url = router.url + URL
    body = chat("What is a KV cache?")
    await post_until_stored(client, url, body, {"x-model": "small-model"})
    plain = await client.post(url, json=body, headers={"cache-control": "no-store"})
    assert plain.headers["x-cache"] == "miss"
    assert plain.headers["x-promptedge-replica"] == big.url
    again = await client.post(url, json=body, headers={"x-model": "small-model"})
    assert again.headers["x-cache"] == "exact"  # the pool's own answer is still cached for it
    stats = (await client.get(router.url + "/cache/stats")).json()
    assert set(stats["per_model"]) == {MODEL, "small-model"}  # counted under the pool that answers


async def test_vllm_output_fields_each_change_the_key(start_replica, start_router, client) -> None:
    router = await start_router([(await start_replica()).url])
    url = router.url + URL
    await post_until_stored(client, url, chat("How do I turn on the lights in the kitchen?"))
    served = {}
    for name, value in VLLM_FIELDS.items():
        response = await client.post(
            url,
            json=chat("How do I turn on the lights in the kitchen?", **{name: value}),
            headers={"cache-control": "no-store"},
        )
        assert response.status_code == 200, name
        served[name] = response.headers["x-cache"]
    assert served == {name: "miss" for name in VLLM_FIELDS}
    unknown = await client.post(
        url,
        json=chat("How do I turn on the lights in the kitchen?", x_new_field=1),
        headers={"cache-control": "no-store"},
    )
    assert unknown.headers["x-cache"] == "miss"
    # fields known not to change the answer still share it
    same = await client.post(
        url, json=chat("How do I turn on the lights in the kitchen?", user="alice", metadata={"k": "v"}, stream=False)
    )
    assert same.headers["x-cache"] == "exact"


async def test_a_semantic_hit_needs_every_non_text_field_equal(start_replica, start_router, client) -> None:
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"})
    url = router.url + URL
    acme = {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, chat("How do I turn on the lights in the kitchen?"), acme)
    other = await client.post(
        url,
        json=chat("How can I turn on the kitchen lights?", guided_choice=["on", "off"]),
        headers={**acme, "cache-control": "no-store"},
    )
    assert other.headers["x-cache"] == "miss"
    named = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "How can I turn on the kitchen lights?", "name": "bob"}],
    }
    assert (await client.post(url, json=named, headers={**acme, "cache-control": "no-store"})).headers[
        "x-cache"
    ] == "miss"
    same = await client.post(url, json=chat("How can I turn on the kitchen lights?"), headers=acme)
    assert same.headers["x-cache"] == "semantic"


async def test_a_request_threshold_cannot_go_below_the_floor(start_replica, start_router, client) -> None:
    # Regression (finding 4): `X-Cache-Threshold: 0` served an unrelated answer (similarity 0.15).
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"})
    url = router.url + URL
    acme = {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, chat("How do I bake bread at home?"), acme)  # cosine 0.017 to:
    unrelated = await client.post(
        url,
        json=chat("What is the capital of Peru?"),
        headers={**acme, "x-cache-threshold": "0", "cache-control": "no-store"},
    )
    assert unrelated.headers["x-cache"] == "miss"
    stricter = await client.post(
        url,
        json=chat("How can I bake bread at home?"),
        headers={**acme, "x-cache-threshold": "1", "cache-control": "no-store"},
    )
    assert stricter.headers["x-cache"] == "miss"  # raising the threshold is always allowed


async def test_anonymous_clients_share_no_semantic_answers_by_default(start_replica, start_router, client) -> None:
    # Regression (finding 4): all clients without a key were one tenant, semantic hits included.
    router = await start_router([(await start_replica()).url])
    url = router.url + URL
    await post_until_stored(client, url, chat("How do I turn on the lights in the kitchen?"))
    paraphrase = await client.post(
        url, json=chat("How can I turn on the kitchen lights?"), headers={"cache-control": "no-store"}
    )
    assert paraphrase.headers["x-cache"] == "miss"
    exact = await client.post(url, json=chat("How do I turn on the lights in the kitchen?"))
    assert exact.headers["x-cache"] == "exact"  # the same request would have produced it


async def test_anonymous_cache_off_neither_looks_up_nor_stores(start_replica, start_router, client, redis_url) -> None:
    router = await start_router([(await start_replica()).url], anonymous_cache="off")
    url = router.url + URL
    for _ in range(2):
        response = await client.post(url, json=chat("How do I turn on the lights in the kitchen?"))
        assert response.headers["x-cache"] == "miss"
    keyed = await client.post(
        url, json=chat("How do I turn on the lights in the kitchen?"), headers={"authorization": "Bearer key-x"}
    )
    assert keyed.headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)  # the keyed answer, stored after the anonymous ones were sent
    r = redis.asyncio.Redis.from_url(redis_url)
    try:
        owners = [
            json.loads(m) for key in await r.keys("promptedge:cache:exact-owners:*") for m in await r.zrange(key, 0, -1)
        ]
    finally:
        await r.aclose()
    assert len(owners) == 1 and owners[0][0] != "default"


async def test_an_empty_admin_key_switches_the_admin_api_off(start_replica, start_router, client) -> None:
    # Regression (finding 4): PROMPTEDGE_ROUTER_ADMIN_KEY="" let a request without a key DELETE /cache.
    router = await start_router([(await start_replica()).url], admin_key="")
    for headers in ({}, {"authorization": "Bearer"}, {"authorization": "Bearer x"}):
        response = await client.delete(router.url + "/cache", params={"all": "true"}, headers=headers)
        assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"


async def test_unknown_api_keys_fold_into_one_label(start_replica, start_router, client, redis_url) -> None:
    # Regression (finding 5): every random API key became a tenant label in /metrics, in
    # /cache/stats and a stats series in Redis.
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"}, admin_key="key-admin")
    url = router.url + URL
    for i in range(12):
        key = "sk-" + os.urandom(8).hex()
        response = await client.post(
            url, json=chat(f"Question number {i}?"), headers={"authorization": f"Bearer {key}"}
        )
        assert response.status_code == 200
    await client.post(url, json=chat("Question number 0?"), headers={"authorization": "Bearer key-a"})
    await client.post(url, json=chat("Question number 0?"))
    # a client's model string is no label either: counted under the pool that answered
    await client.post(
        url, json={**chat("Question number 1?"), "model": "m-" + os.urandom(8).hex()}, headers={"x-model": MODEL}
    )
    stats = (await client.get(router.url + "/cache/stats", headers={"authorization": "Bearer key-admin"})).json()
    assert set(stats["per_model"]) == {MODEL}
    assert set(stats["per_tenant"]) == {"acme", "default", "other"}
    assert stats["per_tenant"]["other"]["requests"] == 12
    metrics = (await client.get(router.url + "/metrics")).text
    tenants = {
        line.split('tenant="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("promptedge_cache_lookups_total{")
    }
    # the cache's registry is per process: other tests' tenants may be there, never a key's
    assert "other" in tenants and not any(t.startswith("key:") for t in tenants)
    r = redis.asyncio.Redis.from_url(redis_url)
    try:
        fields = await r.hkeys("promptedge:cache:{stats}:all")
    finally:
        await r.aclose()
    groups = {f.decode().rpartition("|")[0] for f in fields}
    assert {g for g in groups if g.startswith("t=")} == {"t=acme", "t=default", "t=other"}


async def test_an_echoed_prompt_is_never_served_for_another_wording(start_replica, start_router, client) -> None:
    # An answer with `echo` contains its prompt: a semantic hit would show another client's text.
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"})
    url = router.url + "/v1/completions"
    acme = {"authorization": "Bearer key-a"}
    body = {"model": MODEL, "prompt": "How do I turn on the lights in the kitchen?", "max_tokens": 8, "echo": True}
    await post_until_stored(client, url, body, acme)
    other = await client.post(url, json={**body, "prompt": "How can I turn on the kitchen lights?"}, headers=acme)
    assert other.headers["x-cache"] == "miss"
