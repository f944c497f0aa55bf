"""Caching policy per pool (issue 12, deliverable 2) through the real router: cache_sampled,
n > 1 cached whole or not at all, Cache-Control private / max-age on requests and no-store /
private on a replica's answer."""

from __future__ import annotations

import json
import time

import pytest
import redis.asyncio

from router.caching.policy import ReplicaControl, is_sampled, replica_control
from tests.router.conftest import CHAT, MODEL, cache_entries
from tests.router.raw_replica import RawReplica

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("exact_only")]
URL = "/v1/chat/completions"


def chat(text: str, **extra: object) -> dict[str, object]:
    return {**CHAT, "messages": [{"role": "user", "content": text}], **extra}


def answer(choices: int, created: int = 0) -> bytes:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": created,
            "model": MODEL,
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": f"ok {i}"}, "finish_reason": "stop"}
                for i in range(choices)
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": choices, "total_tokens": 5 + choices},
        }
    ).encode()


async def entries(redis_url: str) -> int:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return len(await client.keys("promptedge:cache:exact:*"))
    finally:
        await client.aclose()


@pytest.fixture()
async def raw():  # type: ignore[no-untyped-def]
    started = await RawReplica().start()
    yield started
    await started.stop()


def test_sampled_means_another_answer_if_asked_again() -> None:
    assert is_sampled({}) and is_sampled({"temperature": 0.7, "top_p": 0.5}) and is_sampled({"temperature": None})
    assert not any(
        is_sampled(b)
        for b in (
            {"temperature": 0},
            {"temperature": 0.0},
            {"temperature": 1.2, "seed": 3},
            {"top_k": 1},
            {"use_beam_search": True},
        )
    )


async def test_cache_sampled_off_keeps_sampled_answers_out_of_that_pool_only(
    start_replica, start_router, client, redis_url
) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], cache_policy={MODEL: {"cache_sampled": False}})
    url = router.url + URL
    bodies = {
        "sampled": chat("hot", temperature=1.2),
        "greedy": chat("cold", temperature=0),
        "seeded": chat("seeded", temperature=1.2, seed=7),
    }
    for body in bodies.values():
        assert (await client.post(url, json=body)).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 2)
    again = {name: (await client.post(url, json=body)).headers["x-cache"] for name, body in bodies.items()}
    assert again == {"sampled": "miss", "greedy": "exact", "seeded": "exact"}
    assert await entries(redis_url) == 2
    # the default policy caches a sampled answer (one valid sample; Cache-Control: no-cache asks again)
    default = await start_router([replica.url])
    assert (await client.post(default.url + URL, json=chat("warm", temperature=1.2))).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 3)
    assert (await client.post(default.url + URL, json=chat("warm", temperature=1.2))).headers["x-cache"] == "exact"


async def test_n_choices_are_cached_whole_or_not_at_all(raw, start_router, client, redis_url) -> None:
    router = await start_router([raw.url])
    url = router.url + URL
    raw.answer = answer(1)  # asked for 2: one choice for n is not the answer
    for _ in range(2):
        response = await client.post(url, json=chat("two please", n=2))
        assert response.headers["x-cache"] == "miss" and len(response.json()["choices"]) == 1
    raw.answer = answer(2)
    assert (await client.post(url, json=chat("two again", n=2))).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)
    hit = await client.post(url, json=chat("two again", n=2))
    assert hit.headers["x-cache"] == "exact" and [c["index"] for c in hit.json()["choices"]] == [0, 1]
    assert (await client.post(url, json=chat("two again"))).headers["x-cache"] == "miss"  # n is in the key
    off = await start_router([raw.url], cache_policy={"*": {"cache_n": False}})
    for _ in range(2):
        assert (await client.post(off.url + URL, json=chat("two off", n=2))).headers["x-cache"] == "miss"
    # stored: "two again" with n=2 only ("two please" had 1 choice for 2; n=1 got 2 choices for 1)
    assert raw.requests == 6 and await entries(redis_url) == 1


async def test_private_answers_are_kept_for_the_same_key_only(start_replica, start_router, client, redis_url) -> None:
    router = await start_router([(await start_replica()).url], api_keys={"key-1": "acme", "key-2": "acme"})
    url = router.url + URL
    private = {"cache-control": "private", "authorization": "Bearer key-1"}
    assert (await client.post(url, json=chat("mine"), headers=private)).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)
    assert (await client.post(url, json=chat("mine"), headers=private)).headers["x-cache"] == "exact"
    for headers in (
        {"authorization": "Bearer key-2", "cache-control": "private, no-store"},
        {"authorization": "Bearer key-2", "cache-control": "no-store"},
        {"authorization": "Bearer key-1", "cache-control": "no-store"},
    ):  # same tenant, not private
        assert (await client.post(url, json=chat("mine"), headers=headers)).headers["x-cache"] == "miss"
    for _ in range(2):  # without a key there is nobody to keep it for
        response = await client.post(url, json=chat("anon"), headers={"cache-control": "private"})
        assert response.headers["x-cache"] == "miss"
    assert await entries(redis_url) == 1


