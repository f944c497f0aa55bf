"""Canonical form of an OpenAI request and the exact-cache key derived from it (pure).

Two requests get the same key only when an OpenAI-compatible server would produce the same
answer for both: same tenant, endpoint, **pool** (the model that answers, which the router may
take from ``X-Model`` instead of the body), body ``model``, input (messages or prompt) and every
other body field.

The rule is inverted on purpose: **every body field is in the key unless it is known not to
change the output** (``NEUTRAL_FIELDS``, each with the reason), so a field the router has never
heard of (a new vLLM sampling option, a server extension) can never make two different requests
share an answer. Within that rule, a field at its documented default equals leaving it out (a
missing ``temperature`` equals an explicit 1.0; ``min_tokens: 0`` equals no ``min_tokens``),
1 and 1.0 are the same number, and a few spellings mean the same (``stop: "x"`` == ``["x"]``,
an empty ``stop`` / ``logit_bias`` / ``tools`` / ``stop_token_ids`` / ``bad_words`` /
``chat_template_kwargs`` == none). A field at any other value, ``null`` included, counts.

Defaults: the OpenAI API reference (Chat Completions and legacy Completions) and, for the
extras vLLM accepts, vLLM's ``ChatCompletionRequest`` / ``CompletionRequest`` in
``vllm/entrypoints/openai/protocol.py`` (e.g. ``min_tokens`` 0, ``ignore_eos`` false,
``skip_special_tokens`` true, ``add_generation_prompt`` true).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

# The OpenAI APIs whose requests are keyed (cache.types re-exports it for the boundary types).
Endpoint = Literal["chat.completions", "completions", "embeddings"]

# 4: numbers kept exact: an integral float becomes the int (2**53 + 1 was 2**53 as a float).
# 3: every body field counts unless known neutral (NEUTRAL_FIELDS); the pool that answers is in
#    the key besides the body's model; message fields are all kept.
# 2: parameters at their default are left out instead of filled in.
KEY_VERSION = 4

# Body fields that do not change the generated answer, and why. Everything else is in the key.
NEUTRAL_FIELDS: dict[str, str] = {
    "stream": "transport only: the same answer sent as SSE chunks; a hit is replayed as SSE",
    "stream_options": "what a stream carries besides the answer (usage chunk); a replayed hit has it as asked",
    "user": "end-user id for the provider's abuse monitoring (OpenAI); not an input of generation",
    "safety_identifier": "OpenAI's successor of `user`: an id for abuse monitoring, not an input",
    "metadata": "tags of a stored completion (OpenAI); not an input of generation",
    "store": "whether OpenAI keeps the completion for evals/distillation; not an input",
    "prompt_cache_key": "OpenAI's routing hint for its prompt (prefix) cache; speed only",
    "request_id": "vLLM: the id the request runs under and the answer's `id`; not an input of generation",
    "priority": "vLLM: scheduling order under --scheduling-policy priority; when, not what",
}

# Output-affecting parameters with a known default (a field absent == the field at this value).
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
    # vLLM's sampling extras (protocol.py), shared by both endpoints
    "min_tokens": 0,
    "ignore_eos": False,
    "stop_token_ids": None,
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "bad_words": None,
    "allowed_token_ids": None,
    "truncate_prompt_tokens": None,
    "prompt_logprobs": None,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "structured_outputs": None,
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
    # vLLM's chat extras
    "echo": False,
    "add_generation_prompt": True,
    "continue_final_message": False,
    "add_special_tokens": False,
    "chat_template": None,
    "chat_template_kwargs": None,
    "documents": None,
}
_COMPLETION_DEFAULTS: dict[str, Any] = {
    **_COMMON_DEFAULTS,
    "max_tokens": 16,
    "suffix": None,
    "echo": False,
    "best_of": 1,
}
# OpenAI's embeddings API and vLLM's EmbeddingCompletionRequest.
_EMBEDDING_DEFAULTS: dict[str, Any] = {
    "encoding_format": "float",
    "dimensions": None,
    "truncate_prompt_tokens": None,
    "add_special_tokens": True,
}
_DEFAULTS = {"chat.completions": _CHAT_DEFAULTS, "completions": _COMPLETION_DEFAULTS, "embeddings": _EMBEDDING_DEFAULTS}
# The fields that hold the input, kept apart from the parameters.
_INPUT_FIELDS = {
    "chat.completions": ("model", "messages"),
    "completions": ("model", "prompt"),
    "embeddings": ("model", "input"),
}
# Message fields where null means the same as leaving the field out; any other field of a
# message (known or not) is kept with whatever value it has.
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal")
# An empty collection in these fields means the same as none.
_EMPTY_IS_NONE = ("stop", "logit_bias", "stop_token_ids", "bad_words", "chat_template_kwargs")


def _number(value: Any) -> Any:
    # 1 and 1.0 mean the same sampling setting; JSON would tell them apart. An integral float
    # becomes the int, never the other way round: an int of any size stays exact (seeds 2**53
    # and 2**53 + 1 are two keys), and one too large for a float cannot overflow.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _content(content: Any) -> Any:
    """A single text part means the same as the plain string."""
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], Mapping):
        part = content[0]
        if part.get("type") == "text" and isinstance(part.get("text"), str) and len(part) == 2:
            return part["text"]
    return content


def canonical_messages(messages: Any) -> list[dict[str, Any]]:
    """messages: the OpenAI ``messages`` list -> the same list in canonical form (pure).

    Every field of a message is kept (a field the router does not know may change the answer);
    a known field (role, content, name, tool_calls, tool_call_id, refusal) set to null is left
    out, and ``content`` is normalised (one text part == the string). Content of any other shape
    (images, audio) is kept verbatim so it is cached exactly; a message that is not an object is
    kept as ``{"raw": value}``.
    """
    out: list[dict[str, Any]] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, Mapping):
            out.append({"raw": message})
            continue
        item = {f: v for f, v in message.items() if not (v is None and f in _MESSAGE_FIELDS)}
        if "content" in item:
            item["content"] = _content(item["content"])
        out.append(item)
    return out


def _is_default(value: Any, default: Any) -> bool:
    # same type as well as equal: logprobs 0 is not logprobs False, although 0 == False
    return type(value) is type(default) and value == default


def _params(endpoint: Endpoint, body: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    # Every field but the input and the neutral ones, minus those at their default: a missing
    # field and its explicit default give the same (usually empty) dict, and a request pays for
    # the few fields it has, not for every known parameter (this runs on every request's path).
    inputs = _INPUT_FIELDS[endpoint]
    params = {name: _number(value) for name, value in body.items() if name not in inputs and name not in NEUTRAL_FIELDS}
    if endpoint == "chat.completions" and "max_completion_tokens" in params:
        # OpenAI's newer name of max_tokens: the same limit under either name
        limit = params.pop("max_completion_tokens")
        if limit is not None:
            if params.get("max_tokens") in (None, limit):
                params["max_tokens"] = limit
            else:  # both, different: kept apart (what the server makes of it is its business)
                params["max_completion_tokens"] = limit
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    for name in _EMPTY_IS_NONE:
        value = params.get(name)
        if isinstance(value, (list, dict)) and not value:
            params[name] = None
    if "tools" in defaults and not params.get("tools") and isinstance(params.get("tools"), (list, type(None))):
        params.pop("tools", None)
    if "tool_choice" in defaults:
        # OpenAI: "none" without tools, "auto" with tools.
        if params.get("tool_choice") == ("auto" if params.get("tools") else "none"):
            params["tool_choice"] = None
    return {
        name: value
        for name, value in params.items()
        if not (name in defaults and _is_default(value, _number(defaults[name])))
    }


def canonical_params(endpoint: Endpoint, body: Mapping[str, Any]) -> dict[str, Any]:
    """Every body field but the input (``model``, ``messages`` / ``prompt``) and the neutral
    ones (``NEUTRAL_FIELDS``), minus those at their documented default (pure): two requests that
    mean the same generation get equal dicts (a missing ``temperature`` and an explicit 1.0 both
    leave it out; 1 and 1.0 are the same number), and a field the module does not know is kept
    with its value, ``null`` included."""
    return _params(endpoint, body, _DEFAULTS[endpoint])


def canonical_request(
    endpoint: Endpoint, body: Mapping[str, Any], tenant: str, pool: str | None = None
) -> dict[str, Any]:
    """The canonical, JSON-serialisable form of a request for exact matching.

    endpoint: ``chat.completions``, ``completions`` or ``embeddings``; body: the request JSON; tenant: the
    tenant name; pool: the model (pool) whose replicas answer, None = the body's ``model``.
    The router sends a request to the pool named by ``X-Model`` when present, so the pool and
    the body's ``model`` are both part of the key. Never raises on odd content: whatever is
    not understood is kept verbatim.
    """
    if endpoint == "chat.completions":
        payload: dict[str, Any] = {"messages": canonical_messages(body.get("messages"))}
    elif endpoint == "embeddings":
        payload = {"input": body.get("input")}
    else:
        payload = {"prompt": body.get("prompt")}
    return {
        "v": KEY_VERSION,
        "tenant": tenant,
        "endpoint": endpoint,
        "pool": body.get("model") if pool is None else pool,
        "model": body.get("model"),
        **payload,
        "params": canonical_params(endpoint, body),
    }


def digest(value: Any) -> str:
    """SHA-256 hex digest of a value's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def request_digest(endpoint: Endpoint, body: Mapping[str, Any], tenant: str, pool: str | None = None) -> str:
    """SHA-256 hex digest of the canonical request (see ``canonical_request``)."""
    return digest(canonical_request(endpoint, body, tenant, pool))


