"""OpenAI stream deltas <-> whole responses, by a generic merge (pure, no field list).

A streamed answer is a sequence of chunks whose parts add up to the non-stream answer. The merge
here knows no field of the message by name, so a field a server adds (``reasoning_content``,
``refusal``, ``audio``, ``annotations``, vLLM's ``stop_reason``) is kept as it came:

- a string continues the string before it (content, reasoning, tool-call arguments), except the
  identity fields ``_REPLACED`` (``role``, ``type``, ``id``, ``index``, ``finish_reason``,
  ``stop_reason``), which are set, not appended, in case a server repeats them on every chunk;
- an object is merged key by key, recursively;
- a list of objects that carry an integer ``index`` (``tool_calls``) is merged element by
  element on that index; any other list (``logprobs.content``, the completion logprobs' token
  lists, ``annotations``) is extended;
- ``null`` never overwrites a value (it records the field when it is new), and any other value
  (a number, a boolean, a type that does not merge) replaces the one before.

``split`` is the inverse used to replay a stored answer: it cuts a message into deltas whose
merge is the message again, one chunk of logprobs per token when the logprobs line up with the
text (the way vLLM streams them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_REPLACED = frozenset({"index", "type", "role", "id", "finish_reason", "stop_reason"})
PIECE_CHARS = 48  # text without token logprobs is replayed cut at whitespace into pieces of about this size


class _Parts(list[str]):
    """A string being accumulated (joined once at the end: no quadratic concatenation)."""


class _List(list[Any]):
    """A list being accumulated, with its elements by ``index`` (``tool_calls``): a delta's
    element finds the one it continues in O(1), not by a scan of every element so far (a
    replica streaming thousands of indices held the event loop for seconds, quadratically)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_index: dict[int, dict[str, Any]] = {}


def merge(acc: dict[str, Any], delta: dict[str, Any]) -> int:
    """Merge ``delta`` (one chunk's object) into ``acc`` in place by the rules of the module.
    ``acc`` holds accumulators until :func:`finish` turns it into plain JSON values.

    Returns about how many bytes the merged answer's JSON grew by: each new text piece's
    characters, a new key's name and quotes, a new scalar's few bytes (escapes and UTF-8 widths
    not counted). The chunk's framing repeated on every delta (``index``, the ``delta`` key
    itself) counts once, as the merged answer holds it once: this is what the stream assembler
    bounds (router/stream/sse.py ``max_bytes``), not the bytes of the stream."""
    grown = 0
    for key, value in delta.items():
        old = acc.get(key)
        new = key not in acc
        if new:
            grown += len(key) + 4  # "key":
        if value is None:
            acc.setdefault(key, None)
        elif isinstance(value, str) and key not in _REPLACED and (old is None or isinstance(old, _Parts)):
            grown += len(value)
            if old is None:
                acc[key] = _Parts([value])
                grown += 2
            else:
                old.append(value)
        elif isinstance(value, dict) and isinstance(old, dict):
            grown += merge(old, value)
        elif isinstance(value, list) and isinstance(old, list) and not isinstance(old, _Parts):
            grown += _merge_list(old, value)
        else:
            acc[key], size = _fresh(value)
            if new or isinstance(value, (dict, list)):  # a scalar said again (index, role) takes no more room
                grown += size
    return grown


