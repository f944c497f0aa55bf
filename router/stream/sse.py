"""OpenAI server-sent events: replay a cached response, assemble a streamed one.

Shapes follow the OpenAI streaming API (``chat.completion.chunk`` / ``text_completion``
chunks, with ``stream_options.include_usage`` a final chunk with ``usage`` and empty
``choices``, then ``data: [DONE]``), which is also what vLLM emits. Both directions go through
the generic delta merge of ``router.stream.deltas``, so every field of the answer survives either way.
Pure functions and a small incremental parser; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from router.stream import deltas

DONE = b"data: [DONE]\n\n"
# Top-level fields of a response that are not copied onto every replayed chunk / from chunks.
_FRAME = ("id", "object", "created", "model", "choices", "usage")
_CHOICE_PARTS = ("index", "message", "delta", "text", "logprobs", "finish_reason")


MAX_DEPTH = 64  # nesting of a replica's answer; OpenAI's deepest (logprobs' top_logprobs) is under 10


def parse_json(payload: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``payload`` parsed as JSON, as a replica's answer or stream chunk is read: raises
    ValueError for invalid JSON and for nesting deeper than ``max_depth`` (arrays and objects),
    which ``json.loads`` reports as RecursionError past Python's recursion limit and which the
    recursive delta merge, the cache and ``json.dumps`` would all raise on further in."""
    try:
        value = json.loads(payload)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    level: list[Any] = [value]
    for _ in range(max_depth + 1):
        level = [v for c in level if isinstance(c, (dict, list)) for v in (c.values() if isinstance(c, dict) else c)]
        if not level:
            return value
    raise ValueError(f"JSON nested deeper than {max_depth}")


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def replay(response: dict[str, Any], include_usage: bool = True) -> Iterator[bytes]:
    """SSE events (bytes, each ``data: ...\\n\\n``) that stream a non-stream response.

    response: an OpenAI ``chat.completion`` or ``text_completion`` JSON. Every top-level field
    but the answer's (``system_fingerprint``, ``service_tier``, ...) is on every chunk, as
    OpenAI sends them. Per choice (``router.stream.deltas.message_deltas``): for chat the role delta,
    the text fields in pieces, tool calls; for completions text deltas; content with one
    token's logprobs per chunk when they line up; then the choice's finish chunk (with its
    other fields, e.g. vLLM's ``stop_reason``); with ``include_usage`` a usage chunk (when the
    response has usage) and ``"usage": null`` on the chunks before it; then ``[DONE]``.
    """
    chat = response.get("object") == "chat.completion"
    head = {
        "id": response.get("id", ""),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response.get("created", 0),
        "model": response.get("model", ""),
        **{k: v for k, v in response.items() if k not in _FRAME},
    }
    if include_usage:
        head["usage"] = None

    def chunk(choices: list[dict[str, Any]]) -> bytes:
        return _event({**head, "choices": choices})

    for choice in response.get("choices", []):
        index = choice.get("index", 0)
        extra = {k: v for k, v in choice.items() if k not in _CHOICE_PARTS}
        said = "logprobs" in choice
        if chat:
            for delta, logprobs in deltas.message_deltas(choice.get("message") or {}, choice.get("logprobs")):
                part = _with_logprobs({"index": index, "delta": delta}, logprobs, said)
                yield chunk([{**part, "finish_reason": None}])
            last: dict[str, Any] = {"delta": {}}
        else:
            for piece, logprobs in deltas.split_text(choice.get("text") or "", choice.get("logprobs")):
                part = _with_logprobs({"index": index, "text": piece}, logprobs, said)
                yield chunk([{**part, "finish_reason": None}])
            last = {"text": ""}
        yield chunk(
            [
                {
                    **_with_logprobs({"index": index, **last}, None, said),
                    "finish_reason": choice.get("finish_reason", "stop"),
                    **extra,
                }
            ]
        )
    if include_usage and response.get("usage") is not None:
        yield _event({**head, "choices": [], "usage": response["usage"]})
    yield DONE


