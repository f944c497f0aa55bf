"""The router process freezes the heap its start-up left (router/process/heap.py), so that the cyclic
collector no longer walks the imported modules and models on a request's time."""

from __future__ import annotations

import asyncio
import gc
import re
import time
from pathlib import Path
from typing import Any

import pytest

from router.process.heap import frozen_after_startup
from tests.router.router_process import start_router


class _Loaded:
    """Something start-up loads and keeps (a model, a tokenizer)."""


def _app_with_lifespan(events: list[str]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        message = await receive()
        assert message["type"] == "lifespan.startup"
        scope["state"]["model"] = _Loaded()
        await send({"type": "lifespan.startup.complete"})
        events.append("started")
        message = await receive()
        assert message["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.complete"})

    return app


def test_the_heap_is_frozen_when_start_up_completes_and_not_before() -> None:
    events: list[str] = []
    state: dict[str, Any] = {}
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    frozen_at_send: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        frozen_at_send.append(gc.get_freeze_count())

    async def run() -> None:
        await inbox.put({"type": "lifespan.startup"})
        await inbox.put({"type": "lifespan.shutdown"})
        await frozen_after_startup(_app_with_lifespan(events))({"type": "lifespan", "state": state}, inbox.get, send)

    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        asyncio.run(run())
        # the server hears "started" only once what start-up loaded is out of the collector's walk
        assert frozen_at_send[0] > 0
        assert events == ["started"]
        # what start-up loaded is frozen: no longer among the objects the collector walks
        assert not any(obj is state["model"] for obj in gc.get_objects())
        later = _Loaded()  # what requests make afterwards is collected as before
        assert any(obj is later for obj in gc.get_objects())
    finally:
        gc.unfreeze()


def test_requests_pass_through_unchanged() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    gc.unfreeze()
    asyncio.run(frozen_after_startup(app)({"type": "http", "path": "/health"}, None, send))
    assert seen == [{"type": "http", "path": "/health"}]
    assert sent == [{"type": "http.response.start", "status": 204, "headers": []}]
    assert gc.get_freeze_count() == 0  # only a lifespan start-up freezes


@pytest.mark.parametrize("workers", [1, 2])
def test_router_serve_freezes_each_serving_process_after_its_start_up(tmp_path: Path, workers: int) -> None:
    router = start_router(tmp_path, args=("--log-level", "debug", "--workers", str(workers)))
    try:
        # /health answers once one worker serves; the others may still be starting
        deadline = time.monotonic() + 60
        while True:
            frozen = [int(n) for n in re.findall(r"start-up heap frozen: (\d+) objects", router.log_text())]
            if len(frozen) >= workers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # and no process freezes twice
        frozen = [int(n) for n in re.findall(r"start-up heap frozen: (\d+) objects", router.log_text())]
    finally:
        router.stop()
    # every process that serves requests (the one process, or each worker, not the supervisor),
    # with the imported packages in it
    assert len(frozen) == workers, router.log_text()[-3000:]
    assert min(frozen) > 10_000
