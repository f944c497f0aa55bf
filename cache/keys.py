"""Canonical form of an OpenAI request and the exact-cache key derived from it (pure).

Two requests get the same key exactly when an OpenAI-compatible server would treat them as the
same generation request: same tenant, endpoint, model, input (messages or prompt) and every
output-affecting parameter, with OpenAI's documented defaults filled in (a missing
``temperature`` equals an explicit 1.0). Parameters that do not change the output (``stream``,
``stream_options``, ``user``, ``metadata``, ``store``) are left out, so a streamed and a
non-streamed request share an entry.

Defaults from the OpenAI API reference (Chat Completions and legacy Completions) and, for the
sampling extras vLLM accepts, vLLM's ``SamplingParams`` (top_k -1, min_p 0, repetition_penalty 1).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from cache.types import Endpoint

KEY_VERSION = 2  # 2: parameters at their default are left out instead of filled in

# Output-affecting parameters and the value a server assumes when the field is absent.
_COMMON_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "n": 1,
    "stop": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": None,
    "seed": None,
    "logprobs": None,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
_CHAT_DEFAULTS: dict[str, Any] = {
    **_COMMON_DEFAULTS,
    "logprobs": False,
    "top_logprobs": None,
    "max_tokens": None,
    "response_format": {"type": "text"},
    "tools": None,
    "tool_choice": None,
    "parallel_tool_calls": True,
    "reasoning_effort": None,
    "modalities": None,
}
_COMPLETION_DEFAULTS: dict[str, Any] = {
    **_COMMON_DEFAULTS,
    "max_tokens": 16,
    "suffix": None,
    "echo": False,
    "best_of": 1,
}
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal")


def _number(value: Any) -> Any:
    # 1 and 1.0 mean the same sampling setting; JSON would tell them apart.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return float(value)


def _content(content: Any) -> Any:
    """A single text part means the same as the plain string."""
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], Mapping):
        part = content[0]
        if part.get("type") == "text" and isinstance(part.get("text"), str) and len(part) == 2:
            return part["text"]
    return content


def canonical_messages(messages: Any) -> list[dict[str, Any]]:
    """messages: the OpenAI ``messages`` list -> the same list with only meaningful fields.

    Unknown fields are dropped, ``content`` is normalised (one text part == the string); content
    of any other shape (images, audio, tool calls) is kept verbatim so it is cached exactly.
    """
    out: list[dict[str, Any]] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, Mapping):
            out.append({"raw": message})
            continue
        item = {f: message[f] for f in _MESSAGE_FIELDS if message.get(f) is not None}
        if "content" in item:
            item["content"] = _content(item["content"])
        out.append(item)
    return out


def _is_default(value: Any, default: Any) -> bool:
    # same type as well as equal: logprobs 0 is not logprobs False, although 0 == False
    return type(value) is type(default) and value == default


def _params(body: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    # Only the parameters a request sets, minus those set to their default: a missing field and
    # its explicit default give the same (usually empty) dict, and a request pays for the few
    # fields it has, not for every known parameter (this runs on every request's path).
    params = {name: _number(value) for name, value in body.items() if name in defaults}
    if body.get("max_completion_tokens") is not None:
        params["max_tokens"] = _number(body["max_completion_tokens"])
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    if params.get("stop") == []:
        params["stop"] = None
    if params.get("logit_bias") == {}:
        params["logit_bias"] = None
    if "tools" in defaults and not params.get("tools"):
        params.pop("tools", None)
    if "tool_choice" in defaults:
        # OpenAI: "none" without tools, "auto" with tools.
        if params.get("tool_choice") == ("auto" if params.get("tools") else "none"):
            params["tool_choice"] = None
    return {name: value for name, value in params.items() if not _is_default(value, _number(defaults[name]))}


def canonical_params(endpoint: Endpoint, body: Mapping[str, Any]) -> dict[str, Any]:
    """The output-affecting parameters of a request that differ from OpenAI's defaults (pure):
    two requests that mean the same generation get equal dicts (a missing ``temperature`` and an
    explicit 1.0 both leave it out; 1 and 1.0 are the same number)."""
    return _params(body, _CHAT_DEFAULTS if endpoint == "chat.completions" else _COMPLETION_DEFAULTS)


def canonical_request(endpoint: Endpoint, body: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """The canonical, JSON-serialisable form of a request for exact matching.

    endpoint: ``chat.completions`` or ``completions``; body: the request JSON; tenant: the
    tenant name. Never raises on odd content: whatever is not understood is kept verbatim.
    """
    if endpoint == "chat.completions":
        payload: dict[str, Any] = {"messages": canonical_messages(body.get("messages"))}
    else:
        payload = {"prompt": body.get("prompt")}
    params = canonical_params(endpoint, body)
    return {
        "v": KEY_VERSION,
        "tenant": tenant,
        "endpoint": endpoint,
        "model": body.get("model"),
        **payload,
        "params": params,
    }


def digest(value: Any) -> str:
    """SHA-256 hex digest of a value's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def request_digest(endpoint: Endpoint, body: Mapping[str, Any], tenant: str) -> str:
    """SHA-256 hex digest of the canonical request."""
    return digest(canonical_request(endpoint, body, tenant))


def exact_key(prefix: str, endpoint: Endpoint, body: Mapping[str, Any], tenant: str,
              request_sha: str | None = None) -> str:
    """Redis key of the exact-cache entry: ``{prefix}:exact:{sha256 of canonical request}``;
    ``request_sha``: that digest if already computed (``CacheRequest.digest``)."""
    return f"{prefix}:exact:{request_sha or request_digest(endpoint, body, tenant)}"
