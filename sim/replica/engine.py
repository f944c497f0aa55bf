"""Asyncio engine of one simulated replica: one scheduler loop drives the pure BatchModel.

The loop asks the model for a step, sleeps until the step's end on its step clock (see
``step_start``), then publishes what the step produced (first tokens, token counts, finished
requests) to per-request handles and to the Prometheus metrics. When the model is idle the loop blocks on an event, so an idle replica
costs no CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from sim.replica.latency.batch import BatchModel, Profile
from sim.replica.latency.prefix import DEFAULT_BLOCK_SIZE, block_hashes
from sim.replica.metrics import ReplicaMetrics

# How far behind its step clock a replica may fall and still catch up (simulated seconds): late
# wake-ups of a busy host are made good; a longer stall (a frozen process) is not replayed as a
# burst of steps afterwards.
MAX_STEP_LAG_S = 1.0


def step_start(previous_end: float | None, now: float, max_lag_s: float) -> float:
    """Loop time (s) at which the step taken ``now`` starts on the step clock.

    Where the last step ended (``previous_end``), not ``now``, so a late wake-up delays one step
    but is not added to every following one: the simulated GPU keeps its profile's pace while
    the host is busy. ``previous_end`` None (the engine was idle): ``now``. Never more than
    ``max_lag_s`` wall seconds behind ``now``."""
    return now if previous_end is None else max(previous_end, now - max_lag_s)


@dataclass
class Handle:
    """A request's view of its progress. ``generated``: tokens produced so far (published);
    ``arrived`` / ``scheduled``: loop (wall) times of entering the waiting queue and of the
    step that admitted it (None while it waits)."""

    req_id: int
    prompt_tokens: int
    max_tokens: int
    arrived: float
    generated: int = 0
    scheduled: float | None = None
    first_token: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Engine:
    """Scheduler loop of one replica. Create inside a running event loop; call ``start``.

    ``warmup_s``: simulated seconds after ``start`` before ``ready`` turns true (a real replica
    loads its weights for minutes before it can serve). ``time_scale``: simulated seconds per
    wall second (> 0): each step lasts ``step_s / time_scale`` wall seconds on the step clock and the
    warm-up lasts ``warmup_s / time_scale`` wall seconds, while every duration it records (TTFT
    and e2e histograms, queue time) is in simulated seconds, so the metrics keep their meaning.
    ``prefix_caching`` / ``block_size``: vLLM's automatic prefix caching over blocks of that
    many tokens (sim/replica/latency/prefix.py; on by default, as in vLLM V1).
    """

    def __init__(
        self,
        profile: Profile,
        model_name: str,
        warmup_s: float = 0.0,
        time_scale: float = 1.0,
        prefix_caching: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.model = BatchModel(profile, prefix_caching, block_size)
        self.metrics = ReplicaMetrics(
            model_name,
            running=lambda: len(self.model.running),
            waiting=lambda: len(self.model.waiting),
            kv_usage=lambda: self.model.kv_usage,
            cache_config={
                "block_size": str(self.model.pool.block_size),
                "num_gpu_blocks": str(self.model.pool.num_blocks),
                "enable_prefix_caching": str(prefix_caching),
            },
        )
        self.warmup_s = warmup_s
        self.time_scale = time_scale
        self._handles: dict[int, Handle] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started_at = 0.0

    def start(self, warmup_from: float | None = None) -> None:
        """Start the scheduler loop. ``warmup_from``: Unix time the warm-up counts from
        (default: now); a moment in the future counts as now."""
        loop = asyncio.get_running_loop()
        self._started_at = loop.time()
        if warmup_from is not None:
            self._started_at -= max(0.0, time.time() - warmup_from)
        self._task = loop.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _sim_elapsed(self, since: float) -> float:
        """Simulated seconds since the wall (loop) time ``since``."""
        return (asyncio.get_running_loop().time() - since) * self.time_scale

    @property
    def ready(self) -> bool:
        """True once the warm-up delay (simulated seconds) has passed."""
        return self._sim_elapsed(self._started_at) >= self.warmup_s

    @property
    def idle(self) -> bool:
        """True when no request is queued, running or awaiting its last tokens' delivery."""
        return not self._handles

    def submit(self, prompt_tokens: int, max_tokens: int, token_ids: list[int] | None = None) -> Handle:
        """Queue a request; ``token_ids``: its prompt's token ids (sim/replica/tokens.py), which the
        prefix cache hashes in blocks (None: nothing of it can be cached). Raises
        latency.ModelLimitError if it can never fit."""
        req_id = next(self._ids)
        hashes = block_hashes(token_ids, self.model.pool.block_size) if token_ids and self.model.pool.caching else []
        self.model.submit(req_id, prompt_tokens, max_tokens, hashes)
        handle = Handle(req_id, prompt_tokens, max_tokens, asyncio.get_running_loop().time())
        self._handles[req_id] = handle
        self._wake.set()
        return handle

    def abort(self, handle: Handle) -> None:
        """Drop an unfinished request (client disconnected); no-op when it already finished."""
        if self._handles.pop(handle.req_id, None) is not None:
            self.model.abort(handle.req_id)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        step_end: float | None = None  # the step clock: loop time the last step ended
        max_lag = MAX_STEP_LAG_S / self.time_scale
        while True:
            if self.model.idle:
                self._wake.clear()
                await self._wake.wait()
                step_end = None
                continue
            scheduled_at = step_start(step_end, loop.time(), max_lag)
            out = self.model.step()
            for req_id in out.admitted:
                handle = self._handles.get(req_id)
                if handle is not None:
                    # The step clock may lag the loop (step_start): a request that arrived after
                    # the step's clock start waited 0, never a negative time.
                    handle.scheduled = max(scheduled_at, handle.arrived)
            step_end = scheduled_at + out.duration_s / self.time_scale
            await asyncio.sleep(max(0.0, step_end - loop.time()))
            now = loop.time()
            # the whole prompt, computed or found cached, so the counter means what it did before
            self.metrics.prompt_tokens.inc(out.prompt_tokens + out.cached_tokens)
            self.metrics.prefix_cache_queries.inc(out.queried_tokens)
            self.metrics.prefix_cache_hits.inc(out.cached_tokens)
            self.metrics.generation_tokens.inc(out.generated_tokens)
            for req_id in out.first_token:
                handle = self._handles.get(req_id)
                if handle is not None:
                    self.metrics.ttft.observe((now - handle.arrived) * self.time_scale)
                    handle.first_token.set()
            for req_id, seq in self.model.running.items():
                handle = self._handles.get(req_id)
                if handle is not None:
                    handle.generated = seq.generated
            for req_id in out.finished:
                handle = self._handles.pop(req_id, None)
                if handle is not None:
                    handle.generated = handle.max_tokens
                    self.metrics.e2e.observe((now - handle.arrived) * self.time_scale)
                    self.metrics.request_success["length"].inc()  # every completion ends at max_tokens
                    # As vLLM: observed once the request finishes; aborted ones are not counted.
                    queued = (handle.scheduled if handle.scheduled is not None else now) - handle.arrived
                    self.metrics.queue_time.observe(queued * self.time_scale)
                    handle.first_token.set()
                    handle.done.set()
