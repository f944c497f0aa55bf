"""OpenAI server-sent events: replay a cached response, assemble a streamed one.

Shapes follow the OpenAI streaming API (``chat.completion.chunk`` / ``text_completion``
chunks, a final chunk with ``usage`` and empty ``choices``, then ``data: [DONE]``), which is
also what vLLM emits. Pure functions and a small incremental parser; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

DONE = b"data: [DONE]\n\n"
_PIECE_CHARS = 48  # replayed content is cut at whitespace into deltas of about this size


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _pieces(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = min(len(text), start + _PIECE_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)
            end = cut if cut > start else end
        yield text[start:end]
        start = end


def replay(response: dict[str, Any]) -> Iterator[bytes]:
    """SSE events (bytes, each ``data: ...\\n\\n``) that stream a non-stream response.

    response: an OpenAI ``chat.completion`` or ``text_completion`` JSON. Per choice: for chat
    a role delta, content deltas, tool calls; for completions text deltas; then one
    finish_reason chunk per choice, a usage chunk (when the response has usage), ``[DONE]``.
    """
    chat = response.get("object") == "chat.completion"
    head = {
        "id": response.get("id", ""),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response.get("created", 0),
        "model": response.get("model", ""),
    }

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return _event({**head, "choices": choices, **extra})

    for choice in response.get("choices", []):
        index = choice.get("index", 0)
        if chat:
            message = choice.get("message") or {}
            yield chunk([{"index": index, "delta": {"role": message.get("role", "assistant"), "content": ""},
                          "logprobs": None, "finish_reason": None}])
            for piece in _pieces(message.get("content") or ""):
                yield chunk([{"index": index, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}])
            calls = message.get("tool_calls")
            if calls:
                deltas = [{"index": i, **call} for i, call in enumerate(calls)]
                yield chunk([{"index": index, "delta": {"tool_calls": deltas}, "logprobs": None,
                              "finish_reason": None}])
            yield chunk([{"index": index, "delta": {}, "logprobs": None,
                          "finish_reason": choice.get("finish_reason", "stop")}])
        else:
            for piece in _pieces(choice.get("text") or ""):
                yield chunk([{"index": index, "text": piece, "logprobs": None, "finish_reason": None}])
            yield chunk([{"index": index, "text": "", "logprobs": None,
                          "finish_reason": choice.get("finish_reason", "stop")}])
    if response.get("usage") is not None:
        yield chunk([], usage=response["usage"])
    yield DONE


class StreamAssembler:
    """Rebuilds the non-stream response JSON from relayed SSE bytes.

    Feed raw upstream bytes in any split; :meth:`result` returns the assembled
    ``chat.completion`` / ``text_completion`` JSON only if the stream ended normally
    (``[DONE]`` seen, every choice has a finish_reason, no error event), else None.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._head: dict[str, Any] | None = None
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self.done = False
        self.failed = False

    def feed(self, data: bytes) -> None:
        """Consume a piece of the upstream body (bytes, any boundaries)."""
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                self._on_data(line[5:].strip())

    def _on_data(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.failed = True
            return
        if not isinstance(obj, dict) or "error" in obj:
            self.failed = True
            return
        if self._head is None:
            self._head = obj
        choices = obj.get("choices") or []
        if not isinstance(choices, list) or not all(_well_formed(c) for c in choices):
            self.failed = True  # relayed as it came, but neither assembled nor cached
            return
        if obj.get("usage"):
            self._usage = obj["usage"]
        for choice in choices:
            self._merge(choice)

    def _merge(self, choice: dict[str, Any]) -> None:
        acc = self._choices.setdefault(choice.get("index", 0), {"parts": [], "role": None, "calls": {},
                                                                "finish_reason": None})
        delta = choice.get("delta")
        if delta is None:  # text_completion chunk
            acc["parts"].append(choice.get("text") or "")
        else:
            acc["role"] = delta.get("role") or acc["role"]
            acc["parts"].append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                slot = acc["calls"].setdefault(call.get("index", 0), {"function": {"name": "", "arguments": ""}})
                for key in ("id", "type"):
                    if call.get(key):
                        slot[key] = call[key]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            acc["finish_reason"] = choice["finish_reason"]

    @property
    def first_token_seen(self) -> bool:
        """True once any choice has received content."""
        return any(any(acc["parts"]) for acc in self._choices.values())

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage object of the stream, if the replica sent one."""
        return self._usage

    def result(self) -> dict[str, Any] | None:
        """The assembled response JSON, or None if the stream did not end normally."""
        if not self.done or self.failed or self._head is None or not self._choices:
            return None
        if any(acc["finish_reason"] is None for acc in self._choices.values()):
            return None
        chat = self._head.get("object") == "chat.completion.chunk"
        choices = []
        for index in sorted(self._choices):
            acc = self._choices[index]
            text = "".join(acc["parts"])
            if chat:
                message: dict[str, Any] = {"role": acc["role"] or "assistant", "content": text}
                if acc["calls"]:
                    message["tool_calls"] = [acc["calls"][i] for i in sorted(acc["calls"])]
                choices.append({"index": index, "message": message, "logprobs": None,
                                "finish_reason": acc["finish_reason"]})
            else:
                choices.append({"index": index, "text": text, "logprobs": None,
                                "finish_reason": acc["finish_reason"]})
        out: dict[str, Any] = {
            "id": self._head.get("id", ""),
            "object": "chat.completion" if chat else "text_completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            "choices": choices,
        }
        if self._usage is not None:
            out["usage"] = self._usage
        return out


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _well_formed(choice: Any) -> bool:
    """True for a stream choice of the shape the assembler reads: an int index, a text or a
    delta whose content is text, tool calls as objects with text name/arguments. A replica
    that sends anything else (``choices: [1]``, ``content: 5``) once raised in the middle of
    the relay, so the request was neither counted nor logged."""
    if not isinstance(choice, dict) or type(choice.get("index", 0)) is not int:
        return False
    delta = choice.get("delta")
    if delta is None:
        return _text_or_none(choice.get("text"))
    if not isinstance(delta, dict) or not _text_or_none(delta.get("content")) or not _text_or_none(delta.get("role")):
        return False
    calls = delta.get("tool_calls") or []
    if not isinstance(calls, list):
        return False
    for call in calls:
        if not isinstance(call, dict) or type(call.get("index", 0)) is not int:
            return False
        fn = call.get("function") or {}
        if not isinstance(fn, dict) or not _text_or_none(fn.get("name")) or not _text_or_none(fn.get("arguments")):
            return False
        if not _text_or_none(call.get("id")) or not _text_or_none(call.get("type")):
            return False
    return True