def _with_logprobs(part: dict[str, Any], logprobs: Any, said: bool) -> dict[str, Any]:
    """A replayed choice part with its ``logprobs`` if the stored choice had the key (a choice
    without one, llama-server's when none were asked for, streams none: not even null)."""
    return {**part, "logprobs": logprobs} if said else part


# ``"usage": null``, which OpenAI (and the sim) put on every chunk of a stream that asked for
# usage; a quote inside a JSON string is escaped, so this never matches text of the answer.
_USAGE_NULL = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])|"usage"\s*:\s*null\s*,')


def strip_usage_event(event: bytes) -> bytes | None:
    """``event`` (one SSE event, without its blank line) as the client would have had it
    without asking for usage: None for the usage chunk (``choices`` empty, ``usage`` set),
    else the event without its ``"usage": null``. Used when the router asked the replica for
    usage (``stream_options.include_usage``) on the client's behalf."""
    if b'"usage"' not in event or not event.startswith(b"data:"):
        return event
    if _USAGE_NULL.search(event) is not None:
        return _USAGE_NULL.sub(b"", event)
    try:
        obj = json.loads(event[5:].strip())
    except ValueError:
        return event
    if isinstance(obj, dict) and obj.get("choices") == [] and obj.get("usage") is not None:
        return None
    return event


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# An event not ended within this many bytes is no usage chunk (a few hundred bytes): it is
# relayed as it comes (a ``"usage": null`` in it left as it is: OpenAI's chunk schema allows it)
# instead of being held whole until its end, which let one replica line of any size take the
# router's memory; a chunk of one token is a few hundred bytes.
USAGE_FILTER_MAX_HELD = 1 << 20


class UsageFilter:
    """Passes a replica's SSE bytes on whole events at a time, without the usage chunk
    (:func:`strip_usage_event`). ``feed`` returns the complete events so far (b"" while an
    event is still incomplete); ``flush`` the rest at the end of the stream, as it came."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for an event's end (less 3 of overlap)
        self._passing = False  # the event being received was too long to hold: its start is out

    def feed(self, data: bytes) -> bytes:
        """The complete events of ``data`` and what came before it, usage chunk left out.
        Linear in the bytes fed: only the new bytes are searched for an event's end (a replica's
        16 MiB event without one, fed 16 KiB at a time, took 48 s of the event loop when the
        whole buffer was searched again on every chunk)."""
        self._buf += data
        out: list[bytes] = []
        start = 0
        for end in _EVENT_END.finditer(self._buf, max(0, self._scanned - 3)):
            event: bytes | None = bytes(self._buf[start : end.start()])
            if self._passing:  # its beginning went out as it came: so does the rest
                self._passing = False
            else:
                event = strip_usage_event(event)  # type: ignore[arg-type]
            if event is not None:
                out += (event, end.group())
            start = end.end()
        del self._buf[:start]
        if len(self._buf) > USAGE_FILTER_MAX_HELD:
            # no usage chunk is this long: relayed as it comes, not held whole until its end;
            # the last 3 bytes stay, so that an event end cut across feeds is still found
            self._passing = True
            out.append(bytes(self._buf[:-3]))
            del self._buf[:-3]
        self._scanned = len(self._buf)
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever is left (an unterminated last event), unchanged."""
        rest, self._buf, self._scanned, self._passing = bytes(self._buf), bytearray(), 0, False
        return rest


_LINE_END = re.compile(rb"\r\n|\r|\n")


