"""ScopedIndex (pure) and BatchingEmbedder with a stand-in encoder (no model needed)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from cache.embed.batching import BatchingEmbedder
from cache.errors import EmbedderBusy, EmbeddingError
from cache.semantic.index import ScopedIndex


def unit(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_search_never_crosses_scopes() -> None:
    index = ScopedIndex(dim=8, max_entries=10)
    index.add("a", "scope-1", unit(1), expires_at=100)
    index.add("b", "scope-2", unit(1), expires_at=100)
    [hit] = index.search("scope-1", unit(1), k=5)
    assert hit.entry_id == "a" and hit.similarity == pytest.approx(1.0, abs=1e-5)
    assert index.search("scope-3", unit(1)) == []


def test_full_index_evicts_the_entry_that_expires_soonest() -> None:
    index = ScopedIndex(dim=8, max_entries=3)
    for i, expires_at in enumerate([50, 10, 30]):
        assert index.add(f"e{i}", "s", unit(i), expires_at) == []
    assert index.add("e3", "s", unit(3), expires_at=40) == ["e1"]
    assert "e1" not in index and len(index) == 3


def test_remove_and_expiry_drop_entries() -> None:
    index = ScopedIndex(dim=8, max_entries=10)
    index.add("old", "s", unit(1), expires_at=10)
    index.add("new", "s", unit(2), expires_at=20)
    assert index.drop_expired(now=15) == ["old"]
    assert index.remove("new") and not index.remove("new")
    assert len(index) == 0 and index.search("s", unit(2)) == []


def test_large_scope_moves_to_hnsw_and_still_finds_neighbours() -> None:
    index = ScopedIndex(dim=8, max_entries=1000, hnsw_min_entries=16)
    for i in range(200):
        index.add(f"e{i}", "s", unit(i), expires_at=100)
    for i in (0, 57, 199):
        assert index.search("s", unit(i), k=1)[0].entry_id == f"e{i}"
    index.remove("e57")
    assert index.search("s", unit(57), k=1)[0].entry_id != "e57"
    index.add("e57", "s", unit(57), expires_at=100)  # slot reuse after a delete
    assert index.search("s", unit(57), k=1)[0].entry_id == "e57"


class CountingEncoder:
    dim = 4

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.fail = fail

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail:
            raise RuntimeError("model exploded")
        self.calls.append(len(texts))
        return np.array([[len(t), 1, 0, 0] for t in texts], dtype=np.float32)


async def test_concurrent_requests_share_one_forward_pass() -> None:
    encoder = CountingEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.002, max_batch=32)
    texts = [f"question {i}" * (i + 1) for i in range(20)] + ["question 0"]  # one duplicate
    vectors = await asyncio.gather(*(embedder.embed(t) for t in texts))
    assert encoder.calls == [20]
    assert [v[0] for v in vectors] == [len(t) for t in texts]
    await embedder.embed("question 0")  # served from the recent-text cache
    assert encoder.calls == [20]
    embedder.close()


async def test_batches_are_bounded() -> None:
    encoder = CountingEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.0, max_batch=8)
    await asyncio.gather(*(embedder.embed(str(i)) for i in range(20)))
    assert encoder.calls == [8, 8, 4]
    embedder.close()


async def test_encoder_failure_reaches_every_waiter() -> None:
    embedder = BatchingEmbedder(CountingEncoder(fail=True), window_s=0.0)
    results = await asyncio.gather(embedder.embed("a"), embedder.embed("b"), return_exceptions=True)
    assert all(isinstance(r, EmbeddingError) for r in results)
    embedder.close()


class NanEncoder(CountingEncoder):
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = super().encode(texts)
        vectors[-1, 0] = np.nan  # a damaged model file: one text's vector is NaN
        return vectors


async def test_a_nan_vector_is_an_error_for_every_waiter_and_never_remembered() -> None:
    embedder = BatchingEmbedder(NanEncoder(), window_s=0.002)
    results = await asyncio.gather(embedder.embed("a"), embedder.embed("bb"), return_exceptions=True)
    assert all(isinstance(r, EmbeddingError) and "non-finite" in str(r) for r in results)
    embedder.encoder = CountingEncoder()  # a sound encoder: nothing NaN was kept for these texts
    assert (await embedder.embed("a"))[0] == 1
    embedder.close()


class SlowEncoder(CountingEncoder):
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import time

        time.sleep(0.2)  # a busy machine
        return super().encode(texts)


async def test_texts_whose_callers_gave_up_are_not_encoded() -> None:
    encoder = SlowEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.0, max_batch=1)
    first = asyncio.create_task(embedder.embed("first", timeout_s=5.0))
    await asyncio.sleep(0.01)  # "first" is encoding; the next two queue behind it
    results = await asyncio.gather(
        embedder.embed("late", timeout_s=0.05), embedder.embed("later", timeout_s=0.05), return_exceptions=True
    )
    assert all(isinstance(r, TimeoutError) for r in results)
    assert (await first)[0] == len("first")
    await asyncio.sleep(0.05)
    assert encoder.calls == [1] and embedder.dropped == 2
    embedder.close()


async def test_a_busy_embedder_refuses_at_once_and_an_idle_one_accepts() -> None:
    encoder = SlowEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.0, max_batch=4)
    await embedder.embed("learn the pass time")  # one pass measured: ~0.2 s
    running = asyncio.create_task(embedder.embed("busy now", timeout_s=5.0))
    await asyncio.sleep(0.01)
    with pytest.raises(EmbedderBusy):
        await embedder.embed("cannot wait", timeout_s=0.05)
    assert embedder.refused == 1
    await running
    assert (await embedder.embed("idle again", timeout_s=0.05 + 0.5))[0] == len("idle again")
    embedder.close()


class BlockingEncoder(CountingEncoder):
    """Each pass blocks until `release` is set; records how many passes ran at once."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.lock = threading.Lock()
        self.release = threading.Event()
        self.active = 0
        self.most_active = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            self.release.wait(timeout=5.0)
            return super().encode(texts)
        finally:
            with self.lock:
                self.active -= 1


