"""The router process's heap after start-up: frozen, so that the cyclic garbage collector stops
walking it.

The router's start-up leaves a large heap of objects that live as long as the process: the
imported modules (FastAPI, redis-py, aiohttp, prometheus_client) and, with the semantic cache,
the embedding model, its tokenizer and the learned verifier (about 470,000 objects tracked by
the collector with the semantic cache on). CPython's collector walks every tracked object of
the generations it collects, so each full collection costs milliseconds on this machine, and it
lands on whichever request happened to allocate at that moment. ``gc.freeze()`` (CPython 3.7+)
moves every object tracked at that point into a permanent generation the collector no longer
walks; objects made later (requests, cache entries) are collected as before.

Measured (bench/cache_latency.py --verification-only, frozen against unfrozen rounds in one run,
and bench/router_overhead.py): docs/benchmarks.md, router overhead.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

log = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect the start-up's garbage (so it is not kept forever), then ``gc.freeze()`` what is
    left. Returns the number of objects now frozen (``gc.get_freeze_count()``)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def frozen_after_startup(app: Any) -> Any:
    """ASGI app ``app`` whose heap is frozen (:func:`freeze_startup_heap`) once its lifespan
    start-up has completed, just before the server starts accepting requests; everything else
    passes through unchanged. For the process that serves (router serve, each --workers
    worker), not for an app built in a test process."""

    async def frozen(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def on_send(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                log.debug("start-up heap frozen: %d objects", freeze_startup_heap())
            await send(message)

        await app(scope, receive, on_send)

    return frozen