# Redis Cluster hash tags (the part of a key inside its first ``{...}`` picks the slot). Every
# Lua script and transaction of the exact cache touches one entry and the owners list of its
# scope, so both carry the scope's tag: a tenant+pool's entries share a slot, different scopes
# spread over the cluster's nodes. The tag is a digest, not the names: a tenant or pool name may
# hold a ``}`` (which would end the tag early) and may be long.
@functools.lru_cache(maxsize=4096)  # a lookup and its store name the same few scopes (~4 us each)
def exact_scope_tag(tenant: str, model: str) -> str:
    """Hash tag of one tenant+pool scope of exact entries: 16 hex digits of SHA-256 (pure)."""
    return digest([tenant, model])[:16]


def exact_owners_key(prefix: str, tenant: str, model: str) -> str:
    """Redis key of the sorted set listing a scope's exact entries (delete by tenant/model):
    ``{prefix}:exact-owners:{<scope tag>}``, in the slot of that scope's entries."""
    return f"{prefix}:exact-owners:{{{exact_scope_tag(tenant, model)}}}"


def exact_key(
    prefix: str,
    endpoint: Endpoint,
    body: Mapping[str, Any],
    tenant: str,
    request_sha: str | None = None,
    pool: str | None = None,
) -> str:
    """Redis key of the exact-cache entry: ``{prefix}:exact:{<scope tag>}:{sha256 of canonical
    request}``; the scope tag (:func:`exact_scope_tag`) is that of ``tenant`` and the pool that
    answers (``pool``, None = the body's ``model``), so the entry and its scope's owners list
    share a Redis Cluster slot. ``request_sha``: that digest if already computed
    (``CacheRequest.digest``)."""
    model = pool if pool is not None else str(body.get("model", ""))
    sha = request_sha or request_digest(endpoint, body, tenant, pool)
    return f"{prefix}:exact:{{{exact_scope_tag(tenant, model)}}}:{sha}"


def entry_key(prefix: str, entry_id: str) -> str:
    """Redis key of one semantic entry (layout: cache/semantic/store.py), tagged with its own id
    (its own Redis Cluster slot). Here, not in the store, because the per-entry bound
    (cache/verify/bound/store.py) keeps its state in the same hash."""
    return f"{prefix}:sem:entry:{{{entry_id}}}"