async def test_lanes_run_passes_at_once() -> None:
    encoder = BlockingEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.0, max_batch=32, lanes=2)
    first = asyncio.create_task(embedder.embed("first"))
    while encoder.active < 1:  # "first" holds lane 1
        await asyncio.sleep(0.001)
    second = asyncio.create_task(embedder.embed("second"))
    while encoder.active < 2:  # a free lane takes "second" without waiting for lane 1
        await asyncio.sleep(0.001)
    third = asyncio.create_task(embedder.embed("third"))  # both lanes busy: waits
    await asyncio.sleep(0.01)
    assert encoder.calls == [] and encoder.most_active == 2
    encoder.release.set()
    await asyncio.gather(first, second, third)
    assert sorted(encoder.calls) == [1, 1, 1] and encoder.most_active == 2
    embedder.close()


async def test_pending_texts_are_split_over_free_lanes() -> None:
    encoder = CountingEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.0, max_batch=32, lanes=2)
    await asyncio.gather(*(embedder.embed(str(i)) for i in range(20)))
    assert sorted(encoder.calls) == [10, 10]
    embedder.close()


async def test_a_lone_request_does_not_wait_for_the_window() -> None:
    # the window only applies while another pass runs: a lone request finishes long before it
    embedder = BatchingEmbedder(CountingEncoder(), window_s=30.0, lanes=2)
    assert (await embedder.embed("alone", timeout_s=5.0))[0] == len("alone")
    embedder.close()


async def test_busy_estimate_counts_every_lane() -> None:
    encoder = SlowEncoder()
    embedder = BatchingEmbedder(encoder, window_s=0.0, max_batch=4, lanes=2)
    await embedder.embed("learn the pass time")  # ~0.2 s
    running = [asyncio.create_task(embedder.embed(t, timeout_s=5.0)) for t in ("one", "two")]
    await asyncio.sleep(0.01)  # two passes of one text each: both lanes busy
    with pytest.raises(EmbedderBusy):
        await embedder.embed("cannot wait", timeout_s=0.05)
    await asyncio.gather(*running)
    assert (await embedder.embed("idle again", timeout_s=0.05 + 0.5))[0] == len("idle again")
    embedder.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
async def test_encoder_threads_run_below_the_event_loops_priority() -> None:
    seen: list[int] = []

    class PriorityEncoder(CountingEncoder):
        def encode(self, texts: Sequence[str]) -> np.ndarray:
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return super().encode(texts)

    loop_priority = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    embedder = BatchingEmbedder(PriorityEncoder(), lanes=2, nice=5)
    await asyncio.gather(embedder.embed("a"), embedder.embed("b"))
    assert seen and all(p == min(19, loop_priority + 5) for p in seen)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_priority  # the loop keeps its own
    embedder.close()
