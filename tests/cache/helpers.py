"""Requests and replica answers the cache tests store and look up (one definition for the files
that need no other shape)."""

from __future__ import annotations

from typing import Any

from cache import CacheControl, CacheRequest


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
