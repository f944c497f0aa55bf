"""OpenAI response bodies and SSE chunks (chat.completion / text_completion shapes).

Every completion stops at max_tokens, so ``finish_reason`` is ``"length"`` (``"tool_calls"``
for a forced tool call, sim/replica/api/output.py).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Head:
    """What every chunk of one stream repeats: kind, id, model, whether usage was asked for
    (then OpenAI puts ``"usage": null`` on every chunk before the usage chunk), and extra
    top-level fields (``system_fingerprint``)."""

    kind: Kind
    req_id: str
    model: str
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"


def completion_body(
    kind: Kind,
    req_id: str,
    model: str,
    choice: dict[str, Any],
    prompt_tokens: int,
    completion_tokens: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Non-stream response body with ``usage`` always filled in; ``choice``: the choice's
    fields but its index (sim/replica/api/output.py ``whole``); ``extra``: more top-level fields."""
    return {
        "id": req_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        **(extra or {}),
        "choices": [{"index": 0, **choice, "stop_reason": None}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(head: Head, fields: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
    """One streamed chunk of choice 0: ``fields`` is the chat ``delta`` or the completion's
    ``{"text": ...}``; ``finish`` the finish_reason of the last one (vLLM adds ``stop_reason``)."""
    choice: dict[str, Any] = {
        "index": 0,
        **({"delta": fields} if head.kind == "chat" else fields),
        "logprobs": logprobs,
        "finish_reason": finish,
    }
    if finish is not None:
        choice["stop_reason"] = None
    body: dict[str, Any] = {
        "id": head.req_id,
        "object": head.object,
        "created": int(time.time()),
        "model": head.model,
        **head.extra,
        "choices": [choice],
    }
    if head.include_usage:
        body["usage"] = None
    return body


def usage_chunk(head: Head, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The final chunk sent when stream_options.include_usage: no choices, usage filled in."""
    return {
        "id": head.req_id,
        "object": head.object,
        "created": int(time.time()),
        "model": head.model,
        **head.extra,
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
