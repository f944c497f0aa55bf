"""A replica that answers 200 with a body of the wrong shape: the client gets what the replica
said (or a clean error), nothing is cached, the request is counted, and no traceback is logged.

Found by attack helpers (Dec 2): ``usage.prompt_tokens: -1`` was cached and every later hit of
that entry was a 500 until its TTL; ``choices: [1]`` or ``delta.content: 5`` in a stream raised
in the relay, so the request was neither counted nor logged; JSON nested past the recursion
limit raised RecursionError in the delta merge or in ``json.loads``.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from router.forward.upstream import MAX_ANSWER_BYTES
from tests.router.conftest import CHAT, cache_entries
from tests.router.raw_replica import RawReplica

URL = "/v1/chat/completions"
FRESH = {"cache-control": "no-cache"}


def _answer(usage: object) -> bytes:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": CHAT["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": usage,
        }
    ).encode()


def _event(choices: object) -> bytes:
    return json.dumps(
        {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": CHAT["model"], "choices": choices}
    ).encode()


@pytest.fixture()
async def replica():  # type: ignore[no-untyped-def]
    started = await RawReplica().start()
    yield started
    await started.stop()


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -1, "completion_tokens": 1},
        [1],
        {"prompt_tokens": "5", "completion_tokens": 1},
        {"prompt_tokens": 1e400, "completion_tokens": 1},
    ],
)
async def test_an_answer_with_bad_usage_is_relayed_and_never_cached(
    usage, replica, start_router, client, caplog
) -> None:
    replica.answer = _answer(usage).replace(b"Infinity", b"1e400")
    first, _ = await _asked_twice(replica, start_router, client, caplog, f"bad usage {usage!r}")
    assert first.headers["x-cache"] == "miss" and replica.requests == 2


@pytest.mark.parametrize(
    "choices",
    [
        [1],
        [{"index": 0, "delta": {"content": 5}, "finish_reason": "stop"}],
        [{"index": "0", "delta": {"content": "a"}, "finish_reason": "stop"}],
        [{"index": 0, "delta": {"tool_calls": [{"function": "f"}]}, "finish_reason": "stop"}],
    ],
)
async def test_a_malformed_stream_is_relayed_counted_and_never_cached(
    choices, replica, start_router, client, caplog
) -> None:
    replica.events = [_event(choices)]
    first, router = await _asked_twice(replica, start_router, client, caplog, f"bad stream {choices!r}", stream=True)
    assert "[DONE]" in first.text
    await _counted_misses(client, router, 2)


def _nested(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


@pytest.mark.usefixtures("exact_only")
@pytest.mark.parametrize("depth", [900, 5000])
async def test_a_deeply_nested_stream_is_relayed_counted_and_never_cached(
    depth, replica, start_router, client, caplog
) -> None:
    # Attack helper (Dec 2): ``delta.extra`` nested 900 deep raised RecursionError in the delta
    # merge mid-relay (the stream broke off, uncounted); 2000+ deep json.loads itself raised it.
    head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": CHAT["model"]}
    replica.events = [
        (
            json.dumps(head)[:-1]
            + ',"choices":[{"index":0,"delta":{"content":"a","extra":'
            + _nested(depth)
            + '},"finish_reason":"stop"}]}'
        ).encode()
    ]
    first, router = await _asked_twice(replica, start_router, client, caplog, f"deep stream {depth}", stream=True)
    assert "[DONE]" in first.text and '"extra"' in first.text
    await _counted_misses(client, router, 2)


@pytest.mark.usefixtures("exact_only")
@pytest.mark.parametrize("depth", [900, 5000])
async def test_a_deeply_nested_answer_is_relayed_counted_and_never_cached(
    depth, replica, start_router, client, caplog
) -> None:
    # Same attack, non-stream: it raised in the background task after the answer went out.
    replica.answer = (
        '{"id":"x","object":"chat.completion","created":0,"model":"' + CHAT["model"] + '","choices":'
        '[{"index":0,"message":{"role":"assistant","content":"ok","extra":' + _nested(depth) + "},"
        '"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
        '"total_tokens":4}}'
    ).encode()
    first, router = await _asked_twice(replica, start_router, client, caplog, f"deep answer {depth}")
    assert first.content == replica.answer
    await _counted_misses(client, router, 2)


async def _asked_twice(
    replica: RawReplica,
    start_router,
    client,
    caplog,
    text: str,  # type: ignore[no-untyped-def]
    stream: bool = False,
):
    """The same request twice through a router in front of ``replica``: both 200, the second not
    a hit (nothing was cached), no traceback logged. Returns (first response, router)."""
    router = await start_router([replica.url])
    body = {**CHAT, "stream": stream, "messages": [{"role": "user", "content": text}]}
    with caplog.at_level(logging.ERROR):
        first = await client.post(router.url + URL, json=body)
        second = await client.post(router.url + URL, json=body)
    assert first.status_code == second.status_code == 200, second.text
    assert second.headers["x-cache"] == "miss"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    return first, router


async def _counted_misses(client, router, n: int) -> None:  # type: ignore[no-untyped-def]
    metrics = (await client.get(router.url + "/metrics")).text
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("promptedge_router_requests_total{") and 'cache="miss"' in line
    ]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) == n, counted


async def test_a_replica_trickling_its_answer_is_cut_at_the_time_to_first_byte_bound(
    replica, start_router, client
) -> None:
    # Left from the third attack round: each byte came well inside the read timeout, which every
    # byte reset, so one trickling replica held the request (and a router slot) with no bound.
    replica.mode = "trickle"  # ~130 bytes at one every 0.5 s: over a minute for the whole answer
    router = await start_router([replica.url], timeouts={"P1": {"connect_s": 1.0, "ttfb_s": 2.0, "idle_s": 1.0}})
    response = await client.post(router.url + URL, json=CHAT, headers=FRESH, timeout=20.0)
    assert response.status_code == 504 and response.json()["error"]["code"] == "replica_timeout"


def _delta(content: str | None, finish: str | None = None) -> bytes:
    return _event([{"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish}])


def _sse(replica: RawReplica) -> bytes:
    """The SSE body ``replica`` sends for a stream, as it sends it."""
    return b"".join(b"data: " + e + replica.event_end for e in [*(replica.events or []), b"[DONE]"])


async def _store_skipped(client, router, reason: str) -> float:  # type: ignore[no-untyped-def]
    metrics = (await client.get(router.url + "/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("promptedge_router_cache_store_skipped_total{") and f'reason="{reason}"' in line
    )


@pytest.mark.usefixtures("exact_only")
@pytest.mark.parametrize("end", [b"\r\r", b"\r\n\r\n", b"\n\n"])
async def test_a_stream_is_relayed_and_cached_whatever_line_ends_it_uses(
    end, replica, start_router, client, redis_url
) -> None:
    # Attack review (Dec 2, F13): events ended by CR alone (valid SSE) were relayed, then an
    # error event "ended its stream without [DONE]" was added, and nothing was cached.
    replica.events = [_delta("Par"), _delta("is"), _delta(None, "stop")]
    replica.event_end = end
    router = await start_router([replica.url])
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": f"capital {end!r}"}]}
    streamed = await client.post(router.url + URL, json=body)
    assert streamed.status_code == 200 and streamed.headers["x-cache"] == "miss"
    assert streamed.content == _sse(replica)  # as the replica sent it
    await cache_entries(redis_url, 1)
    hit = await client.post(router.url + URL, json={**body, "stream": False})
    assert hit.headers["x-cache"] == "exact" and hit.json()["choices"][0]["message"]["content"] == "Paris"
    assert replica.requests == 1


@pytest.mark.usefixtures("exact_only")
async def test_an_answer_larger_than_a_cache_entry_is_relayed_whole_and_not_stored(
    replica, start_router, client, redis_url, monkeypatch
) -> None:
    # Attack review (Dec 2, F9): a streamed answer was assembled for the cache without bound.
    monkeypatch.setenv("PROMPTEDGE_CACHE_MAX_ENTRY_BYTES", "65536")
    replica.events = [_delta("x" * 1000)] * 100 + [_delta(None, "stop")]  # ~100 kB of answer
    router = await start_router([replica.url])
    big = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "a long one"}]}
    streamed = await client.post(router.url + URL, json=big)
    assert streamed.status_code == 200 and streamed.content == _sse(replica)  # whole, unchanged, no error event
    for _ in range(100):  # counted when the stream has been accounted for, after the response ended
        if await _store_skipped(client, router, "too_large") == 1:
            break
        await asyncio.sleep(0.02)
    assert await _store_skipped(client, router, "too_large") == 1
    again = await client.post(router.url + URL, json={**big, "stream": False})  # nothing stored: asked again
    assert again.headers["x-cache"] == "miss" and replica.requests == 2  # (its small answer is stored)
    # a non-stream answer over the bound: relayed byte for byte, not stored either
    replica.answer = json.dumps(
        json.loads(_answer({"prompt_tokens": 1, "completion_tokens": 1})) | {"padding": "y" * 70_000}
    ).encode()
    plain = {**CHAT, "messages": [{"role": "user", "content": "a big plain one"}]}
    assert (await client.post(router.url + URL, json=plain)).content == replica.answer
    for _ in range(100):
        if await _store_skipped(client, router, "too_large") == 2:
            break
        await asyncio.sleep(0.02)
    assert await _store_skipped(client, router, "too_large") == 2
    assert (await client.post(router.url + URL, json=plain)).headers["x-cache"] == "miss"
    # under the bound a stream is stored as before
    replica.events = [_delta("x" * 1000)] * 10 + [_delta(None, "stop")]
    small = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "a short one"}]}
    assert (await client.post(router.url + URL, json=small)).status_code == 200
    await cache_entries(redis_url, 2)
    assert (await client.post(router.url + URL, json={**small, "stream": False})).headers["x-cache"] == "exact"


@pytest.mark.usefixtures("exact_only")
@pytest.mark.parametrize(("status", "expected"), [(b"200 OK", 502), (b"404 Not Found", 404)])
async def test_a_replica_that_never_ends_its_answer_costs_the_router_a_bounded_read(
    status, expected, replica, start_router, client
) -> None:
    # An answer (or an error page) that does not end: the router read it whole into memory,
    # a 200 of 256 MiB relayed as is, a 404 read whole for its first 200 characters.
    replica.mode, replica.status = "flood", status
    router = await start_router([replica.url])
    response = await client.post(router.url + URL, json=CHAT, headers=FRESH, timeout=60.0)
    assert response.status_code == expected and "error" in response.json()
    assert len(response.content) < 4096
    # What the router read, plus what the kernel's socket buffers held when it stopped.
    assert replica.flood_sent < MAX_ANSWER_BYTES + 16 * 1024 * 1024, replica.flood_sent


async def test_a_replicas_error_body_is_read_only_up_to_its_bound() -> None:
    """A replica's 4xx/5xx body was read whole (aread, no size or time bound) only to relay
    200 characters of it: a 150 MB error took the router from 102 to 411 MB peak RSS for one
    request (attack review Dec 2 #2)."""
    import httpx

    from router.forward.upstream import ERROR_BODY_MAX_BYTES, read_error_body

    sent = []

    async def body():
        for _ in range(1000):
            sent.append(1)
            yield b"x" * 65536

    response = httpx.Response(400, content=body())
    content = await read_error_body(response, "http://r")
    assert len(content) == ERROR_BODY_MAX_BYTES and len(sent) * 65536 <= ERROR_BODY_MAX_BYTES + 65536
