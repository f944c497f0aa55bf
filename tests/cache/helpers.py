"""Requests and replica answers the cache tests store and look up, and model files fitted on
another embedder (one definition for the files that need no other shape)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from cache import CacheControl, CacheRequest, CacheSettings, ResponseCache
from cache.embed.encoder import Encoder
from cache.verify.bound.model import DEFAULT_PRIOR_PATH as PRIOR_PATH
from cache.verify.learned import DEFAULT_PATH as VERIFIER_PATH


def answer(text: str = "Flip the switch by the door.") -> dict[str, Any]:
    """A replica's non-streamed chat completion whose message is ``text``."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
    }


def ask(
    text: str,
    *,
    tenant: str = "t1",
    model: str = "m",
    system: str | None = None,
    history: tuple[str, ...] = (),
    params: dict[str, Any] | None = None,
    **control: Any,
) -> CacheRequest:
    """A chat request of ``tenant`` whose last user turn is ``text``, after an optional system
    prompt and ``history`` (alternating user and assistant turns); ``params`` go into the body,
    ``control`` into its CacheControl (``no_cache=True``, ``threshold=0.9``...)."""
    messages = [{"role": "system", "content": system}] if system else []
    for i, turn in enumerate(history):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    messages.append({"role": "user", "content": text})
    body = {"model": model, "messages": messages, **(params or {})}
    return CacheRequest("chat.completions", body, tenant, CacheControl(**control))


def embedder_mismatch(**settings: Any) -> str | None:
    """``CacheSettings(**settings).embedder_mismatch`` with the verifier and the bound's prior
    those settings load, as ``SemanticCache`` calls it at start (None: the stage may start)."""
    s = CacheSettings(**settings)
    learned = s.learned_verifier()
    return s.embedder_mismatch(learned[0] if learned else None, s.bound_prior())


def verifier_trained_on(folder: Path, trained_on: object) -> Path:
    """A copy of the shipped verifier file in ``folder`` whose ``trained_on`` is ``trained_on``
    (e.g. ``{"embedder": "/models/bge|onnx"}``); a new file name on each call, so a file
    cached by path and version is never read stale."""
    data = json.loads(VERIFIER_PATH.read_text())
    data["trained_on"] = trained_on
    return _write_new(folder, "verifier", data)


def prior_fitted_on(folder: Path, model: str) -> Path:
    """A copy of the shipped cosine prior (cache/models/entry_bound.json) in ``folder`` whose
    ``fitted_on.model`` is ``model``; a new file name on each call."""
    data = json.loads(PRIOR_PATH.read_text())
    data["fitted_on"]["model"] = model
    return _write_new(folder, "prior", data)


def _write_new(folder: Path, stem: str, data: Any) -> Path:
    path = folder / f"{stem}-{len(list(folder.glob(f'{stem}-*.json')))}.json"
    path.write_text(json.dumps(data))
    return path


Factory = Callable[..., Awaitable[ResponseCache]]


@asynccontextmanager
async def started_caches(redis_url: str, encoder: Encoder, **defaults: Any) -> AsyncIterator[Factory]:
    """A factory of started ResponseCaches on ``redis_url`` (each with its own client: one per
    simulated router worker) sharing the loaded ``encoder``; settings are generous timeouts
    (CI machines are shared; the bounds have tests of their own), then ``defaults``, then the
    call's overrides. Every cache and client is closed on exit."""
    made: list[tuple[ResponseCache, aioredis.Redis]] = []

    async def factory(**overrides: Any) -> ResponseCache:
        client = aioredis.Redis.from_url(redis_url)
        settings = CacheSettings(**{"redis_timeout_s": 1.0, "embed_timeout_s": 10.0, **defaults, **overrides})
        cache = ResponseCache(client, settings, encoder=encoder)
        await cache.start()
        made.append((cache, client))
        return cache

    try:
        yield factory
    finally:
        for cache, client in made:
            await cache.aclose()
            await client.aclose()