class StreamAssembler:
    """Rebuilds the non-stream response JSON from relayed SSE bytes (generic delta merge,
    ``router.stream.deltas``: every field of every choice, and the top-level fields of the chunks).

    Feed raw upstream bytes in any split; lines may end in CRLF, LF or CR alone (WHATWG HTML,
    "event stream interpretation"; a CRLF cut between two feeds is one line end).
    :meth:`result` returns the assembled ``chat.completion`` / ``text_completion`` JSON only if
    the stream ended normally (``[DONE]`` seen, every choice has a finish_reason, no error
    event), else None.

    max_bytes: bound on the answer being assembled (bytes of JSON as ``deltas.merge`` counts
    them, and of one line not yet ended); past it the assembler sets ``too_large``, drops what
    it holds and assembles no more, while it still reads the end (``done``), error events and
    ``usage`` (so the request is accounted for as any other). None: no bound.
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self._pending: list[bytes] = []  # the bytes of the line being received
        self._pending_bytes = 0
        self._skip_lf = False  # the last feed ended in CR: a LF opening the next one ends no line
        self._discarding = False  # the line being received is over max_bytes: dropped up to its end
        self._head: dict[str, Any] | None = None
        self._extra: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self._size = 0
        self.done = False
        self.failed = False
        self.too_large = False
        # data events read (but [DONE]): a lower bound of the tokens a stream that ends without
        # usage carried (one or more tokens per event: vLLM's stream interval and the sim batch
        # them; plus the role chunk)
        self.events = 0

    def feed(self, data: bytes) -> None:
        """Consume a piece of the upstream body (bytes, any boundaries)."""
        if self._skip_lf and data:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\n" not in data and b"\r" not in data:  # a line still coming: kept, not split again (linear)
            self._hold(data)
            return
        self._pending.append(data)
        *lines, rest = _LINE_END.split(b"".join(self._pending))
        self._skip_lf = data.endswith(b"\r")
        self._pending, self._pending_bytes = [], 0
        if self._discarding:  # the end of a line too long to keep: nothing of it is read
            self._discarding = False
            lines = lines[1:]
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload != b"[DONE]":
                    self.events += 1
                self._on_data(payload)
        self._hold(rest)

    def _hold(self, data: bytes) -> None:
        """Keep ``data`` as (part of) the line being received, unless that line is over the bound."""
        if self._discarding or not data:
            return
        self._pending_bytes += len(data)
        if self.max_bytes is not None and self._pending_bytes > self.max_bytes:
            self._too_large()
            self._discarding = True
            self._pending, self._pending_bytes = [], 0
            return
        self._pending.append(data)

    def _too_large(self) -> None:
        self.too_large = True
        self._choices.clear()  # what was assembled so far goes: it will not be stored
        self._extra.clear()

    def _on_data(self, payload: bytes) -> None:
        if self.done:  # a client stops reading at [DONE]: what follows is no answer it saw
            self.failed = True
            return
        if payload == b"[DONE]":
            self.done = True
            return
        if self.too_large and b'"usage"' not in payload and b'"error"' not in payload:
            return  # nothing more is assembled: only the usage and an error event still matter
        try:
            obj = parse_json(payload)
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
        if self.too_large:
            return
        for key, value in obj.items():
            if key not in _FRAME and (value is not None or key not in self._extra):
                self._extra[key] = value  # system_fingerprint, service_tier, ...: the last one said
        for choice in choices:
            self._size += deltas.merge(self._choices.setdefault(choice.get("index", 0), {}), choice)
        if self.max_bytes is not None and self._size > self.max_bytes:
            self._too_large()

    @property
    def usage(self) -> dict[str, Any] | None:
        """The usage object of the stream, if the replica sent one."""
        return self._usage

    def result(self) -> dict[str, Any] | None:
        """The assembled response JSON, or None if the stream did not end normally."""
        if not self.done or self.failed or self.too_large or self._head is None or not self._choices:
            return None
        if any(acc.get("finish_reason") is None for acc in self._choices.values()):
            return None
        chat = self._head.get("object") == "chat.completion.chunk"
        choices = []
        for index in sorted(self._choices):
            acc = self._choices[index]
            extra = deltas.finish({k: v for k, v in acc.items() if k not in _CHOICE_PARTS})
            part = (
                {"message": deltas.message_of(acc.get("delta") or {})}
                if chat
                else {"text": deltas.finish(acc.get("text")) or ""}
            )
            if "logprobs" in acc:  # said by the stream, if only as null
                part["logprobs"] = deltas.finish(acc["logprobs"])
            choices.append({"index": index, **part, "finish_reason": acc["finish_reason"], **extra})
        out: dict[str, Any] = {
            "id": self._head.get("id", ""),
            "object": "chat.completion" if chat else "text_completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            **self._extra,
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
