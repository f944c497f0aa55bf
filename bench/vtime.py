"""Virtual-time replay of requests through the router's dispatch onto simulated replicas.

The discrete-event loop that bench/dispatch_quality.py and bench/prefix_dispatch.py share, so a
policy comparison takes seconds of CPU and is exactly repeatable (no wall clock, no threads):

- each replica is a ``sim.replica.latency.batch.BatchModel`` (the continuous-batching model the simulated vLLM
  replica serves with) running its engine steps back to back while it has work; a request that
  arrives during a step joins at the next step boundary, as in the sim's engine loop;
- every ``scrape_s`` (0.25 s) of virtual time the router's view of each replica is refreshed:
  ``Signals`` built from the model by the ``signals`` callback (what a ``/metrics`` scrape would
  read), the scrape's time and the in-flight count at that moment;
- on each arrival the caller's ``route`` picks a replica from ``ReplicaView`` snapshots built as
  the router builds them (in-flight count, last scrape, its age, learned speed) and a
  ``router.dispatch.Context`` (ticket = arrival number, the caller's ``rng``, ``now`` = virtual
  seconds); the request goes to that replica's model, and its prompt tokens count as the
  replica's pending prefill (``ReplicaView.prefill_tokens``) until its first token, as
  ``Replica.lease`` counts them in the router;
- when a request finishes, its seconds from arrival to last token are folded into the replica's
  learned speed with ``router.dispatch.speed.sample`` / ``observe``, the calls the router makes when an
  answer ends (dispatch at arrival: the router adds no delay in virtual time); its time to first
  token and inter-token latency teach the replica's ``router.dispatch.ttft`` speeds
  (``observe_ttft`` with the prefill the router counted ahead of it plus its own, ``observe_itl``).

What differs between benches is a parameter: how Signals are built (``signals``), which replicas
may take a request (``eligible``), the routing decision and any router-side state it updates
(``route``), and what a step publishes (``on_step``, e.g. a replica's Prometheus counters).

Not part of the installed packages: ``bench/`` imports router and sim; sim never imports this.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.dispatch import Context, ReplicaView
from router.dispatch.signals import Signals
from router.dispatch.speed import Speed, observe, sample
from router.dispatch.ttft import TtftSpeed, itl_sample, observe_itl, observe_ttft
from sim import BatchModel, Profile, StepOutcome

SCRAPE_S = 0.25  # the router's metrics scrape interval in these benches (virtual seconds)


class Request(Protocol):
    """What the loop reads of a request: arrival (virtual s), prompt and output tokens, and the
    prompt's block hashes for the replica's prefix cache (``()``: none)."""

    @property
    def at(self) -> float: ...
    @property
    def prompt(self) -> int: ...
    @property
    def output(self) -> int: ...
    @property
    def blocks(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Job:
    """The plainest :class:`Request`: arrival s, prompt tokens, output tokens, block hashes."""

    at: float
    prompt: int
    output: int
    blocks: tuple[int, ...] = ()


@dataclass
class SimReplica:
    """One simulated replica and what the router knows of it.

    inflight: the router's open requests to it; signals / scraped_at / inflight_at_scrape: the
    last scrape (None before the first); served: requests dispatched to it; speed: learned
    seconds per token of work; load_area: integral of ``inflight`` over virtual time (request x
    seconds) up to ``load_since``; pending: the outcome of the step in progress;
    prefill_tokens: prompt tokens of its open requests with no first token yet, as the router
    counts them (``Replica.lease``); ttft: learned prefill and step speeds (router/dispatch/ttft.py).
    """

    key: str
    profile: Profile
    model: BatchModel
    inflight: int = 0
    busy: bool = False
    signals: Signals | None = None
    scraped_at: float | None = None
    inflight_at_scrape: int = 0
    served: int = 0
    pending: StepOutcome | None = None
    speed: Speed | None = None
    load_area: float = 0.0
    load_since: float = 0.0
    prefill_tokens: int = 0
    ttft: TtftSpeed | None = None

    def account(self, now: float) -> None:
        """Extend ``load_area`` to ``now`` (call before ``inflight`` changes)."""
        self.load_area += self.inflight * (now - self.load_since)
        self.load_since = now

    def view(self, now: float) -> ReplicaView:
        """The dispatch snapshot of this replica at virtual time ``now``."""
        age = None if self.scraped_at is None else now - self.scraped_at
        return ReplicaView(
            self.key,
            self.inflight,
            self.signals,
            self.inflight_at_scrape,
            age,
            self.speed,
            self.prefill_tokens,
            self.ttft,
        )


def load_signals(model: BatchModel) -> Signals:
    """A scrape of the engine's load: waiting and running requests, KV-cache usage (0..1)."""
    return Signals(waiting=float(len(model.waiting)), running=float(len(model.running)), kv_usage=model.kv_usage)


def load_and_kv_size_signals(model: BatchModel) -> Signals:
    """:func:`load_signals` plus the KV cache's size in tokens (vLLM's ``cache_config_info``)."""
    pool = model.pool
    return Signals(
        waiting=float(len(model.waiting)),
        running=float(len(model.running)),
        kv_usage=model.kv_usage,
        kv_capacity_tokens=float(pool.num_blocks * pool.block_size),
    )


