"""A cached answer is the answer (issue 12), through the real router in front of a real sim
replica: what a client got on a miss, a later hit gives back field by field, in the shape it asks
for (stream or not, with or without ``include_usage``), for chat and completions, with logprobs,
reasoning, a tool call and a system fingerprint."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.router.conftest import MODEL, assembled, cache_entries, chunks

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("exact_only")]

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
CASES = {
    "chat-logprobs-reasoning": ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}),
    "chat-tool-call": ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": "required"}),
    "completions-logprobs": ("/v1/completions", {"logprobs": 2}),
}


def body(path: str, text: str, extra: dict[str, Any], **more: Any) -> dict[str, Any]:
    inputs = {"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text}
    return {"model": MODEL, **inputs, "max_tokens": 8, **extra, **more}


def check_shape(name: str, answer: dict[str, Any]) -> None:
    """The parts the sim was asked for are there (so equality below compares something)."""
    choice = answer["choices"][0]
    assert answer["system_fingerprint"] == "fp_sim" and "stop_reason" in choice
    if name == "chat-tool-call":
        assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
        assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])["text"]
    elif name == "chat-logprobs-reasoning":
        assert choice["message"]["reasoning_content"] and len(choice["logprobs"]["content"]) == 8 - 3
    else:
        assert len(choice["logprobs"]["tokens"]) == 8


@pytest.fixture()
async def router(start_replica, start_router):
    replica = await start_replica(reasoning_tokens=3, system_fingerprint="fp_sim")
    return await start_router([replica.url])


@pytest.mark.parametrize("name", list(CASES))
async def test_a_non_stream_miss_comes_back_the_same_in_every_shape(name, router, client, redis_url) -> None:
    path, extra = CASES[name]
    url = router.url + path
    miss = await client.post(url, json=body(path, "non-stream first", extra))
    assert miss.headers["x-cache"] == "miss"
    original = miss.json()
    check_shape(name, original)
    await cache_entries(redis_url, 1)
    again = await client.post(url, json=body(path, "non-stream first", extra))
    assert again.headers["x-cache"] == "exact" and again.content == miss.content  # the replica's bytes
    with_usage = await client.post(
        url, json=body(path, "non-stream first", extra, stream=True, stream_options={"include_usage": True})
    )
    assert with_usage.headers["x-cache"] == "exact"
    assert assembled(with_usage) == original
    assert all(c["system_fingerprint"] == "fp_sim" for c in chunks(with_usage))
    without = await client.post(url, json=body(path, "non-stream first", extra, stream=True))
    assert all("usage" not in c for c in chunks(without))  # not asked: no usage chunk
    assert assembled(without) == {k: v for k, v in original.items() if k != "usage"}


@pytest.mark.parametrize("name", list(CASES))
async def test_a_stream_miss_without_usage_comes_back_the_same_with_usage(name, router, client, redis_url) -> None:
    path, extra = CASES[name]
    url = router.url + path
    miss = await client.post(url, json=body(path, "stream first", extra, stream=True))
    assert miss.headers["x-cache"] == "miss"
    # the usage the router asked for is not relayed: neither its chunk nor the sim's "usage": null
    assert all(c["choices"] and "usage" not in c for c in chunks(miss))
    original = assembled(miss)
    check_shape(name, original)
    await cache_entries(redis_url, 1)
    hit = await client.post(url, json=body(path, "stream first", extra))
    assert hit.headers["x-cache"] == "exact"
    served = hit.json()
    # regression: usage was None when the stream had not asked for it (r.usage.total_tokens raised)
    assert served["usage"] == {
        "prompt_tokens": served["usage"]["prompt_tokens"],
        "completion_tokens": 8,
        "total_tokens": served["usage"]["prompt_tokens"] + 8,
    }
    assert {k: v for k, v in served.items() if k != "usage"} == original
    streamed = await client.post(
        url, json=body(path, "stream first", extra, stream=True, stream_options={"include_usage": True})
    )
    assert assembled(streamed) == served
