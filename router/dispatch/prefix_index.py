"""Approximate per-replica index of the prompt prefixes the router sent there (pure, no I/O).

A vLLM replica caches its prompts' KV blocks (automatic prefix caching: chained hashes of
fixed-size token blocks, evicted least recently used). The router cannot see that cache, but
it knows what it sent where, so it keeps, per replica, a bounded LRU set of the *text* blocks
of the prompts it routed there and asks how much of a new prompt's prefix each replica
probably holds.

Why text chunks approximate the replica's token blocks without its tokenizer: a tokenizer is
a deterministic function of the text, so two prompts with equal text up to character ``k``
have equal tokens up to (about) the token covering character ``k``, and the replica's
chained block hashes agree for every block inside that common token prefix. Chaining the
router's chunk hashes the same way (each chunk's hash covers its parent's) makes "chunk i
matches" mean "the whole text up to chunk i's end matches", so the matched chunks x
``chunk_chars`` is the common text prefix, within one chunk, and the replica's cached tokens
are about that over the model's characters per token. The chunk only sets the resolution and
the index's size, not correctness: 256 characters (~64 tokens at OpenAI's ~4 characters per
token, i.e. 4 vLLM blocks of 16) by default.

Capacity: a replica's KV cache holds ``kv_tokens`` tokens, i.e. about ``kv_tokens x
chars_per_token / chunk_chars`` chunks; older entries than that are probably evicted there
too, so the index forgets them (LRU, the same order vLLM evicts in). Only prompts the replica
accepted are recorded (router/forward/chooser.py ``accepted``), at most half an index of chunks each. The index is a guess:
it misses what other routers sent and what vLLM evicted early, which is why dispatch weighs
it against load and never follows it into a hotspot (router/dispatch/choice.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_CHUNK_CHARS = 256
CHARS_PER_TOKEN = 4.0  # OpenAI's rule of thumb (help.openai.com, "What are tokens and how to count them?")
# Most KV tokens one replica's index is sized for, whatever the replica reports: its
# vllm:cache_config_info labels are the replica's word, and num_gpu_blocks=10**12 made the index
# unbounded (each distinct long prompt added up to max_chunks entries of ~117 bytes). 16M tokens
# is 250k chunks (~30 MB), above any real replica (a TP-8 node of H200s holds a few million).
MAX_KV_TOKENS = 16_000_000


def prompt_text(body: Mapping[str, Any]) -> str:
    """The prompt of a chat or completion body as one string: each message's role and content
    in order (separators that no text contains), or the ``prompt`` string; '' otherwise."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                text = content if isinstance(content, str) else repr(content)
                parts.append(f"{message.get('role')}\x1f{text}\x1e")
        return "".join(parts)
    raw = body.get("prompt")
    return raw if isinstance(raw, str) else ""