Route = Callable[[int, list[ReplicaView], Context], str]
"""(request index, views of the eligible replicas in fleet order, context) -> chosen replica key."""


@dataclass(frozen=True)
class Timeline:
    """When each finished request got its first token and its last (virtual s), by request index.
    Requests still open when the events ran out are in neither."""

    first_token: dict[int, float]
    done: dict[int, float]


def replay(
    requests: Sequence[Request],
    replicas: Sequence[SimReplica],
    route: Route,
    rng: random.Random,
    *,
    signals: Callable[[BatchModel], Signals] = load_signals,
    eligible: Callable[[int], Sequence[int]] | None = None,
    on_step: Callable[[int, StepOutcome], None] | None = None,
    leased: Callable[[int, str], int] | None = None,
    scrape_s: float = SCRAPE_S,
) -> Timeline:
    """Run ``requests`` (arrivals in virtual seconds, the first scrape at 0) to completion.

    ``eligible(i)``: indices of the replicas that may take request ``i`` (None: all);
    ``on_step(r, outcome)``: called when a step of replica ``r`` ends, before its requests'
    bookkeeping; ``leased(i, key)``: the prompt tokens the router counts as pending prefill on
    replica ``key`` for request ``i`` until its first token (None: the whole prompt, as
    ``Replica.lease(prompt_tokens)``). Mutates ``replicas`` (counts, signals, speed, load). Events at the same instant
    run in the order they were scheduled (all arrivals were scheduled first, then the scrape).
    Raises whatever ``route`` or ``BatchModel.submit`` raises (e.g. ModelLimitError), or
    KeyError when ``route`` returns a key that is not a replica's.
    """
    by_key = {rep.key: r for r, rep in enumerate(replicas)}
    events: list[tuple[float, int, str, int]] = []
    order = 0

    def push(t: float, kind: str, data: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, data))

    def start_step(r: int, now: float) -> None:
        rep = replicas[r]
        outcome = rep.model.step()
        if outcome.duration_s == 0.0:
            rep.busy = False
            return
        rep.busy = True
        rep.pending = outcome
        push(now + outcome.duration_s, "step", r)

    for i, req in enumerate(requests):
        push(req.at, "arrive", i)
    push(0.0, "scrape", 0)
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    pending_prefill: dict[int, int] = {}
    work: dict[int, tuple[float, float, float, float]] = {}  # request -> (prefill ahead, own, cached, running)
    ticket = 0
    remaining = len(requests)
    while events and remaining:
        now, _, kind, data = heapq.heappop(events)
        if kind == "scrape":
            for rep in replicas:
                rep.signals = signals(rep.model)
                rep.scraped_at, rep.inflight_at_scrape = now, rep.inflight
            push(now + scrape_s, "scrape", 0)
        elif kind == "arrive":
            req = requests[data]
            candidates = range(len(replicas)) if eligible is None else eligible(data)
            views = [replicas[r].view(now) for r in candidates]
            ticket += 1
            key = route(data, views, Context(ticket=ticket, rng=rng, now=now))
            r = by_key[key]
            rep = replicas[r]
            pending_prefill[data] = req.prompt if leased is None else leased(data, key)
            running = (rep.signals.running or 0.0) if rep.signals is not None else 0.0
            own = float(pending_prefill[data])
            work[data] = (float(rep.prefill_tokens), own, req.prompt - own, running)
            rep.prefill_tokens += pending_prefill[data]
            rep.model.submit(data, req.prompt, req.output, req.blocks)
            rep.account(now)
            rep.inflight += 1
            rep.served += 1
            if not rep.busy:
                start_step(r, now)
        else:  # a step of replica `data` ended
            rep = replicas[data]
            outcome = rep.pending
            assert outcome is not None  # a "step" event is pushed only with its outcome
            if on_step is not None:
                on_step(data, outcome)
            for i in outcome.first_token:
                first[i] = now
                rep.prefill_tokens -= pending_prefill.pop(i, 0)
                ahead, own, cached, running = work.pop(i, (0.0, 0.0, 0.0, 0.0))
                rep.ttft = observe_ttft(
                    rep.ttft, now - requests[i].at, own, running, ahead_tokens=ahead, cached_tokens=cached, now=now
                )
            for i in outcome.finished:
                done[i] = now
                rep.prefill_tokens -= pending_prefill.pop(i, 0)  # ended with no first token
                rep.account(now)
                rep.inflight -= 1
                remaining -= 1
                req = requests[i]
                per_token = sample(now - req.at, req.output, req.prompt)  # sent at arrival
                if per_token is not None:
                    rep.speed = observe(rep.speed, per_token, now)
                itl = itl_sample(first[i], now, req.output) if i in first else None
                if itl is not None:
                    rep.ttft = observe_itl(rep.ttft, itl, now=now)
            start_step(data, now)
    return Timeline(first, done)
