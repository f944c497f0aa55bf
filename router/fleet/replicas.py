"""Runtime state of replicas and pools: in-flight counts, last scrape, health.

One :class:`Replica` per upstream server, grouped into pools by model. Dispatch reads
immutable :class:`~router.dispatch.ReplicaView` snapshots made here; the scraper and the
request path write. Single event loop, so plain attributes need no locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from router.dispatch import ReplicaView
from router.dispatch.signals import Signals
from router.dispatch.speed import Speed, current, observe, sample
from router.dispatch.ttft import TtftSpeed, itl_sample, observe_itl, observe_ttft
from router.fleet.health import HealthConfig, HealthState
from router.forward.credentials import Credentials
from router.settings import ReplicaSpec


class Replica:
    """One upstream server: its spec, the router's open requests to it, signals and health.

    authorization: the ``Authorization`` header value the router sends it (its backend key,
    router/forward/credentials.py), None for none; never logged."""

    def __init__(self, spec: ReplicaSpec, health: HealthConfig, authorization: str | None = None) -> None:
        self.spec = spec
        self.url = spec.url
        self.authorization = authorization
        self.inflight = 0
        self.prefill_tokens = 0  # prompt tokens of open requests still in prefill (lease)
        # non-stream requests still counted in prefill_tokens -> when they were sent (monotonic s),
        # oldest first: a scrape that shows them admitted ends their count (observe)
        self.unadmitted: OrderedDict[Lease, float] = OrderedDict()
        self.signals: Signals | None = None
        self.scraped_at: float | None = None  # monotonic seconds
        self.inflight_at_scrape = 0
        self.health = HealthState(health)
        self.speed: Speed | None = None  # learned seconds per output token (router/dispatch/speed.py)
        self.ttft: TtftSpeed | None = None  # learned prefill and step speeds (router/dispatch/ttft.py)
        self._retest = False  # a request was sent to re-test a stale estimate (router/dispatch/speed.py)

    def observe(self, signals: Signals, now: float, sent_before: float | None = None) -> None:
        """Store a scrape taken at ``now`` (monotonic s) with the in-flight count at that time.
        ``sent_before``: requests sent before then had time to reach the replica before the
        scrape began; when it says nothing waits, each of them was admitted, its prefill begun,
        so the non-stream ones among them stop counting as pending prefill."""
        self.signals = signals
        self.scraped_at = now
        self.health.progress.scraped(now, signals.running, signals.generated)
        self.inflight_at_scrape = self.inflight
        if sent_before is not None and signals.waiting == 0:
            while self.unadmitted:
                lease, sent = next(iter(self.unadmitted.items()))
                if sent > sent_before:
                    break
                lease.first_byte()  # removes it

    def observe_answer(self, duration_s: float, completion_tokens: int, prompt_tokens: int, now: float) -> None:
        """Learn from one good answer: ``duration_s`` from sending the request to its last byte,
        token counts from its usage (0 completion tokens: unknown, nothing learned); ``now``
        monotonic seconds."""
        per_token = sample(duration_s, completion_tokens, prompt_tokens)
        if per_token is not None:
            self.speed = observe(self.speed, per_token, now, retest=self._retest)
            self._retest = False

    def view(self, now: float) -> ReplicaView:
        """An immutable snapshot for dispatch."""
        age = None if self.scraped_at is None else now - self.scraped_at
        return ReplicaView(
            self.url,
            self.inflight,
            self.signals,
            self.inflight_at_scrape,
            age,
            self.speed,
            self.prefill_tokens,
            self.ttft,
        )

    def observe_stream(self, ttft_s: float, basis: tuple[float, float, float, float]) -> None:
        """Learn from a stream's first token, ``ttft_s`` seconds after it was sent; ``basis``:
        (prefill ahead of it, its own, its prompt taken as cached, running sequences) when it
        was sent (router/dispatch/ttft.py ``observe_ttft``)."""
        ahead, own, cached, running = basis
        now = time.monotonic()  # dispatch's clock (Context.now): learned speeds age in it
        self.ttft = observe_ttft(self.ttft, ttft_s, own, running, ahead_tokens=ahead, cached_tokens=cached, now=now)

    def observe_itl(self, first_token_s: float, last_token_s: float, completion_tokens: int) -> None:
        """Learn from a stream's inter-token latency: its first and last token times (one
        clock, seconds) and its output tokens."""
        itl = itl_sample(first_token_s, last_token_s, completion_tokens)
        if itl is not None:
            self.ttft = observe_itl(self.ttft, itl, now=time.monotonic())

    def lease(self, prefill_tokens: int = 0, streamed: bool = True, cached_tokens: int = 0) -> Lease:
        """Count one request as open on this replica until the lease is released, and its
        ``prefill_tokens`` (its prompt's token count, the router's estimate) as pending until
        its first byte (:meth:`Lease.first_byte`) or its end; a request not ``streamed`` has
        its first byte only after its whole generation, so its count also ends with the first
        scrape showing it admitted (:meth:`observe`). A request sent while the
        replica's learned speed is unknown (stale, or a probe under way) and nothing is in
        flight is a re-test: its sample starts or continues the probe whose median replaces
        the estimate (router/dispatch/speed.py). ``cached_tokens``: the prompt's tokens taken as
        cached there; with the prefill queued ahead and the running batch they are the basis of
        the stream's TTFT sample (:meth:`Lease.first_token`)."""
        now = time.monotonic()
        running = (self.signals.running or 0.0) if self.signals is not None else 0.0
        basis = (float(self.prefill_tokens), float(max(0, int(prefill_tokens))), float(cached_tokens), running)
        if self.speed is not None and current(self.speed, self.inflight, now) is None:
            self._retest = True
        self.inflight += 1
        prefill = max(0, int(prefill_tokens))
        self.prefill_tokens += prefill
        lease = Lease(self, self.health.on_dispatch(now), prefill)
        lease.basis = basis if streamed else None
        self.health.progress.opened(lease, now, streamed)
        if prefill and not streamed:
            self.unadmitted[lease] = now
        return lease


