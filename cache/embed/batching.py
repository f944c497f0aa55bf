"""Micro-batched encoding off the event loop: ``BatchingEmbedder``.

Encoding is CPU work, so it runs on dedicated threads (one per lane, one lane per core), never on
the event loop. Concurrent lookups are micro-batched: texts that arrive while passes run share
the next passes, up to ``max_batch`` texts each; a lone request starts at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cache.embed.encoder import Encoder, check_finite
from cache.errors import EmbedderBusy, EmbeddingError


def lower_thread_priority(nice: int) -> None:
    """Thread-pool initializer: make the calling thread ``nice`` steps less favoured by the
    scheduler (Linux, where a thread id is a task of its own; elsewhere setpriority would change
    the whole process, so nothing happens). Embedding is the bulk CPU work of a router process:
    at a lower priority it cannot starve the event loop or a Redis on the same small machine of
    CPU, and on an idle machine it runs as fast as before. Never raises (not permitted: stays)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        pass


class BatchingEmbedder:
    """Async, micro-batching front of an Encoder with a small LRU of recent texts.

    ``await embed(text, timeout_s)`` returns the (dim,) float32 unit vector. Up to ``lanes``
    forward passes run at once, each on its own thread (one per CPU core: on this 2-core machine
    two one-thread passes beat one two-thread pass, see cache/README.md). A free lane takes the
    pending texts at the end of the current event-loop turn, so a lone request never waits for
    company; requests that arrive while passes run form the next batches, split evenly over the
    lanes that free up (at most ``max_batch`` texts each). ``window_s`` > 0 makes a free lane
    wait that long for more texts when another pass is already running (0: never wait).
    Identical texts in flight share one encode. The LRU (``cache_size`` texts) lets ``store``
    reuse the vector its ``lookup`` computed. Raises EmbeddingError when the encoder fails,
    TimeoutError past timeout_s, and EmbedderBusy at once when the work queued ahead (estimated
    from recent pass times) would not finish within timeout_s. A text whose every caller has
    given up is dropped before it is encoded. So an overloaded embedder sheds work instead of
    queueing it, and one with a free lane always accepts (which is how it notices that it has
    recovered). The encoder must be safe to call from ``lanes`` threads at once. ``nice`` > 0
    runs the encoder threads that much below the event loop's priority (Linux).
    """

    def __init__(
        self,
        encoder: Encoder,
        *,
        window_s: float = 0.0,
        max_batch: int = 32,
        cache_size: int = 4096,
        lanes: int = 1,
        nice: int = 0,
    ) -> None:
        self.encoder = encoder
        self.dim = encoder.dim
        self._window_s = window_s
        self._max_batch = max_batch
        self._cache_size = cache_size
        self._lanes = max(1, lanes)
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, tuple[asyncio.Future[np.ndarray], float]] = {}  # text -> (result, deadline)
        self._runner: asyncio.Task[None] | None = None
        self._running: dict[asyncio.Task[None], float] = {}  # pass -> loop time it started
        self._lane_free: asyncio.Event | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=self._lanes,
            thread_name_prefix="cache-embed",
            initializer=lower_thread_priority,
            initargs=(nice,),
        )
        self.batches = 0  # forward passes run, for tests and the benchmark
        self.dropped = 0  # texts dropped because every caller had given up
        self.refused = 0  # requests refused as EmbedderBusy
        self._batch_s: float | None = None  # moving average of one forward pass (s)

    @property
    def lanes(self) -> int:
        return self._lanes

    async def embed(self, text: str, timeout_s: float = 60.0) -> np.ndarray:
        cached = self._recent.get(text)
        if cached is not None:
            self._recent.move_to_end(text)
            return cached
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        future, known = self._pending.get(text, (None, 0.0))
        if future is None and self._expected_wait(loop.time()) > timeout_s:
            self.refused += 1
            raise EmbedderBusy(f"embedding queue would take longer than {timeout_s} s")
        if future is None:
            future = loop.create_future()
            if self._runner is None or self._runner.done():
                self._runner = asyncio.create_task(self._run())
        self._pending[text] = (future, max(deadline, known))
        # shield: one caller giving up must not cancel the result other callers share
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)

    async def _run(self) -> None:
        """Hand pending texts to free lanes until nothing is pending."""
        loop = asyncio.get_running_loop()
        if self._lane_free is None:
            self._lane_free = asyncio.Event()
        await asyncio.sleep(0)  # requests made in the same event-loop turn share a pass
        while self._pending:
            if len(self._running) >= self._lanes:
                self._lane_free.clear()
                await self._lane_free.wait()
                continue
            if self._running and self._window_s > 0 and len(self._pending) < self._max_batch:
                # others are encoding, so more texts are likely to come: gather company (lanes
                # only free up meanwhile, so one still is after the wait)
                await asyncio.sleep(self._window_s)
            self._drop_expired(loop.time())
            free = self._lanes - len(self._running)
            take = min(self._max_batch, -(-len(self._pending) // free))  # even split over free lanes
            texts = list(self._pending)[:take]
            if not texts:
                break
            futures = [self._pending.pop(text)[0] for text in texts]
            task = asyncio.create_task(self._pass(texts, futures))
            self._running[task] = loop.time()
            task.add_done_callback(self._pass_done)

    def _drop_expired(self, now: float) -> None:
        for text, (future, deadline) in list(self._pending.items()):
            if deadline <= now:  # its callers have timed out: encoding it helps nobody
                del self._pending[text]
                future.set_exception(TimeoutError("embedding not started before its deadline"))
                future.exception()  # mark retrieved: nobody may be waiting any more
                self.dropped += 1

    async def _pass(self, texts: list[str], futures: list[asyncio.Future[np.ndarray]]) -> None:
        loop = asyncio.get_running_loop()
        self.batches += 1
        started = loop.time()
        try:
            vectors = await loop.run_in_executor(self._pool, self.encoder.encode, texts)
            # the one place every encoder's vectors reach the caches: none NaN or inf is stored or compared
            vectors = check_finite(np.asarray(vectors), getattr(self.encoder, "backend", type(self.encoder).__name__))
        except Exception as exc:  # noqa: BLE001 - third-party model code; waiters must be told
            error = exc if isinstance(exc, EmbeddingError) else EmbeddingError(f"encode failed: {exc}")
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        finally:
            took = loop.time() - started
            self._batch_s = took if self._batch_s is None else 0.7 * self._batch_s + 0.3 * took
        for text, future, vector in zip(texts, futures, vectors, strict=True):
            self._remember(text, vector)
            if not future.done():
                future.set_result(vector)

    def _pass_done(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if self._lane_free is not None:
            self._lane_free.set()

    def _expected_wait(self, now: float) -> float:
        """Seconds until a new text would be encoded: 0 when a free lane would take it at once
        (or before the first pass), else until the soonest lane frees plus the passes queued
        before it, spread over the lanes, plus its own."""
        queued = len(self._pending) // self._max_batch  # full passes ahead of a new text
        if self._batch_s is None or self._lanes - len(self._running) > queued:
            return 0.0
        soonest = min((max(0.0, self._batch_s - (now - t)) for t in self._running.values()), default=0.0)
        return soonest + (queued // self._lanes + 1) * self._batch_s

    async def warm_up(self) -> None:
        """Run one forward pass of every batch size up to max_batch's order, on the encoder
        threads (each lane's first pass allocates)."""
        loop = asyncio.get_running_loop()
        for size in (1, self._max_batch):
            await asyncio.gather(
                *(loop.run_in_executor(self._pool, self.encoder.encode, ["warm-up"] * size) for _ in range(self._lanes))
            )

    def _remember(self, text: str, vector: np.ndarray) -> None:
        if self._cache_size <= 0:
            return
        self._recent[text] = vector
        self._recent.move_to_end(text)
        while len(self._recent) > self._cache_size:
            self._recent.popitem(last=False)

    def close(self) -> None:
        """Stop the encoder threads (a pass already running finishes; pending texts are cancelled)."""
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
        for task in list(self._running):
            task.cancel()
        for future, _ in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
