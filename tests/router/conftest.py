"""Router test fixtures: simulated replicas and routers served in-process by uvicorn on ephemeral
ports, a real Redis (``redis_url`` from tests/conftest.py), real HTTP between all of them; and,
for the llama.cpp modules, a real ``llama-server`` per module (``llama``, ``model``, ``store``)."""

from __future__ import annotations

import asyncio
import io
import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
import uvicorn
from fastapi import FastAPI

from router import ReplicaSpec, RouterSettings, create_app
from router.stream.sse import StreamAssembler
from sim import Profile, SimSettings
from sim import create_app as create_replica
from tests.router.llama_servers import REDIS_URL, start_llama, stop

# A tiny, fast replica: 5 ms per decode step, 2 concurrent sequences, small KV cache.
FAST = Profile(
    name="fast",
    max_num_seqs=2,
    max_num_batched_tokens=256,
    kv_capacity_tokens=4000,
    max_model_len=1000,
    prefill_s_per_token=0.0,
    decode_base_s=0.005,
    decode_per_seq_s=0.0,
    kv_read_s_per_token=0.0,
)
MODEL = "sim-llama-8b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is a KV cache?"}], "max_tokens": 8}


class Served:
    """One in-process uvicorn server; ``url`` is its base URL."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", loop="asyncio")
        )
        self.task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> Served:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("server exited during start-up")
            await asyncio.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        # Bounded, with the tasks' stacks in the warning: full `make test` runs sat 30 s to 19
        # minutes in a warming router's shutdown, a cancel lost in a bounded Redis await
        # (router/caching/warming.py PoolWarmer.run; test_warming_attack.py::
        # test_the_router_stops_when_a_cancel_is_lost_inside_a_warming_step). Whatever else
        # may hang a shutdown costs a minute and says where, instead of the whole CI run.
        self.server.should_exit = True
        if self.task is None:
            return
        done, _ = await asyncio.wait({self.task}, timeout=30)
        if not done:
            stuck = io.StringIO()  # what the shutdown waits on, for the report
            for task in asyncio.all_tasks():
                task.print_stack(limit=8, file=stuck)
            warnings.warn(
                f"server {self.url} did not stop within 30 s: forcing it; tasks:\n{stuck.getvalue()}", stacklevel=2
            )
            self.server.force_exit = True
            done, _ = await asyncio.wait({self.task}, timeout=10)
            if not done:
                self.task.cancel()  # a task that loses this cancel too is left behind, not awaited
                done, _ = await asyncio.wait({self.task}, timeout=10)
                if not done:
                    warnings.warn(f"server {self.url} ignored its cancel: abandoned", stacklevel=2)
                    return
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture(autouse=True)
def patient_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache's 50 ms Redis bound is for production; on a loaded 2-core test machine a slow
    round trip would turn a hit into a miss at random. (Redis-down tests fail fast anyway.)"""
    monkeypatch.setenv("PROMPTEDGE_CACHE_REDIS_TIMEOUT_S", "2.0")


@pytest.fixture()
def exact_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routers started by the test have no semantic stage (no embedding model to load), for
    tests of the exact path alone: on this 2-core machine the model's load slows everything
    around it."""
    monkeypatch.setenv("PROMPTEDGE_CACHE_SEMANTIC_ENABLED", "false")


@pytest.fixture()
async def servers() -> AsyncIterator[list[Served]]:
    """Every server started by a test; all are stopped at its end."""
    running: list[Served] = []
    yield running
    for served in reversed(running):
        await served.stop()


@pytest.fixture()
def start_replica(servers: list[Served]) -> Callable[..., Awaitable[Served]]:
    """``replica = await start_replica(profile=FAST, model=MODEL, warmup_s=0, ...)``."""

    async def start(profile: Profile = FAST, **settings: Any) -> Served:
        settings.setdefault("model", MODEL)
        served = await Served(create_replica(SimSettings(**settings), profile)).start()
        servers.append(served)
        return served

    return start


@pytest.fixture()
def start_router(servers: list[Served], redis_url: str) -> Callable[..., Awaitable[Served]]:
    """``router = await start_router([replica urls], model=MODEL, **settings)`` on the test Redis."""

    async def start(
        urls: list[str], model: str = MODEL, specs: list[ReplicaSpec] | None = None, **settings: Any
    ) -> Served:
        settings.setdefault("redis_url", redis_url)
        settings.setdefault("counters_flush_s", 0.05)
        # the tests written before issue 33 made predicted_ttft the default assert gpu_load's
        # choices (an idle pool filled in turn, prefix affinity): they name the policy they test
        settings.setdefault("policy", "gpu_load")
        replicas = specs if specs is not None else [ReplicaSpec(url=url, model=model) for url in urls]
        served = await Served(create_app(RouterSettings(replicas=replicas, **settings))).start()
        servers.append(served)
        return served

    return start


@pytest.fixture()
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client for talking to the servers under test."""
    async with httpx.AsyncClient(timeout=10) as c:
        yield c


def sse_data(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def chunks(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE response, in order; AssertionError unless it ends with ``[DONE]``."""
    events = sse_data(response.text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def assembled(response: httpx.Response) -> dict[str, Any]:
    """An SSE response merged into one completion by the router's own StreamAssembler (what the
    router stores for a streamed miss); AssertionError when it does not assemble."""
    assembler = StreamAssembler()
    assembler.feed(response.content)
    result = assembler.result()
    assert result is not None, response.text
    return result


async def cache_entries(redis_url: str, n: int) -> None:
    """Wait until the exact cache holds ``n`` entries (answers are stored after they are sent)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        for _ in range(200):
            if len(await client.keys("promptedge:cache:exact:*")) >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the cache never held {n} entries")
    finally:
        await client.aclose()


LLAMA_MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running llama-server (SmolLM2-135M-Instruct, Prometheus metrics on), one per
    module; skips with the build's reason where tests/tools/build_llama.py has not built it."""
    proc, url = start_llama(tmp_path_factory.mktemp("llama") / "llama-server.log", LLAMA_MODEL, "--metrics")
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def model(llama: str) -> str:
    """The model name the llama-server reports on /v1/models."""
    models = httpx.get(llama + "/v1/models", timeout=10).json()
    return str(models["data"][0]["id"])


@pytest.fixture(scope="module")
def store() -> Iterator[redis.Redis]:
    """The test Redis (``PROMPTEDGE_TEST_REDIS_URL``) for a module's router subprocess, flushed
    before and after the module."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()