class Lease:
    """An open request on a replica; :meth:`release` is idempotent so every exit path may call it.
    ``trial``: the request is its half-open circuit's trial (router/fleet/health.py)."""

    __slots__ = ("basis", "replica", "trial", "_open", "_prefill")

    def __init__(self, replica: Replica, trial: bool = False, prefill_tokens: int = 0) -> None:
        self.replica = replica
        self.trial = trial
        self._open = True
        self._prefill = prefill_tokens
        self.basis: tuple[float, float, float, float] | None = None  # TTFT sample basis (Replica.lease)

    def first_token(self, ttft_s: float) -> None:
        """A stream's first byte came ``ttft_s`` seconds after it was sent: learn from it once
        (router/dispatch/ttft.py), then :meth:`first_byte`."""
        if self.basis is not None:
            self.replica.observe_stream(ttft_s, self.basis)
            self.basis = None
        self.first_byte()

    def first_byte(self) -> None:
        """The answer has begun (or, not streamed, the replica admitted it): its prompt no
        longer counts as pending prefill (idempotent)."""
        if self._prefill:
            self.replica.prefill_tokens -= self._prefill
            self._prefill = 0
            self.replica.unadmitted.pop(self, None)

    def advanced(self) -> None:
        """Part of the answer arrived (a stream's chunk, a whole answer): the replica generates
        (router/fleet/progress.py)."""
        self.replica.health.progress.advanced(time.monotonic())

    def release(self) -> None:
        """Close the request (decrements the replica's in-flight count once; ends a trial, so a
        trial that ended without a verdict does not hold the circuit half-open forever)."""
        self.first_byte()
        if self._open:
            self._open = False
            self.replica.inflight -= 1
            self.replica.health.progress.closed(self)
            if self.trial:
                self.replica.health.end_trial()


class Pools:
    """Replicas grouped by the model they serve (pool name = model name); ``credentials``:
    the backend keys replicas get when they are created (None: no keys)."""

    def __init__(
        self, specs: Iterable[ReplicaSpec], health: HealthConfig, credentials: Credentials | None = None
    ) -> None:
        self.health = health  # for replicas added later by discovery (router/discovery/base.py)
        self.credentials = credentials
        self.by_model: dict[str, list[Replica]] = {}
        for spec in specs:
            self.by_model.setdefault(spec.model, []).append(self.new_replica(spec))

    def authorization(self, spec: ReplicaSpec) -> str | None:
        """The ``Authorization`` value for a replica of ``spec`` (None: no backend key)."""
        if self.credentials is None:
            return None
        return self.credentials.authorization(spec.url, spec.model, spec.backend_key)

    def new_replica(self, spec: ReplicaSpec) -> Replica:
        """A replica of ``spec`` with this pool set's health thresholds and its backend key."""
        return Replica(spec, self.health, self.authorization(spec))

    def __contains__(self, model: str) -> bool:
        return model in self.by_model

    def all(self) -> list[Replica]:
        """Every replica of every pool."""
        return [r for pool in self.by_model.values() for r in pool]

    def eligible(self, model: str, now: float, exclude: frozenset[str] = frozenset()) -> list[Replica]:
        """Replicas of ``model``'s pool that may take a request now, minus ``exclude`` URLs.

        When none admits, the last resort (router/fleet/health.py): replicas that are up and still
        answer, though ejected or with a circuit opened by server errors, rather than a 503
        for every client of the pool.
        """
        pool = [r for r in self.by_model.get(model, ()) if r.url not in exclude]
        ready = [r for r in pool if r.health.admits(now)]
        return ready or [r for r in pool if r.health.admits(now, last_resort=True)]
