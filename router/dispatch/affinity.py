"""Prompt-prefix affinity: remember which replica served a long prompt prefix recently.

vLLM and SGLang keep the KV cache of recent prefixes (automatic prefix caching): a request
whose prompt starts like a recent one is prefilled much faster on the replica that served
it. The key is a hash of the first ``prefix_chars`` characters of the prompt (roles and
contents of the messages in order), so it exists only for prompts at least that long; the
entry expires after ``ttl_s`` (the replica's prefix cache may have evicted it by then).
Dispatch prefers that replica while its load stays within bounds (``router.dispatch``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any


def prefix_key(body: Mapping[str, Any], chars: int) -> int | None:
    """Hash of the prompt's first ``chars`` characters, None if the prompt is shorter."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        size = 0
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            text = content if isinstance(content, str) else repr(content)
            parts.append(f"{message.get('role')}\x1f{text}\x1e")
            size += len(parts[-1])
            if size >= chars:
                break
        prompt = "".join(parts)
    else:
        raw = body.get("prompt")
        prompt = raw if isinstance(raw, str) else ""
    return hash(prompt[:chars]) if len(prompt) >= chars else None


class PrefixMap:
    """Bounded LRU map prefix key -> (replica URL, time seen); times are monotonic seconds."""

    def __init__(self, ttl_s: float, max_entries: int = 50_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def get(self, key: int | None, now: float) -> str | None:
        """The replica that served ``key`` within the TTL, else None."""
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None or now - entry[1] > self.ttl_s:
            return None
        return entry[0]

    def put(self, key: int | None, url: str, now: float) -> None:
        """Remember that ``url`` serves ``key`` as of ``now``."""
        if key is None:
            return
        self._entries[key] = (url, now)
        self._entries.move_to_end(key)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
