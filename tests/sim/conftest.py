"""Fixtures for sim tests: simulated replicas served in-process by uvicorn on ephemeral ports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvicorn
from fastapi import FastAPI

from sim import Profile, SimSettings, create_app

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

ServeFn = Callable[..., Awaitable[str]]


@pytest.fixture()
def fast_profile() -> Profile:
    """A replica profile that decodes a token every 5 ms, two sequences at a time."""
    return FAST


async def _serve(app: FastAPI) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


@pytest.fixture()
async def serve_replica() -> AsyncIterator[ServeFn]:
    """Start replicas: ``url = await serve_replica(profile=FAST, warmup_s=0, model=...)``."""
    running: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(profile: Profile = FAST, **settings: object) -> str:
        app = create_app(SimSettings(**settings), profile)
        server, task, url = await _serve(app)
        running.append((server, task))
        return url

    yield start
    for server, _task in running:
        server.should_exit = True
    await asyncio.gather(*(task for _, task in running), return_exceptions=True)
