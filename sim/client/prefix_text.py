"""Prompt texts whose shared prefixes follow a trace's prefix blocks (Mooncake ``hash_ids``).

In the Mooncake FAST'25 traces each request lists ``hash_ids``: ids of the 512-token blocks
of its prompt, equal ids = the same block of the same prefix (kvcache-ai/Mooncake
``FAST25-release``; ../shared/data/README.md). Each id maps to one deterministic text of
``BLOCK_TOKENS`` sim tokens (4 characters each, sim/replica/tokens.py), so equal ids give equal text
and different ids different text (hex of SHA-256: two blocks agree on a character by chance,
never on a 16-token KV block in practice); a request's prompt is its
blocks' texts in order, trimmed to its input length. Two requests then share exactly the
prompt prefix the trace says they share, and a replica's prefix cache sees it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

from sim.replica.tokens import CHARS_PER_TOKEN

BLOCK_TOKENS = 512  # Mooncake's hash_ids block size (tokens)
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


@lru_cache(maxsize=4096)  # 8 MB of block texts at most
def block_text(hash_id: int) -> str:
    """The text of prefix block ``hash_id``: BLOCK_CHARS hex characters drawn from SHA-256 of
    the id (the same id always gives the same text, in any process)."""
    digests = (hashlib.sha256(f"promptedge-block:{hash_id}:{k}".encode()).hexdigest() for k in range(BLOCK_CHARS // 64))
    return "".join(digests)


def prompt_from_blocks(hash_ids: Sequence[int], tokens: int) -> str:
    """A prompt of ``tokens`` sim tokens (4 characters each) made of ``hash_ids``' block texts
    in order, trimmed; shorter when the blocks end first. Raises ValueError for tokens < 0."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    chars = tokens * CHARS_PER_TOKEN
    needed = -(-chars // BLOCK_CHARS)
    return "".join(block_text(h) for h in hash_ids[:needed])[:chars]
