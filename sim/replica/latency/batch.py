"""Pure latency model of one vLLM-like replica: continuous batching over a KV cache.

No clock, no I/O: :class:`BatchModel` advances one engine step at a time and says how long that
step takes; the asyncio engine (``sim.replica.engine``) sleeps for it. The model follows vLLM V1's
scheduler in shape (decode first, then chunked prefill under a per-step token budget) with one
documented simplification: a request is admitted only when its whole footprint
(prompt + max_tokens) fits in the free KV cache, so there is never a preemption.

With prefix caching on (``prefix_caching=True``, sim/replica/latency/prefix.py) the KV cache is counted in
blocks of ``block_size`` tokens; a request's prompt starts prefilled by the tokens found in
the cache, so only its uncached tokens are prefilled and charged ``prefill_s_per_token``.
Off, the pool is counted in tokens (block size 1, nothing cached), as before.

Step time (seconds)::

    step = decode_base_s
         + decode_per_seq_s   * sequences in the step
         + kv_read_s_per_token * KV tokens in use
         + prefill_s_per_token * prompt tokens prefilled in the step

Every sequence that finished its prefill gets one token per step; the step that completes a
prompt's prefill also yields its first token (as in vLLM, where the prefill step samples one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from sim.replica.latency.prefix import DEFAULT_BLOCK_SIZE, KVBlockPool


class ModelLimitError(ValueError):
    """The request can never run on this replica: prompt + max_tokens > max_model_len (tokens).

    The message is vLLM's for the same case (its OpenAI server answers it with a 400)."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