def conversation(body: Mapping[str, Any]) -> tuple[str | None, float, float]:
    """(conversation key, carried share, head share) of a chat body, for ``predicted_ttft``'s stateless
    prefix state shared by router workers (router/dispatch/choice.py).

    key: a hash of the prompt up to and including its first user message, which every turn of
    one conversation repeats (None: no user message, e.g. a completion body); carried: the
    fraction 0..1 of the prompt's characters before its last assistant message, i.e. the
    previous turn's prompt, which the replica that served that turn holds in its prefix cache
    (0.0 on a first turn); head: the fraction before the first user message (a system prompt
    that other conversations share)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None, 0.0, 0.0
    lengths: list[int] = []
    first_user = last_assistant = -1
    head = ""
    head_chars = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        text = f"{message.get('role')}\x1f{content if isinstance(content, str) else repr(content)}\x1e"
        lengths.append(len(text))
        if first_user < 0:
            head += text
            if message.get("role") == "user":
                first_user = len(lengths) - 1
            else:
                head_chars += len(text)
        if message.get("role") == "assistant":
            last_assistant = len(lengths) - 1
    if first_user < 0:
        return None, 0.0, 0.0
    key = hashlib.blake2b(head.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    total = sum(lengths)
    carried = sum(lengths[:last_assistant]) / total if last_assistant > 0 and total else 0.0
    return key, carried, head_chars / total if total else 0.0


def chunk_hashes(text: str, chunk_chars: int = DEFAULT_CHUNK_CHARS, max_chunks: int | None = None) -> list[int]:
    """Chained hashes of the full ``chunk_chars``-character chunks of ``text`` (a partial last
    chunk gets none), at most ``max_chunks`` of them. Equal text prefixes -> equal leading
    hashes. Raises ValueError for ``chunk_chars`` < 1."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    count = len(text) // chunk_chars if max_chunks is None else min(len(text) // chunk_chars, max_chunks)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) != len(text):  # non-ASCII: chunk by characters, hash their UTF-8
        pieces = [text[i * chunk_chars : (i + 1) * chunk_chars].encode("utf-8", "surrogatepass") for i in range(count)]
    else:
        pieces = [data[i * chunk_chars : (i + 1) * chunk_chars] for i in range(count)]
    out: list[int] = []
    parent = b""
    for piece in pieces:
        parent = hashlib.blake2b(parent + piece, digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


class PrefixIndex:
    """One replica's recently routed prompt chunks: an LRU set of at most ``capacity`` chained
    chunk hashes (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._chunks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chunks)

    def matched(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` the index holds (no side effects)."""
        n = 0
        for h in hashes:
            if h not in self._chunks:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        """Record that a prompt with these chunk hashes was sent to this replica. The head of
        the prompt becomes the most recently used, so a prompt's tail is forgotten first (as
        vLLM evicts a finished request's tail blocks first)."""
        for h in reversed(hashes):
            self._chunks[h] = None
            self._chunks.move_to_end(h)
        while len(self._chunks) > self.capacity:
            self._chunks.popitem(last=False)


def capacity_chunks(kv_tokens: float, chunk_chars: int, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """Chunks of ``chunk_chars`` characters a KV cache of ``kv_tokens`` tokens holds (>= 1)."""
    return max(1, int(kv_tokens * chars_per_token / chunk_chars))


class PrefixIndexes:
    """The per-replica indexes of one router, keyed by replica URL. ``kv_tokens_default``:
    KV size (tokens) assumed for a replica that does not export ``vllm:cache_config_info``."""

    def __init__(self, chunk_chars: int, kv_tokens_default: int, max_chunks: int = 2048) -> None:
        self.chunk_chars = chunk_chars
        self.kv_tokens_default = kv_tokens_default
        self.max_chunks = max_chunks  # most chunks of one prompt looked at (bounds CPU per request)
        self._by_replica: dict[str, PrefixIndex] = {}

    def hashes(self, body: Mapping[str, Any]) -> list[int]:
        """The body's prompt chunk hashes (at most ``max_chunks``)."""
        return chunk_hashes(prompt_text(body), self.chunk_chars, self.max_chunks)

    def index(self, url: str, kv_tokens: float | None = None) -> PrefixIndex:
        """The index of replica ``url``, created (or resized) for ``kv_tokens`` (None: default;
        at most ``MAX_KV_TOKENS``)."""
        capacity = capacity_chunks(min(kv_tokens or self.kv_tokens_default, MAX_KV_TOKENS), self.chunk_chars)
        idx = self._by_replica.get(url)
        if idx is None:
            idx = self._by_replica[url] = PrefixIndex(capacity)
        elif idx.capacity != capacity:
            idx.capacity = capacity
            idx.add([])  # trims to the new capacity
        return idx

    def matches(self, urls: Sequence[str], hashes: Sequence[int]) -> dict[str, float]:
        """URL -> fraction 0..1 of ``hashes`` (leading) each replica's index holds; {} when
        there are no hashes (a prompt shorter than one chunk)."""
        if not hashes:
            return {}
        return {
            url: self._by_replica[url].matched(hashes) / len(hashes) if url in self._by_replica else 0.0 for url in urls
        }

    def record(self, url: str, hashes: Sequence[int], kv_tokens: float | None = None) -> None:
        """Remember that ``url`` accepted the prompt with ``hashes``: its leading ones, at most
        half the index's capacity, so no one prompt evicts more than half of what the index holds
        (a replica holds no prompt over its context, which vLLM keeps within its KV cache and
        is usually a small part of it: 32k of 400k tokens on an a100 here; a server that
        truncates an over-long prompt instead of refusing it caches only part of it)."""
        if hashes:
            idx = self.index(url, kv_tokens)
            idx.add(hashes[: max(1, idx.capacity // 2)])

    def forget(self, keep: Sequence[str]) -> None:
        """Drop the indexes of replicas not in ``keep`` (gone from discovery)."""
        for url in set(self._by_replica) - set(keep):
            del self._by_replica[url]
