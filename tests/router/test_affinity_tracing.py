"""Prefix and session affinity through the router, prompt-size classes, OpenTelemetry spans."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.dispatch.affinity import PrefixMap, prefix_key
from router.forward.classify import size_class
from tests.router.conftest import CHAT, MODEL

SYSTEM = "You are a careful assistant. " * 100  # ~2,900 characters shared by every request


def chat(question: str, system: str = SYSTEM) -> dict:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


def test_prefix_key_needs_a_long_enough_shared_start() -> None:
    assert prefix_key(chat("a"), 2048) == prefix_key(chat("b"), 2048)
    assert prefix_key(chat("a", "short system prompt"), 2048) is None
    assert prefix_key(chat("a", "Other. " * 500), 2048) != prefix_key(chat("a"), 2048)
    assert prefix_key({"prompt": "x" * 3000}, 2048) == prefix_key({"prompt": "x" * 2048 + "y" * 900}, 2048)


def test_prefix_map_expires_and_is_bounded() -> None:
    prefixes = PrefixMap(ttl_s=10.0, max_entries=2)
    prefixes.put(1, "a", 0.0)
    assert prefixes.get(1, 5.0) == "a" and prefixes.get(1, 11.0) is None
    prefixes.put(2, "b", 0.0)
    prefixes.put(3, "c", 0.0)
    assert prefixes.get(1, 1.0) is None and prefixes.get(3, 1.0) == "c"


def test_size_classes() -> None:
    assert [size_class(t, (512, 4096)) for t in (10, 512, 4095, 4096)] == ["short", "medium", "medium", "long"]


@pytest.mark.usefixtures("exact_only")  # dispatch only: no embedding model to load
async def test_shared_prefix_and_session_stick_to_one_replica(start_replica, start_router, client) -> None:
    replicas = [await start_replica() for _ in range(3)]
    router = await start_router([r.url for r in replicas], scrape_interval_s=60)
    url = router.url + "/v1/chat/completions"
    served = [(await client.post(url, json=chat(f"question {i}"))).headers["x-promptedge-replica"] for i in range(5)]
    assert len(set(served)) == 1
    # Without a shared prefix the idle pool is filled in turn.
    plain = [
        (await client.post(url, json={**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]})).headers[
            "x-promptedge-replica"
        ]
        for i in range(3)
    ]
    assert len(set(plain)) == 3
    sticky = [
        (await client.post(url, json={**CHAT, "temperature": 0.01 * i}, headers={"x-session-id": "user-7"})).headers[
            "x-promptedge-replica"
        ]
        for i in range(4)
    ]
    assert len(set(sticky)) == 1


async def test_spans_and_the_json_log_line(start_replica, start_router, client, caplog) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    router.app.state.router.tracer = provider.get_tracer("test")
    with caplog.at_level(logging.INFO, logger="router.access"):
        response = await client.post(router.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "req-42"})
        assert response.headers["x-request-id"] == "req-42"
        for _ in range(100):
            if exporter.get_finished_spans():
                break
            await asyncio.sleep(0.01)
    spans: dict[str, ReadableSpan] = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"request", "lb_route_time", "queue_wait_time", "inference_time"}
    root = spans["request"]
    assert root.attributes["request_id"] == "req-42" and root.attributes["replica"] == replica.url
    assert all(spans[n].parent.span_id == root.context.span_id for n in ("lb_route_time", "queue_wait_time"))
    assert spans["lb_route_time"].end_time <= spans["queue_wait_time"].start_time + 1
    line = json.loads(next(r.getMessage() for r in caplog.records if r.name == "router.access"))
    assert line["request_id"] == "req-42" and line["replica"] == replica.url and line["cache"] == "miss"
    assert line["size"] == "short" and line["completion_tokens"] == 8
    assert {"queue_time", "inference_time", "prompt_tokens", "profile", "model"} <= set(line)
