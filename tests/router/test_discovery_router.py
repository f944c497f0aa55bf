"""The router with Kubernetes discovery: replicas come from the fake API server's EndpointSlices,
requests go to real sim replicas over real HTTP, a terminating replica drains."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from router import RouterSettings, create_app
from tests.router.conftest import CHAT, MODEL, Served, sse_data
from tests.router.fake_kube_api import FakeKubeAPI, endpoint, endpoint_slice

LABELS = {"kubernetes.io/service-name": "vllm", "promptedge.io/model": MODEL}


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    """The fake API server, with the router's PROMPTEDGE_ROUTER_K8S_* settings pointing at it."""
    server = FakeKubeAPI().start()
    for name, value in {
        "KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig")),
        "LABEL_SELECTOR": "kubernetes.io/service-name=vllm",
        "PORT_NAME": "http",
        "MODEL_LABEL": "promptedge.io/model",
        "BACKOFF_MAX_S": "0.1",
    }.items():
        monkeypatch.setenv(f"PROMPTEDGE_ROUTER_K8S_{name}", value)
    yield server
    server.stop()


@pytest.fixture()
def start_discovering_router(servers: list[Served], redis_url: str) -> Callable[[], Awaitable[Served]]:
    async def start() -> Served:
        settings = RouterSettings(
            discovery="kubernetes", redis_url=redis_url, counters_flush_s=0.05, health_interval_s=0.05
        )
        served = await Served(create_app(settings)).start()
        servers.append(served)
        return served

    return start


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def ready_count(client: httpx.AsyncClient, router: Served) -> int:
    models = (await client.get(router.url + "/v1/models")).json()["data"]
    return sum(m["ready"] for m in models if m["id"] == MODEL)


async def wait_ready(client: httpx.AsyncClient, router: Served, count: int) -> None:
    for _ in range(500):
        if await ready_count(client, router) == count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"pool never had {count} ready replicas")


async def test_router_serves_through_a_discovered_replica(
    fake, start_replica, start_discovering_router, client
) -> None:
    replica = await start_replica()
    fake.apply(endpoint_slice("vllm-1", [endpoint("127.0.0.1")], port_of(replica.url), LABELS))
    router = await start_discovering_router()
    await wait_ready(client, router, 1)
    answer = await client.post(router.url + "/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200
    assert answer.headers["x-promptedge-replica"] == replica.url
    assert answer.json()["object"] == "chat.completion"


async def test_terminating_replica_finishes_its_stream_and_takes_nothing_new(
    fake, start_replica, start_discovering_router, client
) -> None:
    old, new = await start_replica(), await start_replica()
    fake.apply(endpoint_slice("vllm-1", [endpoint("127.0.0.1")], port_of(old.url), LABELS))
    router = await start_discovering_router()
    await wait_ready(client, router, 1)
    body = {**CHAT, "stream": True, "max_tokens": 400}
    async with client.stream("POST", router.url + "/v1/chat/completions", json=body) as stream:
        assert stream.headers["x-promptedge-replica"] == old.url
        chunks = stream.aiter_text()
        received = await anext(chunks)
        # The pod is shutting down: its endpoint turns terminating in the slice.
        fake.apply(
            endpoint_slice(
                "vllm-1", [endpoint("127.0.0.1", ready=False, serving=True, terminating=True)], port_of(old.url), LABELS
            )
        )
        await wait_ready(client, router, 0)
        refused = await client.post(
            router.url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "new one"}]}
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_replica"
        async for text in chunks:
            received += text
    events = sse_data(received)
    assert events[-1] == "[DONE]" and not any("error" in json.loads(e) for e in events[:-1])
    content = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert len(content.split()) == 400
    metrics = (await client.get(router.url + "/metrics")).text
    assert f'promptedge_router_replica_inflight{{pool="{MODEL}",replica="{old.url}"}} 0.0' in metrics
    # A new pod replaces it in a second slice; the old endpoint goes away.
    fake.apply(endpoint_slice("vllm-2", [endpoint("127.0.0.1")], port_of(new.url), LABELS))
    fake.apply(endpoint_slice("vllm-1", None, port_of(old.url), LABELS))
    await wait_ready(client, router, 1)
    served = await client.post(
        router.url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "after"}]}
    )
    assert served.status_code == 200 and served.headers["x-promptedge-replica"] == new.url
    models = (await client.get(router.url + "/v1/models")).json()["data"]
    assert [(m["id"], m["replicas"]) for m in models] == [(MODEL, 1)]
