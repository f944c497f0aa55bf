"""In-process nearest-neighbour index of semantic cache entries, partitioned by scope.

A derived copy of what Redis holds (Redis stays the source of truth; every candidate is re-read
there before it is served). No I/O here.

Why partitions instead of one filtered index: a scope (tenant + model + system prompt + earlier
turns + parameters) is very selective, often a handful of entries among many thousands, and
filtered HNSW search degrades towards a full graph walk when few nodes pass the filter. So each
scope gets its own partition: a flat numpy matrix searched exactly while it is small (a
384 x 2,048 dot product is tens of microseconds), promoted to an hnswlib graph past
``hnsw_min_entries``. hnswlib was chosen over faiss-cpu and usearch because it supports deletes
with slot reuse (``mark_deleted`` + ``replace_deleted``; faiss's HNSW cannot remove vectors),
resizing, and inner-product space on normalised vectors, in a small, long-stable package.

Memory bound: at most ``max_entries`` vectors. When full, the entry that expires soonest is
evicted first (with a fixed TTL that is also the oldest), the same rule the Redis store applies,
so every worker evicts the same entries.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import hnswlib
import numpy as np


@dataclass(frozen=True)
class Neighbour:
    """One search result: the entry id and its cosine similarity to the query (-1..1)."""

    entry_id: str
    similarity: float


class _Flat:
    """Exact search over a growable matrix; removal swaps the last row into the hole."""

    def __init__(self, dim: int) -> None:
        self.ids: list[str] = []
        self.rows: dict[str, int] = {}
        self.vectors = np.zeros((16, dim), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, entry_id: str, vector: np.ndarray) -> None:
        n = len(self.ids)
        if n == len(self.vectors):
            self.vectors = np.concatenate([self.vectors, np.zeros_like(self.vectors)])
        self.vectors[n] = vector
        self.ids.append(entry_id)
        self.rows[entry_id] = n

    def remove(self, entry_id: str) -> None:
        row = self.rows.pop(entry_id)
        last = len(self.ids) - 1
        if row != last:
            moved = self.ids[last]
            self.vectors[row] = self.vectors[last]
            self.ids[row] = moved
            self.rows[moved] = row
        self.ids.pop()

    def search(self, vector: np.ndarray, k: int) -> list[Neighbour]:
        n = len(self.ids)
        if n == 0:
            return []
        sims = self.vectors[:n] @ vector
        top = np.argsort(-sims)[:k]
        return [Neighbour(self.ids[i], float(sims[i])) for i in top]


class _Graph:
    """hnswlib graph in inner-product space (vectors are unit length, so 1 - distance = cosine)."""

    def __init__(self, dim: int, capacity: int, ef: int) -> None:
        self.graph = hnswlib.Index(space="ip", dim=dim)
        self.graph.init_index(max_elements=capacity, ef_construction=100, M=16, allow_replace_deleted=True)
        self.ef = ef
        self.labels: dict[str, int] = {}
        self.ids: dict[int, str] = {}
        self._next_label = 0

    def __len__(self) -> int:
        return len(self.labels)

    def add(self, entry_id: str, vector: np.ndarray) -> None:
        if len(self.labels) >= self.graph.get_max_elements():
            self.graph.resize_index(2 * self.graph.get_max_elements())
        label = self._next_label
        self._next_label += 1
        self.graph.add_items(vector.reshape(1, -1), np.array([label]), replace_deleted=True)
        self.labels[entry_id] = label
        self.ids[label] = entry_id

    def remove(self, entry_id: str) -> None:
        label = self.labels.pop(entry_id)
        del self.ids[label]
        self.graph.mark_deleted(label)

    def search(self, vector: np.ndarray, k: int) -> list[Neighbour]:
        k = min(k, len(self.labels))
        if k == 0:
            return []
        self.graph.set_ef(max(self.ef, k))
        labels, distances = self.graph.knn_query(vector.reshape(1, -1), k=k)
        return [
            Neighbour(self.ids[int(label)], 1.0 - float(dist))
            for label, dist in zip(labels[0], distances[0], strict=True)
        ]


class ScopedIndex:
    """Vectors grouped by scope; search never crosses scopes.

    dim: vector length; vectors must be L2-normalised float32. max_entries: memory bound (see
    module doc for the eviction rule). hnsw_min_entries: partition size at which exact search is
    replaced by an HNSW graph. ef: HNSW search breadth (recall vs time).
    """

    def __init__(self, dim: int, max_entries: int, hnsw_min_entries: int = 2048, ef: int = 64) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.dim = dim
        self.max_entries = max_entries
        self._hnsw_min = hnsw_min_entries
        self._ef = ef
        self._parts: dict[str, _Flat | _Graph] = {}
        self._entries: dict[str, tuple[str, float]] = {}  # id -> (scope, expires_at)
        self._expiry: list[tuple[float, str]] = []  # heap, may hold stale pairs
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._entries

    def add(self, entry_id: str, scope: str, vector: np.ndarray, expires_at: float) -> list[str]:
        """Insert or replace one entry; returns the ids evicted to stay within max_entries."""
        if entry_id in self._entries:
            self.remove(entry_id)
        vector = np.asarray(vector, dtype=np.float32).reshape(self.dim)
        part = self._parts.get(scope)
        if part is None:
            part = self._parts[scope] = _Flat(self.dim)
        elif isinstance(part, _Flat) and len(part) + 1 >= self._hnsw_min:
            part = self._parts[scope] = self._promote(part)
        part.add(entry_id, vector)
        self._entries[entry_id] = (scope, expires_at)
        heapq.heappush(self._expiry, (expires_at, entry_id))
        if len(self._expiry) > 2 * len(self._entries) + 64:
            # removals leave stale heap pairs behind; rebuild so the heap stays bounded too
            self._expiry = [(exp, eid) for eid, (_, exp) in self._entries.items()]
            heapq.heapify(self._expiry)
        evicted: list[str] = []
        while len(self._entries) > self.max_entries:
            victim = self._pop_soonest()
            if victim is None:
                break
            evicted.append(victim)
            self.evictions += 1
        return evicted

    def remove(self, entry_id: str) -> bool:
        """Drop one entry; False when it was not indexed."""
        found = self._entries.pop(entry_id, None)
        if found is None:
            return False
        scope = found[0]
        part = self._parts[scope]
        part.remove(entry_id)
        if len(part) == 0:
            del self._parts[scope]
        return True

    def drop_expired(self, now: float) -> list[str]:
        """Remove entries whose expiry time (Unix s) is <= now; returns their ids."""
        dropped: list[str] = []
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, entry_id = heapq.heappop(self._expiry)
            current = self._entries.get(entry_id)
            if current is not None and current[1] == expires_at:
                self.remove(entry_id)
                dropped.append(entry_id)
        return dropped

    def search(self, scope: str, vector: np.ndarray, k: int = 4) -> list[Neighbour]:
        """Up to k nearest entries of one scope, most similar first."""
        part = self._parts.get(scope)
        if part is None:
            return []
        return part.search(np.asarray(vector, dtype=np.float32).reshape(self.dim), k)

    def clear(self) -> None:
        self._parts.clear()
        self._entries.clear()
        self._expiry.clear()

    def _pop_soonest(self) -> str | None:
        while self._expiry:
            expires_at, entry_id = heapq.heappop(self._expiry)
            current = self._entries.get(entry_id)
            if current is not None and current[1] == expires_at:
                self.remove(entry_id)
                return entry_id
        return None

    def _promote(self, flat: _Flat) -> _Graph:
        graph = _Graph(self.dim, capacity=max(2 * self._hnsw_min, 2 * len(flat)), ef=self._ef)
        for entry_id in list(flat.ids):
            graph.add(entry_id, flat.vectors[flat.rows[entry_id]])
        return graph