@dataclass(frozen=True)
class Profile:
    """Speed and capacity of one simulated GPU replica.

    Units: tokens and seconds. ``kv_capacity_tokens`` is the KV cache size in tokens;
    ``max_model_len`` caps prompt + max_tokens of one request (vLLM's ``--max-model-len``).
    """

    name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    max_model_len: int
    prefill_s_per_token: float
    decode_base_s: float
    decode_per_seq_s: float
    kv_read_s_per_token: float

    def __post_init__(self) -> None:
        if not 1 <= self.max_model_len <= self.kv_capacity_tokens:
            raise ValueError(
                f"max_model_len {self.max_model_len} must be at least 1 and fit in the KV cache "
                f"of profile {self.name!r} ({self.kv_capacity_tokens} tokens)"
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("need max_num_seqs >= 1 and a token budget of at least one per sequence")


@dataclass
class Sequence:
    """One request inside the model. Token counts only; text lives in the API layer.
    ``block_hashes``: chained hashes of its prompt's full blocks (sim/replica/latency/prefix.py), empty when
    unknown; ``cached``: prompt tokens found in the prefix cache at admission."""

    req_id: int
    prompt_tokens: int
    max_tokens: int
    prefilled: int = 0
    generated: int = 0
    block_hashes: tuple[int, ...] = ()
    cached: int = 0

    @property
    def footprint(self) -> int:
        """KV tokens reserved at admission: the whole prompt plus every token it may generate."""
        return self.prompt_tokens + self.max_tokens

    @property
    def kv_in_use(self) -> int:
        return self.prefilled + self.generated


@dataclass
class StepOutcome:
    """What one engine step did. ``duration_s`` is 0 when there was nothing to run.
    ``prompt_tokens``: prompt tokens computed (prefilled) in the step; ``cached_tokens``:
    prompt tokens of the requests admitted in the step that were found in the prefix cache
    (not computed); ``queried_tokens``: prompt tokens of those requests looked up in it."""

    duration_s: float
    admitted: list[int] = field(default_factory=list)
    first_token: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    queried_tokens: int = 0


class BatchModel:
    """Continuous batching of one replica, advanced step by step (no clock inside).

    ``submit`` queues a request (FIFO waiting queue), ``step`` runs one engine iteration and
    returns a :class:`StepOutcome`, ``abort`` drops a request wherever it is.
    ``prefix_caching``: model vLLM's automatic prefix caching over blocks of ``block_size``
    tokens (the pool has ``kv_capacity_tokens // block_size`` blocks); off by default here
    (the replica's engine turns it on, as vLLM V1 does).
    """

    def __init__(self, profile: Profile, prefix_caching: bool = False, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.profile = profile
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        size = block_size if prefix_caching else 1
        self.pool = KVBlockPool(profile.kv_capacity_tokens // size, size, caching=prefix_caching)

    def submit(self, req_id: int, prompt_tokens: int, max_tokens: int, block_hashes: Seq[int] = ()) -> None:
        """Queue a request. ``block_hashes``: its prompt's chained block hashes
        (sim/replica/latency/prefix.py ``block_hashes`` of its token ids), for the prefix cache. Raises
        ModelLimitError when it can never fit this replica."""
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if prompt_tokens + max_tokens > self.profile.max_model_len:
            raise ModelLimitError(prompt_tokens, max_tokens, self.profile.max_model_len)
        self.waiting.append(Sequence(req_id, prompt_tokens, max_tokens, block_hashes=tuple(block_hashes)))

    def abort(self, req_id: int) -> None:
        """Forget a request (client went away); frees its KV blocks."""
        seq = self.running.pop(req_id, None)
        if seq is not None:
            self.pool.release(req_id)
            return
        self.waiting = deque(s for s in self.waiting if s.req_id != req_id)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def kv_tokens_in_use(self) -> int:
        """KV tokens the running requests use (a cached block shared by several counted once)."""
        return sum(s.kv_in_use for s in self.running.values()) - self.pool.shared_tokens

    @property
    def kv_usage(self) -> float:
        """Fraction 0..1 of the KV cache holding tokens (vLLM's kv_cache_usage_perc)."""
        return self.kv_tokens_in_use / self.profile.kv_capacity_tokens

    def _admit(self, out: StepOutcome) -> None:
        p = self.profile
        # FIFO without skipping: a big request at the head blocks smaller ones behind it, as in vLLM.
        while self.waiting and len(self.running) < p.max_num_seqs:
            head = self.waiting[0]
            if not self.pool.can_admit(head.block_hashes, head.prompt_tokens, head.footprint):
                break
            self.waiting.popleft()
            head.cached = self.pool.admit(head.req_id, head.block_hashes, head.prompt_tokens, head.footprint)
            head.prefilled = head.cached
            self.running[head.req_id] = head
            out.admitted.append(head.req_id)
            out.cached_tokens += head.cached
            if self.pool.caching:
                out.queried_tokens += head.prompt_tokens

    def step(self) -> StepOutcome:
        """Run one engine iteration; see the module docstring for the step-time formula."""
        p = self.profile
        out = StepOutcome(0.0)
        self._admit(out)
        if not self.running:
            return out
        kv_before = self.kv_tokens_in_use
        budget = p.max_num_batched_tokens
        decoding = [s for s in self.running.values() if s.prefilled == s.prompt_tokens]
        budget -= len(decoding)
        chunks: list[tuple[Sequence, int]] = []
        for seq in self.running.values():
            if budget <= 0:
                break
            if seq.prefilled < seq.prompt_tokens:
                chunk = min(seq.prompt_tokens - seq.prefilled, budget)
                chunks.append((seq, chunk))
                budget -= chunk
        prefill_tokens = sum(c for _, c in chunks)
        duration = (
            p.decode_base_s
            + p.decode_per_seq_s * (len(decoding) + len(chunks))
            + p.kv_read_s_per_token * kv_before
            + p.prefill_s_per_token * prefill_tokens
        )
        out.duration_s, out.prompt_tokens = duration, prefill_tokens
        for seq in decoding:
            seq.generated += 1
        for seq, chunk in chunks:
            seq.prefilled += chunk
            self.pool.computed(seq.req_id, seq.block_hashes, seq.prefilled)
            if seq.prefilled == seq.prompt_tokens:
                seq.generated = 1
                out.first_token.append(seq.req_id)
        out.generated_tokens = len(decoding) + len(out.first_token)
        for seq in decoding + [s for s, _ in chunks]:
            if seq.generated >= seq.max_tokens:
                del self.running[seq.req_id]
                self.pool.release(seq.req_id)
                out.finished.append(seq.req_id)
        return out


@dataclass(frozen=True)
class SimResult:
    """Virtual-time timings of one request from :func:`simulate` (seconds from its arrival)."""

    ttft_s: float
    e2e_s: float
    queued_s: float


def simulate(profile: Profile, arrivals: list[tuple[float, int, int]]) -> dict[int, SimResult]:
    """Run the model in virtual time. ``arrivals``: (arrival_s, prompt_tokens, max_tokens).

    Returns request index -> SimResult. A request arriving during a step waits for the next
    step boundary, as in the real engine loop. Pure and deterministic; used by tests and docs.
    """
    model = BatchModel(profile)
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    pending = deque(order)
    now = 0.0
    admitted_at: dict[int, float] = {}
    first: dict[int, float] = {}
    results: dict[int, SimResult] = {}
    while pending or not model.idle:
        while pending and arrivals[pending[0]][0] <= now:
            i = pending.popleft()
            model.submit(i, arrivals[i][1], arrivals[i][2])
        if model.idle:
            now = arrivals[pending[0]][0]
            continue
        out = model.step()
        if out.duration_s == 0.0:
            # Nothing admissible runs: cannot happen with max_model_len <= capacity and FIFO.
            raise RuntimeError("model stalled with waiting requests")
        for i in out.admitted:
            admitted_at[i] = now
        now += out.duration_s
        for i in out.first_token:
            first[i] = now
        for i in out.finished:
            t0 = arrivals[i][0]
            results[i] = SimResult(first[i] - t0, now - t0, admitted_at[i] - t0)
    return results