def _fresh(value: Any) -> tuple[Any, int]:
    """A copy of a delta's value in accumulator form (so later deltas can be merged into it),
    and its size as :func:`merge` counts it."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        return out, merge(out, value) + 2
    if isinstance(value, list):
        items = _List()
        return items, _merge_list(items, value) + 2
    if isinstance(value, str):
        return value, len(value) + 2
    return value, 8  # a number, a boolean


def _merge_list(acc: list[Any], items: list[Any]) -> int:
    by_index = (
        acc.by_index
        if isinstance(acc, _List)
        else {e["index"]: e for e in acc if isinstance(e, dict) and type(e.get("index")) is int}
    )
    grown = 0
    for item in items:
        index = item.get("index") if isinstance(item, dict) else None
        if type(index) is int and index in by_index:
            grown += merge(by_index[index], item)
            continue
        fresh, size = _fresh(item)
        grown += size + 1
        acc.append(fresh)
        if type(index) is int and isinstance(fresh, dict) and type(fresh.get("index")) is int:
            by_index.setdefault(fresh["index"], fresh)
    return grown


def finish(value: Any, drop_index: bool = False) -> Any:
    """The plain JSON value of an accumulator: strings joined; with ``drop_index``, the
    ``index`` that only said which element a delta belonged to is left out of list elements
    (a non-stream ``tool_calls`` entry has none)."""
    if isinstance(value, _Parts):
        return "".join(value)
    if isinstance(value, dict):
        return {k: finish(v, drop_index) for k, v in value.items()}
    if isinstance(value, list):
        indexed = drop_index and value and all(isinstance(v, dict) and type(v.get("index")) is int for v in value)
        items = [finish(v, drop_index) for v in value]
        if indexed:
            items = [{k: v for k, v in item.items() if k != "index"} for item in items]
        return items
    return value


def message_of(delta: dict[str, Any]) -> dict[str, Any]:
    """The non-stream ``message`` from a choice's merged deltas: role ``assistant`` unless said,
    and ``content`` null when no text came with a tool call (OpenAI's and vLLM's non-stream
    answer; a stream often opens with ``content: ""``), else the text ("" stays "")."""
    message = finish(delta, drop_index=True)
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    if message["content"] == "" and message.get("tool_calls"):
        message["content"] = None
    return {"role": message.pop("role"), "content": message.pop("content"), **message}


def _pieces(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = min(len(text), start + PIECE_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)
            end = cut if cut > start else end
        yield text[start:end]
        start = end


def _token_texts(logprobs: Any) -> list[str] | None:
    """The token strings of a logprobs object (chat: ``content[].token``; completions:
    ``tokens``), or None when it has none of that shape."""
    if not isinstance(logprobs, dict):
        return None
    entries = logprobs.get("content")
    if isinstance(entries, list) and all(isinstance(e, dict) and isinstance(e.get("token"), str) for e in entries):
        return [e["token"] for e in entries]
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
        return list(tokens)
    return None


def split_text(text: str, logprobs: Any) -> list[tuple[str, Any]]:
    """``text`` cut into (piece, logprobs of the piece) pairs whose merge gives back ``text``
    and ``logprobs``: one piece per token with that token's slice of every per-token list when
    the logprobs' tokens spell ``text``; else pieces at whitespace, the whole logprobs object
    on the first (or a lone ("", logprobs) pair when there is no text)."""
    tokens = _token_texts(logprobs)
    if tokens and "".join(tokens) == text:
        n = len(tokens)
        # every list of one entry per token is sliced; anything else goes with the first token
        per_token = {k for k, v in logprobs.items() if isinstance(v, list) and len(v) == n}
        return [
            (tok, {k: (v[i : i + 1] if k in per_token else (v if i == 0 else None)) for k, v in logprobs.items()})
            for i, tok in enumerate(tokens)
        ]
    pieces = list(_pieces(text))
    if logprobs is None:
        return [(p, None) for p in pieces]
    if not pieces:
        return [("", logprobs)]
    return [(p, logprobs if i == 0 else None) for i, p in enumerate(pieces)]


def message_deltas(message: dict[str, Any], logprobs: Any) -> Iterator[tuple[dict[str, Any], Any]]:
    """(delta, logprobs) pairs that stream a non-stream ``message``: first the role with every
    null field and an empty ``content`` when it is text (as OpenAI opens a stream); then each
    text field in pieces (``content`` with its logprobs); a list of objects one element per
    delta, with its ``index``; any other value in one delta."""
    head: dict[str, Any] = {"role": message.get("role", "assistant")}
    for key, value in message.items():
        if value is None:
            head[key] = None
    if isinstance(message.get("content"), str):
        head["content"] = ""
    yield head, None
    pending_logprobs = logprobs
    for key, value in message.items():
        if key == "role" or value is None:
            continue
        if isinstance(value, str):
            pairs = split_text(value, logprobs) if key == "content" else [(p, None) for p in _pieces(value)]
            if key == "content":
                pending_logprobs = None
            for piece, piece_logprobs in pairs:
                if piece or piece_logprobs is not None:
                    yield {key: piece}, piece_logprobs
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                yield {key: [{"index": i, **item}]}, None
        else:
            yield {key: value}, None
    if pending_logprobs is not None:  # logprobs without text content
        yield {}, pending_logprobs
