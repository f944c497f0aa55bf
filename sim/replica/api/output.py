"""What a simulated answer holds besides its text: reasoning, a tool call, logprobs (pure).

The engine decides how many tokens a request generates and when; this module decides what they
say, the same way whether they are streamed or not, so the concatenation of a stream's deltas
is the non-stream answer (which the router's fidelity tests rely on):

- ``reasoning_tokens``: the first tokens of a chat answer are reasoning, sent as
  ``reasoning_content`` (vLLM's field with ``--reasoning-parser``); the rest is ``content``;
- a chat request with ``tools`` and ``tool_choice`` ``"required"`` or a named function is
  answered with one tool call whose arguments are ``{"text": "<the content tokens>"}``,
  ``content`` null and ``finish_reason`` ``tool_calls``;
- logprobs (chat ``logprobs: true`` + ``top_logprobs``; completions ``logprobs: N``) for the
  content tokens, each token's logprob a fixed function of its position.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sim.replica.tokens import filler

_ARGS_HEAD = '{"text": "'
_ARGS_TAIL = '"}'


@dataclass(frozen=True)
class Shape:
    """The parts of one answer. chat: chat completion (else a text completion); reasoning:
    how many first tokens are reasoning; tool: the function called (None: a text answer);
    call_id: that call's id; logprobs: None = no logprobs, else how many top_logprobs per token."""

    chat: bool
    reasoning: int = 0
    tool: str | None = None
    call_id: str = ""
    logprobs: int | None = None


def chosen_tool(tools: Any, tool_choice: Any) -> str | None:
    """The function a chat request forces (``tool_choice`` ``"required"``: the first tool;
    ``{"type": "function", "function": {"name": N}}``: N), else None (``auto``/``none``/absent:
    the sim answers in text)."""
    if not isinstance(tools, list) or not tools:
        return None
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        return name if isinstance(name, str) else None
    if tool_choice == "required":
        first = tools[0].get("function") if isinstance(tools[0], dict) else None
        return first.get("name") if isinstance(first, dict) and isinstance(first.get("name"), str) else None
    return None


def _logprob(i: int) -> float:
    return -round(0.05 * (i % 7 + 1), 4)


def _entry(i: int, top: int) -> dict[str, Any]:
    text = filler(i, 1)
    alternatives = [filler(i + k, 1) for k in range(1, top)]
    return {
        "token": text,
        "logprob": _logprob(i),
        "bytes": list(text.encode()),
        "top_logprobs": [
            {"token": t, "logprob": _logprob(i) - k, "bytes": list(t.encode())}
            for k, t in enumerate([text, *alternatives][:top])
        ],
    }


def _logprobs(shape: Shape, start: int, end: int, offset: int) -> dict[str, Any] | None:
    """Logprobs of content tokens ``start..end-1`` (``offset``: characters of text before them)."""
    if shape.logprobs is None or end <= start:
        return None
    if shape.chat:
        return {"content": [_entry(i, shape.logprobs) for i in range(start, end)]}
    tokens = [filler(i, 1) for i in range(start, end)]
    offsets = [offset + sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [_logprob(i) for i in range(start, end)],
        "top_logprobs": [
            {filler(i + k, 1): _logprob(i) - k for k in range(shape.logprobs)} or None for i in range(start, end)
        ]
        if shape.logprobs
        else [None] * len(tokens),
        "text_offset": offsets,
    }


def delta(shape: Shape, start: int, end: int, first: bool = False) -> tuple[dict[str, Any], Any]:
    """(chat delta or completion text fields, logprobs) of generated tokens ``start..end-1``;
    ``first``: the first content chunk of a tool call (it carries the call's id and name)."""
    cut = max(start, min(end, shape.reasoning if shape.chat else 0))
    reasoning, content = filler(start, cut - start), filler(cut, end - cut)
    offset = len(filler(0, start))
    if not shape.chat:
        return {"text": content}, _logprobs(shape, start, end, offset)
    out: dict[str, Any] = {}
    if reasoning:
        out["reasoning_content"] = reasoning
    if shape.tool is not None:
        if content or first:
            call: dict[str, Any] = {"index": 0, "function": {"arguments": (_ARGS_HEAD if first else "") + content}}
            if first:
                call.update(id=shape.call_id, type="function")
                call["function"]["name"] = shape.tool
            out["tool_calls"] = [call]
        return out, None
    if content:
        out["content"] = content
    return out, _logprobs(shape, cut, end, 0)


def closing_delta(shape: Shape) -> dict[str, Any] | None:
    """The delta that closes a streamed tool call's arguments (None when there is none)."""
    if shape.chat and shape.tool is not None:
        return {"tool_calls": [{"index": 0, "function": {"arguments": _ARGS_TAIL}}]}
    return None


def finish_reason(shape: Shape) -> str:
    """``tool_calls`` for a tool call, else ``length`` (every sim answer runs to max_tokens)."""
    return "tool_calls" if shape.chat and shape.tool is not None else "length"


def whole(shape: Shape, total: int, echoed: str = "") -> dict[str, Any]:
    """The non-stream choice (without ``index``) of an answer of ``total`` tokens; ``echoed``:
    the prompt a completion with ``echo`` starts with (no logprobs for it)."""
    parts, logprobs = delta(shape, 0, total)
    if not shape.chat:
        if logprobs is not None and echoed:
            logprobs = None  # the sim has no tokens for the prompt
        return {"text": echoed + parts["text"], "logprobs": logprobs, "finish_reason": finish_reason(shape)}
    message: dict[str, Any] = {"role": "assistant", "content": parts.get("content", "")}
    if "reasoning_content" in parts:
        message["reasoning_content"] = parts["reasoning_content"]
    if shape.tool is not None:
        content = filler(min(total, shape.reasoning), total - min(total, shape.reasoning))
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": shape.call_id,
                "type": "function",
                "function": {"name": shape.tool, "arguments": json.dumps({"text": content})},
            }
        ]
    return {"message": message, "logprobs": logprobs, "finish_reason": finish_reason(shape)}
