"""A replica that answers 200 with a body of the wrong shape: the client gets what the replica
said (or a clean error), nothing is cached, the request is counted, and no traceback is logged.

Found by an attack helper (Dec 2): ``usage.prompt_tokens: -1`` was cached and every later hit of
that entry was a 500 until its TTL; ``choices: [1]`` or ``delta.content: 5`` in a stream raised
in the relay, so the request was neither counted nor logged.
"""

from __future__ import annotations

import json
import logging

import pytest

from tests.router.conftest import CHAT
from tests.router.raw_replica import RawReplica

URL = "/v1/chat/completions"
FRESH = {"cache-control": "no-cache"}


def _answer(usage: object) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": CHAT["model"],
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                    "finish_reason": "stop"}], "usage": usage}).encode()


def _event(choices: object) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": CHAT["model"],
                       "choices": choices}).encode()


@pytest.fixture()
async def replica():  # type: ignore[no-untyped-def]
    started = await RawReplica().start()
    yield started
    await started.stop()


@pytest.mark.parametrize("usage", [{"prompt_tokens": -1, "completion_tokens": 1}, [1],
                                   {"prompt_tokens": "5", "completion_tokens": 1},
                                   {"prompt_tokens": 1e400, "completion_tokens": 1}])
async def test_an_answer_with_bad_usage_is_relayed_and_never_cached(usage, replica, start_router, client,
                                                                   caplog) -> None:
    replica.answer = _answer(usage).replace(b"Infinity", b"1e400")
    router = await start_router([replica.url])
    body = {**CHAT, "messages": [{"role": "user", "content": f"bad usage {usage!r}"}]}
    with caplog.at_level(logging.ERROR):
        first = await client.post(router.url + URL, json=body)
        second = await client.post(router.url + URL, json=body)
    assert first.status_code == second.status_code == 200, second.text
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "miss")
    assert replica.requests == 2
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("choices", [[1], [{"index": 0, "delta": {"content": 5}, "finish_reason": "stop"}],
                                     [{"index": "0", "delta": {"content": "a"}, "finish_reason": "stop"}],
                                     [{"index": 0, "delta": {"tool_calls": [{"function": "f"}]},
                                       "finish_reason": "stop"}]])
async def test_a_malformed_stream_is_relayed_counted_and_never_cached(choices, replica, start_router, client,
                                                                      caplog) -> None:
    replica.events = [_event(choices)]
    router = await start_router([replica.url])
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": f"bad stream {choices!r}"}]}
    with caplog.at_level(logging.ERROR):
        first = await client.post(router.url + URL, json=body)
        second = await client.post(router.url + URL, json=body)
    assert first.status_code == second.status_code == 200
    assert "[DONE]" in first.text and second.headers["x-cache"] == "miss"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    metrics = (await client.get(router.url + "/metrics")).text
    counted = [line for line in metrics.splitlines()
               if line.startswith("promptedge_router_requests_total{") and 'cache="miss"' in line]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) == 2, counted


async def test_a_replica_trickling_its_answer_is_cut_at_the_time_to_first_byte_bound(replica, start_router,
                                                                                      client) -> None:
    # Left from the third attack round: each byte came well inside the read timeout, which every
    # byte reset, so one trickling replica held the request (and a router slot) with no bound.
    replica.mode = "trickle"  # ~130 bytes at one every 0.5 s: over a minute for the whole answer
    router = await start_router([replica.url], timeouts={"P1": {"connect_s": 1.0, "ttfb_s": 2.0, "idle_s": 1.0}})
    response = await client.post(router.url + URL, json=CHAT, headers=FRESH, timeout=20.0)
    assert response.status_code == 504 and response.json()["error"]["code"] == "replica_timeout"
