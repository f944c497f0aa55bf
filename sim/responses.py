"""OpenAI response bodies and SSE chunks (chat.completion / text_completion shapes).

Every completion stops at max_tokens, so ``finish_reason`` is always ``"length"``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

Kind = Literal["chat", "text"]


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    kind: Kind, req_id: str, model: str, text: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """Non-stream response body with ``usage`` always filled in."""
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text}
        obj = "text_completion"
    choice.update(logprobs=None, finish_reason="length")
    return {
        "id": req_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(
    kind: Kind,
    req_id: str,
    model: str,
    text: str | None,
    *,
    first: bool = False,
    finish: bool = False,
    include_usage: bool = False,
) -> dict[str, Any]:
    """One streamed chunk. ``first`` adds the assistant role (chat); ``finish`` sets
    finish_reason. With include_usage, OpenAI puts ``"usage": null`` on every content chunk."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or ""}
        obj = "text_completion"
    choice.update(logprobs=None, finish_reason="length" if finish else None)
    body: dict[str, Any] = {
        "id": req_id, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]
    }
    if include_usage:
        body["usage"] = None
    return body


def usage_chunk(kind: Kind, req_id: str, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The final chunk sent when stream_options.include_usage: no choices, usage filled in."""
    return {
        "id": req_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event line pair: ``data: <json>\\n\\n`` (or a literal like [DONE])."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def models_body(model: str, max_model_len: int) -> dict[str, Any]:
    """GET /v1/models in vLLM's shape (one served model)."""
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "promptedge-sim",
                "root": model,
                "max_model_len": max_model_len,
            }
        ],
    }
