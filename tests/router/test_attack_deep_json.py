"""A replica whose answer nests JSON deeper than Python's recursion limit (or just deeper than
any OpenAI answer, in a field the delta merge recurses into): the client gets what the replica
sent, the request is counted, nothing is cached and no traceback is logged.

Found by an attack helper (Dec 2): a stream chunk with ``delta.extra`` nested 900 objects deep
raised RecursionError in the generic delta merge (router/deltas.py) in the middle of the relay
(the client's stream broke off, the request was neither counted nor logged); nested 2000 deep,
``json.loads`` itself raised RecursionError, which the assembler did not catch (only ValueError);
a non-stream answer that deep raised in the background task after the answer went out.
"""

from __future__ import annotations

import json
import logging

import pytest

from tests.router.conftest import CHAT
from tests.router.raw_replica import RawReplica

pytestmark = pytest.mark.usefixtures("exact_only")
URL = "/v1/chat/completions"


def _nested(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


def _event(depth: int) -> bytes:
    head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": CHAT["model"]}
    return (json.dumps(head)[:-1] + ',"choices":[{"index":0,"delta":{"content":"a","extra":'
            + _nested(depth) + '},"finish_reason":"stop"}]}').encode()


def _answer(depth: int) -> bytes:
    return ('{"id":"x","object":"chat.completion","created":0,"model":"' + CHAT["model"] + '","choices":[{"index":0,'
            '"message":{"role":"assistant","content":"ok","extra":' + _nested(depth) + '},"finish_reason":"stop"}],'
            '"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}').encode()


@pytest.fixture()
async def replica():  # type: ignore[no-untyped-def]
    started = await RawReplica().start()
    yield started
    await started.stop()


async def _misses(client, router, n: int) -> None:  # type: ignore[no-untyped-def]
    metrics = (await client.get(router.url + "/metrics")).text
    counted = [line for line in metrics.splitlines()
               if line.startswith("promptedge_router_requests_total{") and 'cache="miss"' in line]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) == n, counted


@pytest.mark.parametrize("depth", [900, 5000])
async def test_a_deeply_nested_stream_is_relayed_counted_and_never_cached(depth, replica, start_router, client,
                                                                          caplog) -> None:
    replica.events = [_event(depth)]
    router = await start_router([replica.url])
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": f"deep stream {depth}"}]}
    with caplog.at_level(logging.ERROR):
        first = await client.post(router.url + URL, json=body)
        second = await client.post(router.url + URL, json=body)
    assert first.status_code == second.status_code == 200
    assert "[DONE]" in first.text and '"extra"' in first.text and second.headers["x-cache"] == "miss"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    await _misses(client, router, 2)


@pytest.mark.parametrize("depth", [900, 5000])
async def test_a_deeply_nested_answer_is_relayed_counted_and_never_cached(depth, replica, start_router, client,
                                                                          caplog) -> None:
    replica.answer = _answer(depth)
    router = await start_router([replica.url])
    body = {**CHAT, "messages": [{"role": "user", "content": f"deep answer {depth}"}]}
    with caplog.at_level(logging.ERROR):
        first = await client.post(router.url + URL, json=body)
        second = await client.post(router.url + URL, json=body)
        await _misses(client, router, 2)
    assert first.status_code == second.status_code == 200 and first.content == replica.answer
    assert second.headers["x-cache"] == "miss"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