async def test_max_age_bounds_the_age_of_a_served_answer(raw, start_router, client, redis_url) -> None:
    raw.answer = answer(1, created=int(time.time()) - 100)
    router = await start_router([raw.url])
    url = router.url + URL
    assert (await client.post(url, json=chat("aged"))).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)
    ok = await client.post(url, json=chat("aged"), headers={"cache-control": "max-age=3600"})
    assert ok.headers["x-cache"] == "exact" and 100 <= int(ok.headers["age"]) < 3600
    for directive in ("max-age=50", "max-age=0"):
        response = await client.post(url, json=chat("aged"), headers={"cache-control": f"{directive}, no-store"})
        assert response.headers["x-cache"] == "miss"
    bad = await client.post(url, json=chat("aged"), headers={"cache-control": "max-age=soon"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_header"


def test_a_replicas_cache_control_is_read_as_a_shared_cache_reads_it() -> None:
    not_stored = ReplicaControl(store=False)
    for value in (
        "no-store",
        "private",
        "no-cache",
        "NO-CACHE",
        "max-age=0",
        's-maxage="0", max-age=60',
        "max-age=soon",
        "max-age=1, max-age=2",
        "public, no-cache, max-age=60",
    ):
        assert replica_control(value) == not_stored, value
    assert (
        replica_control(None) == replica_control("") == replica_control("public, must-revalidate") == ReplicaControl()
    )
    assert replica_control('no-cache="set-cookie, x-user", private="x-user"') == ReplicaControl()
    assert replica_control("max-age=30") == ReplicaControl(ttl_cap_s=30)
    assert replica_control("max-age=600, s-maxage=20") == ReplicaControl(ttl_cap_s=20)  # s-maxage wins


# Attack review (Dec 2, F11): no-cache and max-age=0 (and s-maxage=0) were ignored, the answer
# stored; RFC 9111 lets a shared cache store those only to revalidate each use, which a router in
# front of replicas cannot do, so they are not stored. A qualified no-cache / private names header
# fields only, and the cache keeps no header of the replica's: such an answer is stored.
NOT_STORED = [
    "no-store",
    "private, max-age=60",
    "no-cache",
    "max-age=0",
    "public, s-maxage=0, max-age=60",
    "No-Cache",
    'max-age="0"',
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("directive", NOT_STORED)
async def test_a_replica_answer_marked_not_for_a_shared_cache_is_not_cached(
    directive, stream, raw, start_router, client, redis_url
) -> None:
    raw.headers = f"Cache-Control: {directive}\r\n".encode()
    raw.events = [
        json.dumps(
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
            }
        ).encode()
    ]
    router = await start_router([raw.url])
    for _ in range(2):
        response = await client.post(router.url + URL, json=chat("not for sharing", stream=stream))
        assert response.status_code == 200 and response.headers["x-cache"] == "miss"
    assert raw.requests == 2
    raw.headers = b'Cache-Control: no-cache="set-cookie", private="x-user"\r\n'
    assert (await client.post(router.url + URL, json=chat("shareable", stream=stream))).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)
    assert await entries(redis_url) == 1
    metrics = (await client.get(router.url + "/metrics")).text
    assert (
        'promptedge_router_cache_store_skipped_total{pool="sim-llama-8b",reason="replica_cache_control"} 2.0' in metrics
    )


@pytest.mark.parametrize(
    ("directive", "bound"), [("max-age=30", 30), ("s-maxage=20, max-age=600", 20), ("max-age=999999999", 3600)]
)
async def test_a_replicas_max_age_bounds_the_entrys_time_to_live(
    directive, bound, raw, start_router, client, redis_url
) -> None:
    raw.headers = f"Cache-Control: {directive}\r\n".encode()
    router = await start_router([raw.url])  # TTL 3600 s (the default)
    assert (await client.post(router.url + URL, json=chat("fresh for a while"))).headers["x-cache"] == "miss"
    await cache_entries(redis_url, 1)
    store = redis.asyncio.Redis.from_url(redis_url)
    try:
        (key,) = await store.keys("promptedge:cache:exact:*")
        assert bound - 5 <= await store.ttl(key) <= bound
    finally:
        await store.aclose()
    assert (await client.post(router.url + URL, json=chat("fresh for a while"))).headers["x-cache"] == "exact"


def test_a_replicas_odd_max_age_is_no_crash() -> None:
    # "²".isdigit() is true and int() refuses it; int() also refuses over 4300 digits: either
    # made every answer of that replica a 500 after it was generated (attack review Dec 2 #2)
    assert replica_control("max-age=\u00b2") == ReplicaControl(store=False)
    assert replica_control("max-age=\u0663") == ReplicaControl(store=False)  # not an ASCII DIGIT
    assert replica_control("max-age=" + "9" * 5000) == ReplicaControl(ttl_cap_s=2**31)  # RFC 9111 1.2.2
    assert replica_control("s-maxage=" + "0" * 5000 + "7") == ReplicaControl(ttl_cap_s=7)


def test_a_clients_odd_max_age_is_a_400_or_read_not_a_500() -> None:
    from router.errors import BadRequest
    from router.forward import classify

    for value in ("max-age=\u00b2", "max-age=\u0663"):  # what a latin-1 byte 0xb2 decodes to; not ASCII
        with pytest.raises(BadRequest):
            classify.cache_control({"cache-control": value})
    # 5000 digits: int() refuses over 4300 (a 500 internal_error); it is "very long", 2**31 s
    assert classify.cache_control({"cache-control": "max-age=" + "9" * 5000}).max_age_s == 2**31


@pytest.mark.parametrize(
    ("header", "value"),
    [("x-cache-threshold", "high"), ("x-cache-threshold", "1.5"), ("x-cache-ttl", "soon"), ("x-cache-ttl", "-1")],
)
def test_a_bad_cache_header_is_named_the_same_way_whatever_is_wrong_with_it(header: str, value: str) -> None:
    # a client that matches on the error's param must not need two spellings of one header
    from router.errors import BadRequest
    from router.forward import classify

    with pytest.raises(BadRequest) as caught:
        classify.cache_control({header: value})
    assert caught.value.param == {"x-cache-threshold": "X-Cache-Threshold", "x-cache-ttl": "X-Cache-TTL"}[header]
