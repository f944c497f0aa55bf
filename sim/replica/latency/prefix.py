"""vLLM's automatic prefix caching, modelled on token blocks (pure: no clock, no I/O).

The model follows vLLM V1's KV cache manager in shape (``vllm/v1/core/kv_cache_manager.py``,
``block_pool.py``, ``kv_cache_utils.py``):

- The KV pool is ``num_blocks`` blocks of ``block_size`` tokens (vLLM's ``--block-size``,
  16 by default on GPUs).
- A prompt's *full* blocks get chained hashes: block i's hash covers block i-1's hash and block
  i's token ids, so two prompts share a block hash exactly when they share every token up to
  that block's end (:func:`block_hashes`). A partial last block is never cached.
- A new request reuses the longest run of its leading block hashes that the pool holds, at
  most ``prompt_tokens - 1`` tokens (vLLM recomputes the last prompt token to get its logits),
  and only the rest of its prompt is prefilled.
- A block whose prefill is done is registered under its hash; when its last request ends it
  stays cached but *free*: it can be evicted, least recently used first, when a new request
  needs blocks and no empty block is left. A block held by a running request is never evicted.
  Blocks of one request are released tail first, so a prompt's tail is evicted before its head
  (as vLLM frees them in reverse order).
- Counters as vLLM V1 exports them (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``,
  ``vllm/v1/metrics/loggers.py``): queries add each looked-up request's prompt tokens, hits
  the tokens found cached (``KVCacheManager.get_computed_blocks`` -> ``PrefixCacheStats``).

Hash: BLAKE2b (8-byte digest) of the parent's digest and the block's token ids in decimal,
deterministic across processes (vLLM's default is SHA-256 of a pickle, or Python's ``hash``
in older versions; any collision-resistant chained hash gives the same sharing).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on CUDA (CacheConfig.block_size)
_ROOT = b"promptedge-sim-prefix-root"


def block_hashes(token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """Chained hashes of the full ``block_size``-token blocks of ``token_ids`` (len // size
    of them; a partial last block gets none). Equal token prefixes -> equal leading hashes.
    Raises ValueError for ``block_size`` < 1."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out: list[int] = []
    parent = _ROOT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = ",".join(map(str, token_ids[start : start + block_size])).encode()
        parent = hashlib.blake2b(parent + b"|" + block, digest_size=8).digest()
        out.append(int.from_bytes(parent, "big"))
    return out


@dataclass
class _Holding:
    """What one running request holds: refs on cached blocks (in prompt order), private blocks."""

    hashes: list[int] = field(default_factory=list)
    private: int = 0


class KVBlockPool:
    """The KV pool of one replica in blocks, with the prefix cache inside it.

    ``num_blocks`` blocks of ``block_size`` tokens; ``caching``: False switches the prefix cache
    off (no lookups, nothing registered: plain block accounting). A *held* block belongs to a
    running request (a cached block may be held by several); a cached block held by none is
    free and evictable (LRU); every other block is empty.
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE, caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("need num_blocks >= 1 and block_size >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self._refs: dict[int, int] = {}  # cached block hash -> running requests holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refs == 0, oldest first
        self._held = 0  # distinct blocks held by running requests
        self._shared = 0  # sum over cached blocks of (refs - 1) when refs > 1
        self._holdings: dict[int, _Holding] = {}
        self.queries = 0  # tokens looked up (vllm:prefix_cache_queries)
        self.hits = 0  # tokens found cached (vllm:prefix_cache_hits)
        self.evictions = 0  # blocks evicted

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a registered hash (held or free)."""
        return len(self._refs)

    @property
    def held_blocks(self) -> int:
        return self._held

    @property
    def shared_tokens(self) -> int:
        """Tokens counted twice when summing every running request's KV tokens (shared blocks)."""
        return self._shared * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Leading blocks of ``hashes`` the pool holds, capped so at least one prompt token is
        left to compute (no side effects; 0 with caching off)."""
        if not self.caching:
            return 0
        cap = (prompt_tokens - 1) // self.block_size
        n = 0
        for h in hashes[:cap]:
            if h not in self._refs:
                break
            n += 1
        return n

    def can_admit(self, hashes: Sequence[int], prompt_tokens: int, footprint_tokens: int) -> bool:
        """True if a request of ``footprint_tokens`` KV tokens whose prompt starts with
        ``hashes`` fits now: its new blocks plus the free cached blocks it would hold fit in
        the blocks not held by others."""
        hit = hashes[: self.lookup(hashes, prompt_tokens)]
        revived = sum(1 for h in hit if self._refs[h] == 0)
        return self._held + revived + self.blocks_for(footprint_tokens) - len(hit) <= self.num_blocks

    def admit(self, req_id: int, hashes: Sequence[int], prompt_tokens: int, footprint_tokens: int) -> int:
        """Hold the cached prefix and allocate the rest of the footprint for ``req_id``;
        evicts free cached blocks (LRU) when empty blocks run out. Counts the lookup in
        ``queries``/``hits``. Returns the prompt tokens found cached. Call only after
        :meth:`can_admit` said yes (raises RuntimeError otherwise)."""
        if not self.can_admit(hashes, prompt_tokens, footprint_tokens):
            raise RuntimeError(f"request {req_id} does not fit the KV pool")
        n_hit = self.lookup(hashes, prompt_tokens)
        holding = _Holding()
        for h in hashes[:n_hit]:
            self._hold(h)
            holding.hashes.append(h)
        holding.private = self.blocks_for(footprint_tokens) - n_hit
        self._held += holding.private
        self._holdings[req_id] = holding
        self._evict_overflow()
        if self.caching:
            self.queries += prompt_tokens
            self.hits += n_hit * self.block_size
        return n_hit * self.block_size

    def computed(self, req_id: int, hashes: Sequence[int], prefilled_tokens: int) -> None:
        """The request's prompt is prefilled up to ``prefilled_tokens``: register its newly
        full blocks under their hashes. A hash another request registered first stays that
        request's block (this one keeps a private duplicate, as in vLLM)."""
        holding = self._holdings.get(req_id)
        if holding is None or not self.caching:
            return
        full = min(len(hashes), prefilled_tokens // self.block_size)
        while len(holding.hashes) < full:
            h = hashes[len(holding.hashes)]
            if h in self._refs:  # computed twice concurrently: the first copy is the cached one
                break
            self._refs[h] = 1
            holding.hashes.append(h)
            holding.private -= 1

    def release(self, req_id: int) -> None:
        """The request ended (finished or aborted): its private blocks become empty, its
        cached blocks free (evictable) once no other request holds them, tail first."""
        holding = self._holdings.pop(req_id, None)
        if holding is None:
            return
        self._held -= holding.private
        for h in reversed(holding.hashes):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._held -= 1
                self._evictable[h] = None
            else:
                self._shared -= 1

    def _hold(self, h: int) -> None:
        refs = self._refs[h]
        if refs == 0:
            del self._evictable[h]
            self._held += 1
        else:
            self._shared += 1
        self._refs[h] = refs + 1

    def _evict_overflow(self) -> None:
        # Free cached blocks live in the blocks nobody holds; evict the least recently used
        # until held + cached-free fits the pool again.
        while self._held + len(self._evictable) > self.num_blocks:
            h, _ = self._evictable.popitem(last=False)
            del self._refs[h]
            self.evictions += 1
