"""Replica choice: pure scoring and policies over snapshots of replica state (no I/O).

Score (``gpu_load``, lower is better; unit: "equivalent running requests")::

    est      = max(inflight, waiting + running + (inflight - inflight_at_scrape))   # fresh scrape
             = inflight                                                           # stale / none
    score    = est + W_queue * waiting + W_kv * kv_usage + W_mem * mem_used**2
               + W_temp * max(0, temp_c - 75) + W_prefill * prefill_tokens / 1000

``prefill_tokens`` is the router's own count of prompt tokens sent to the replica whose prefill
has not ended as far as the router can tell (a stream: no first byte yet; a non-stream request:
until a scrape begun after it shows nothing waiting there, router/fleet/replicas.py): a new request there waits for those prefills before its
own first token, however few requests are open (a replica with one 4,000-token prompt pending
is a worse choice for time to first token than one decoding three answers). ``W_prefill`` = 3
makes 1,000 pending prompt tokens weigh as three open requests; it is counted whether the
scrape is fresh or not, being the router's own. ``inflight`` is the router's own count of open
requests to the replica (exact: it is kept on every path), ``inflight_at_scrape`` that count when the metrics were scraped, so requests
sent or finished since the scrape are neither missed nor counted twice. A snapshot older
than ``stale_after_s`` is distrusted entirely and the score falls back to ``inflight``.
A replica that is hot (KV cache or GPU memory over 85 %, utilisation over 90 %) is avoided
while any other candidate is not. The memory penalty is squared so that it is negligible at
moderate use and dominant near exhaustion (where a new long prompt would preempt others).

Replica speed (``gpu_load`` and ``power_of_two``): each candidate's learned seconds per token of
work (router/dispatch/speed.py) gives a slowness factor ``f`` >= 1 relative to the fastest candidate,
and the score becomes the cost of adding this request, scaled by how slowly it will be served::

    score' = (score + 1) * f - 1          # f = 1 (unknown or fastest): the score as above

so an idle T4 three times slower than an A100 ranks with an A100 that already has two requests.

Prefix-cache-aware (``prefix_aware``): the ``gpu_load`` score (speed included) minus a bonus
for the prompt prefix the replica probably holds in its KV cache (``Context.prefix_match``:
fraction 0..1 of the prompt's leading chunks in the router's index of what it sent there,
router/dispatch/prefix_index.py)::

    score'' = score' - (W_prefix + W_prefill * prompt_tokens / 1000) * match   # only while
                                                       # load + 1 <= bound, else score'
    bound   = ceil(c * (sum of loads + 1) / n)   # loads: estimated open requests, c = 1.25

The bonus is in the score's unit (equivalent running requests). Its second part is the prefill
the match saves, priced as pending prefill is (``prompt_tokens`` x ``match`` tokens vLLM's
prefix cache will skip), so a long prompt's match outweighs more load than a short one's: on
Mooncake's 11k-token prompts a prefix is worth what its prefill costs, not a flat 12. The first
part, ``W_prefix`` = 12 (a fully matched prompt worth 12 open requests, a half-matched one 6;
the best of 3, 6 and 12 in bench/prefix_dispatch.py, router/README.md), stays for what a match
brings besides prefill: KV blocks shared instead of duplicated. The router then counts as the
chosen replica's pending prefill only the unmatched part (router/forward/chooser.py). What keeps
that from piling requests onto one replica is the bound: a replica above it gets no bonus at
all, so locality is never followed into a hotspot (consistent hashing with bounded loads,
Mirrokni, Thorup and Zadimoghaddam, SODA 2018: no bin takes more than ceil(c x the mean) of
the load).

Predicted time to first token (``predicted_ttft``): each candidate's predicted seconds to this
request's first token (router/dispatch/ttft.py: prefill queued ahead + the prompt's part the
prefix index says is not cached there, at that replica's learned prefill speed, + engine steps
at its learned step time, fewer prefill tokens per step the more sequences it decodes); the
minimum wins. Cache is credited only within a load bound (``ttft_load_bound``: the bound
above, but never below the mean + ``TtftConfig.bound_slack`` open requests). Router workers
share no prefix state: a chat body's conversation (its prompt up to the first user message)
has a rendezvous-hash owner among the candidates that every worker computes alike; the owner
is credited the earlier turns' prompt as cached and is chosen whenever it is within
``TtftConfig.home_slack`` of the fastest, so each conversation's turns meet its prefix cache
whichever worker routes them. With any candidate's scrape stale no TTFT is predicted (the
running batch and other workers' queues are unknown): a conversation still goes to its owner
within the load bound, anything else is ``prefix_aware``'s decision.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from router.dispatch.signals import Signals
from router.dispatch.speed import Speed, SpeedConfig, current, slowness
from router.dispatch.ttft import TtftConfig, TtftSpeed, predict, rendezvous, speeds


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What dispatch knows about one eligible replica at decision time.

    key: replica URL; inflight: router's open requests to it; signals: last scrape (None if
    never scraped); inflight_at_scrape: ``inflight`` when that scrape was taken;
    age_s: seconds since that scrape (None if never); speed: learned seconds per token of work
    (router/dispatch/speed.py; None before the first sample), its ``at`` in ``Context.now``'s clock;
    prefill_tokens: prompt tokens of the router's open requests to it still in prefill as far as
    the router can tell (``Replica.prefill_tokens``: no first byte yet, or for a non-stream
    request no scrape since showing the replica's queue empty); ttft: its learned prefill and
    step speeds (router/dispatch/ttft.py; None: the priors).
    """

    key: str
    inflight: int = 0
    signals: Signals | None = None
    inflight_at_scrape: int = 0
    age_s: float | None = None
    speed: Speed | None = None
    prefill_tokens: int = 0
    ttft: TtftSpeed | None = None


@dataclass(frozen=True, slots=True)
class Weights:
    """Scoring weights and thresholds (see module docstring for the formula)."""

    queue: float = 2.0
    kv: float = 4.0
    mem: float = 4.0
    temp_per_c: float = 0.5
    temp_threshold_c: float = 75.0
    hot_kv: float = 0.85
    hot_mem: float = 0.85
    hot_util: float = 0.90
    stale_after_s: float = 1.0
    affinity_load_factor: float = 1.25
    prefix: float = 12.0  # W_prefix: bonus of a fully matched prompt prefix (prefix_aware), requests
    prefill_per_1k: float = 3.0  # W_prefill: open requests' worth of 1,000 pending prompt tokens
    speed: SpeedConfig | None = SpeedConfig()  # None: ignore replica speed
    ttft: TtftConfig = TtftConfig()  # predicted_ttft's priors and learning (router/dispatch/ttft.py)


@dataclass(slots=True)
class Context:
    """Per-decision inputs besides the replicas.

    ticket: a counter that grows by one per decision (round robin, tie-breaking);
    rng: random source for ``power_of_two``; session: ``X-Session-ID`` or None;
    preferred: replica that served this request's prompt prefix recently, or None;
    now: the clock of ``ReplicaView.speed.at`` (seconds), for the age of speed estimates;
    prefix_match: replica key -> fraction 0..1 of the prompt's prefix its KV cache probably
    holds (``prefix_aware``; a missing key counts as 0); prompt_tokens: this request's prompt
    tokens, the router's estimate (0: unknown), for the prefill a prefix match saves;
    conversation: a key every turn of one conversation shares (its prompt up to the first user
    message, router/dispatch/prefix_index.py ``conversation``), None if unknown:
    ``predicted_ttft`` prefers the conversation's rendezvous owner among near-equal candidates;
    carried_tokens: this prompt's tokens the conversation's earlier turns already sent, which
    ``predicted_ttft`` credits as cached to that owner; head_tokens: its tokens before the first
    user message (a system prompt other conversations share).
    """

    ticket: int = 0
    rng: random.Random = field(default_factory=random.Random)
    session: str | None = None
    preferred: str | None = None
    now: float = 0.0
    prefix_match: Mapping[str, float] = field(default_factory=dict)
    prompt_tokens: int = 0
    conversation: str | None = None
    carried_tokens: int = 0
    head_tokens: int = 0


def fresh(view: ReplicaView, weights: Weights) -> bool:
    """True if the view has a scrape younger than ``weights.stale_after_s``."""
    return view.signals is not None and view.age_s is not None and view.age_s <= weights.stale_after_s


def estimated_requests(view: ReplicaView, weights: Weights) -> float:
    """Requests open on the replica now (running + waiting), from the scrape and own counts."""
    if not fresh(view, weights):
        return float(view.inflight)
    sig = view.signals
    assert sig is not None
    scraped = (sig.waiting or 0.0) + (sig.running or 0.0)
    return max(float(view.inflight), scraped + view.inflight - view.inflight_at_scrape)


def score(view: ReplicaView, weights: Weights) -> float:
    """The ``gpu_load`` score of one replica (lower is better)."""
    est = estimated_requests(view, weights) + weights.prefill_per_1k * view.prefill_tokens / 1000.0
    if not fresh(view, weights):
        return est
    sig = view.signals
    assert sig is not None
    total = est + weights.queue * (sig.waiting or 0.0) + weights.kv * (sig.kv_usage or 0.0)
    if sig.mem_used is not None:
        total += weights.mem * sig.mem_used**2
    if sig.temp_c is not None and sig.temp_c > weights.temp_threshold_c:
        total += weights.temp_per_c * (sig.temp_c - weights.temp_threshold_c)
    return total


def speed_adjusted(value: float, factor: float) -> float:
    """A score scaled by a slowness ``factor`` (>= 1): ``(value + 1) * factor - 1``, the cost of
    one more request on the replica in units of the fastest replica's time."""
    return (value + 1.0) * factor - 1.0


def hot(view: ReplicaView, weights: Weights) -> bool:
    """True if a fresh scrape shows KV/memory or utilisation over the avoid thresholds."""
    if not fresh(view, weights):
        return False
    sig = view.signals
    assert sig is not None
    return (
        (sig.kv_usage or 0.0) > weights.hot_kv
        or (sig.mem_used or 0.0) > weights.hot_mem
        or (sig.gpu_util or 0.0) > weights.hot_util
    )


def _argmin(views: Sequence[ReplicaView], values: Sequence[float], ticket: int) -> ReplicaView:
    # Ties are broken by rotating with the ticket so an idle pool is filled evenly.
    n = len(views)
    best = min(range(n), key=lambda i: (values[i], (i - ticket) % n))
    return views[best]


def pick(views: Sequence[ReplicaView], policy: str, ctx: Context, weights: Weights = Weights()) -> ReplicaView:
    """Choose one replica from ``views`` (the eligible ones, non-empty) under ``policy``.

    policy: round_robin | least_request | gpu_load | power_of_two | prefix_aware | predicted_ttft
    (the last falls back to its conversation owner, then prefix_aware, when any candidate's
    scrape is stale). With ``ctx.session`` the
    choice is sticky by consistent hashing, with ``ctx.preferred`` by prompt prefix; both are
    bounded by load (a replica above ``affinity_load_factor`` x the mean open requests is skipped).
    Raises ValueError for an empty ``views`` or an unknown policy.
    """
    if not views:
        raise ValueError("no replica to pick from")
    if policy == "round_robin":
        return views[ctx.ticket % len(views)]
    if policy == "least_request":
        return _argmin(views, [float(v.inflight) for v in views], ctx.ticket)
    if policy not in ("gpu_load", "power_of_two", "prefix_aware", "predicted_ttft"):
        raise ValueError(f"unknown dispatch policy {policy!r}")
    cool = [v for v in views if not hot(v, weights)] or list(views)
    if policy == "predicted_ttft":
        if ctx.session is not None or ctx.preferred is not None:
            sticky = _affine(cool, [estimated_requests(v, weights) for v in cool], ctx, weights)
            if sticky is not None:
                return sticky
        predicted = predicted_ttfts(cool, ctx, weights)
        if predicted is not None:
            return _home_or_fastest(cool, predicted, ctx, weights)
        # A stale scrape: the running batch is unknown, so no prediction. The conversation's
        # owner needs none: every worker still sends it there within the load bound (on the
        # open requests this worker knows), else turns taken by different workers split across
        # replicas by their own prefix indexes (tests/router/test_workers_dispatch.py).
        home = _home(cool, ctx, weights)
        if home is not None:
            loads = [estimated_requests(v, weights) for v in cool]
            bound = ttft_load_bound(loads, weights)
            for view, load in zip(cool, loads, strict=True):
                if view.key == home and load + 1.0 <= bound:
                    return view
        policy = "prefix_aware"  # score as before
    scores = [score(v, weights) for v in cool]
    if weights.speed is not None and len(cool) > 1:
        factors = slowness([current(v.speed, v.inflight, ctx.now, weights.speed) for v in cool], ctx.now, weights.speed)
        if factors is not None:
            scores = [(s + 1.0) * f - 1.0 if f != 1.0 else s for s, f in zip(scores, factors)]  # speed_adjusted
    if ctx.session is not None or ctx.preferred is not None:
        sticky = _affine(cool, [estimated_requests(v, weights) for v in cool], ctx, weights)
        if sticky is not None:
            return sticky
    if policy == "prefix_aware" and ctx.prefix_match:
        loads = [estimated_requests(v, weights) for v in cool]
        scores = prefix_scores(cool, scores, loads, ctx.prefix_match, weights, ctx.prompt_tokens)
    if policy == "power_of_two" and len(cool) > 2:
        a, b = ctx.rng.sample(range(len(cool)), 2)
        return cool[a] if scores[a] <= scores[b] else cool[b]
    return _argmin(cool, scores, ctx.ticket)


def predicted_ttfts(views: Sequence[ReplicaView], ctx: Context, weights: Weights) -> list[float] | None:
    """Predicted seconds to the first token of this request (``ctx.prompt_tokens``, its prefix
    match ``ctx.prefix_match``) on each of ``views`` (router/dispatch/ttft.py), lower is better;
    None when a view has no fresh scrape (its running batch and others' queue are unknown).

    A replica's cached part of the prompt is its prefix-index match, and for the rendezvous
    owner of ``ctx.conversation`` at least ``ctx.carried_tokens`` (the earlier turns went there,
    whichever router worker sent them: every worker prefers that owner); credited only to
    replicas within the load bound (``load_bound``), so locality never leads into a hotspot. Queued
    prefill ahead: the router's own pending prefill there plus, for the open requests there that
    other router workers sent (the scrape's count beyond this router's), this router's own
    pending prefill per open request over the pool (workers get the same mix of traffic; the
    ``weights.ttft.workers`` - 1 others are taken to have sent as many since the scrape as this
    one, which the scrape cannot show yet), or
    while it has none open, ``weights.ttft.unknown_prompt_tokens`` per request waiting there."""
    if not all(fresh(v, weights) for v in views):
        return None
    config = weights.ttft
    loads = [estimated_requests(v, weights) for v in views]
    bound = ttft_load_bound(loads, weights)
    prompt = float(ctx.prompt_tokens if ctx.prompt_tokens > 0 else config.unknown_prompt_tokens)
    home = _home(views, ctx, weights)
    # a first turn's shared head (a system prompt) is credited to its owner as any replica holds
    # it: owners of other conversations of the same app soon all do, and a first turn sent
    # elsewhere for it was pulled back to the owner on the second turn, a miss of the whole
    # first turn (tests/router/test_predicted_ttft.py)
    first_turn = 0.0
    if ctx.carried_tokens <= 0:
        first_turn = min(prompt * max(ctx.prefix_match.values(), default=0.0), float(ctx.head_tokens))
    own_open = sum(v.inflight for v in views)
    density = sum(v.prefill_tokens for v in views) / own_open if own_open else None
    out: list[float] = []
    for view, load in zip(views, loads, strict=True):
        sig = view.signals
        assert sig is not None  # fresh
        waiting, running = sig.waiting or 0.0, sig.running or 0.0
        if density is not None:  # others' open requests there, as prefill-heavy as this router's
            # and those the other workers sent since the scrape, as many as this one sent
            unseen = (config.workers - 1) * max(0, view.inflight - view.inflight_at_scrape)
            ahead = view.prefill_tokens + (max(0.0, load - view.inflight) + unseen) * density
        else:
            others_waiting = max(0.0, min(waiting, waiting + running - view.inflight_at_scrape))
            ahead = view.prefill_tokens + others_waiting * config.unknown_prompt_tokens
        cached = 0.0
        if load + 1.0 <= bound:
            cached = prompt * ctx.prefix_match.get(view.key, 0.0)
            if view.key == home:
                cached = max(cached, min(prompt, float(ctx.carried_tokens)), first_turn)
        # learned speeds age only on a replica with none of this router's requests open: one
        # with requests open is being measured (its answers come), and aging it there made
        # mixed_chat's TTFT p99 38 % worse (4 workers, bench/prefix_dispatch.py)
        now = ctx.now if view.inflight == 0 else None
        out.append(predict(ahead, prompt - cached, running, view.ttft, config, now))
    return out


def _measured(view: ReplicaView, weights: Weights) -> bool:
    # a replica whose speeds rest on enough of its own samples, not on the priors
    speed, need = view.ttft, weights.ttft.min_samples
    return speed is not None and (speed.prefill_samples >= need or speed.step_samples >= need)


def _home(views: Sequence[ReplicaView], ctx: Context, weights: Weights) -> str | None:
    # The conversation's rendezvous owner, unless this router's prefix index knows the earlier
    # turns went to a replica that prefills much faster (it holds as much of the prompt as they
    # carried): in a mixed pool a conversation begun on an A100 because its owner was a slow
    # T4 was pulled back to the T4, whose full prefills made the TTFT p99 (bench/prefix_dispatch.py,
    # mixed_chat: 1.2 s, 0.33 s without). Between equal GPUs the pull back stays: it costs one
    # miss and keeps conversations spread by the hash (without it chat's load max/mean: 1.66).
    if ctx.conversation is None:
        return None
    keys = [v.key for v in views]
    prefill = [speeds(v.ttft)[0] for v in views]
    owners = keys
    if all(_measured(v, weights) for v in views):
        # owners among the fastest GPUs only (prefill within 1.5x of the best): every worker
        # learns the same few-fold gaps between GPU kinds, and a slow replica owning
        # conversations pulled them back to it whenever a worker did not know they had moved
        # (mixed_chat, 4 workers). Only once every candidate is measured: a replica without
        # data has the prior speed, and a measured one (its TTFT with the network's overhead)
        # looked slower than that and lost its conversations (tests/router/test_predicted_ttft.py).
        owners = [k for k, p in zip(keys, prefill, strict=True) if p <= 1.5 * min(prefill)]
    home = rendezvous(ctx.conversation, owners)
    if ctx.carried_tokens > 0 and ctx.prompt_tokens > 0:
        carried = ctx.carried_tokens / ctx.prompt_tokens
        home_view = views[keys.index(home)] if home in keys else None
        home_prefill = speeds(home_view.ttft if home_view else None)[0]
        for view in views:
            if view.key != home and ctx.prefix_match.get(view.key, 0.0) >= 0.9 * carried:
                measured = home_view is not None and _measured(home_view, weights) and _measured(view, weights)
                if measured and home_prefill > 1.5 * speeds(view.ttft)[0]:
                    return None
    return home


def _home_or_fastest(
    views: Sequence[ReplicaView], predicted: Sequence[float], ctx: Context, weights: Weights
) -> ReplicaView:
    # The conversation's rendezvous owner when it is within the load bound and its predicted
    # TTFT within the slack of the fastest: every router worker computes the same owner, so a
    # conversation whose turns reach different workers (each with its own prefix index) still
    # lands on one replica, which then holds its prefix; a replica clearly faster (a real
    # prefix hit elsewhere, an emptier queue) still wins.
    best = _argmin(views, predicted, ctx.ticket)
    if weights.ttft.workers > 1:
        # several workers see the same scrape and would all pick the same replica until the
        # next one shows their sends (a herd): each picks at random among the near-best
        lowest, herd = min(predicted), weights.ttft.herd_slack
        near = [v for v, p in zip(views, predicted, strict=True) if p <= lowest * herd.ratio + herd.seconds]
        best = near[ctx.rng.randrange(len(near))]
    home = _home(views, ctx, weights)
    if home is None:
        return best
    loads = [estimated_requests(v, weights) for v in views]
    bound = ttft_load_bound(loads, weights)
    slack = weights.ttft.home_slack if ctx.carried_tokens > 0 else weights.ttft.first_turn_slack
    lowest = min(predicted)
    for view, value, load in zip(views, predicted, loads, strict=True):
        if view.key == home and load + 1.0 <= bound and value <= lowest * slack.ratio + slack.seconds:
            return view
    return best


def ttft_load_bound(loads: Sequence[float], weights: Weights) -> float:
    """``predicted_ttft``'s load bound: :func:`load_bound`, but never below the mean after
    adding this request plus ``weights.ttft.bound_slack`` open requests. At a few open requests
    per replica ceil(1.25 x mean) is the mean plus one: a replica decoding two answers lost its
    conversations' prefixes to one decoding none, and their misses (a 5,000-token prefill
    where 400 would do) were chat's TTFT p99 (bench/prefix_dispatch.py)."""
    mean = (sum(loads) + 1.0) / len(loads)
    return max(load_bound(loads, weights.affinity_load_factor), mean + weights.ttft.bound_slack)


def load_bound(loads: Sequence[float], factor: float) -> float:
    """Most open requests a replica may have and still take a locality-driven request:
    ``ceil(factor x mean load after adding it)`` (bounded loads, Mirrokni et al. 2018)."""
    return math.ceil(factor * (sum(loads) + 1.0) / len(loads))


def prefix_scores(
    views: Sequence[ReplicaView],
    scores: Sequence[float],
    loads: Sequence[float],
    match: Mapping[str, float],
    weights: Weights,
    prompt_tokens: int = 0,
) -> list[float]:
    """``scores`` minus (``weights.prefix`` + ``weights.prefill_per_1k`` x ``prompt_tokens`` /
    1000) x each replica's prefix match (0..1): a fixed bonus plus the prefill the match saves,
    in open requests' worth; for replicas within the load bound only (see the module
    docstring). One value per view, lower is better. ``prompt_tokens`` 0: the fixed bonus only."""
    bound = load_bound(loads, weights.affinity_load_factor)
    per_match = weights.prefix + weights.prefill_per_1k * prompt_tokens / 1000.0
    return [
        s - per_match * match.get(v.key, 0.0) if load + 1.0 <= bound else s
        for v, s, load in zip(views, scores, loads, strict=True)
    ]


def _affine(views: list[ReplicaView], loads: list[float], ctx: Context, weights: Weights) -> ReplicaView | None:
    # Bounded load (Mirrokni, Thorup, Zadimoghaddam 2018): a replica may take a sticky request
    # only while its open requests stay within ceil(c x the mean after adding this request).
    bound = load_bound(loads, weights.affinity_load_factor)
    by_key = {v.key: (v, s) for v, s in zip(views, loads, strict=True)}
    if ctx.preferred is not None and ctx.preferred in by_key:
        view, load = by_key[ctx.preferred]
        if load + 1.0 <= bound:
            return view
    if ctx.session is None:
        return None
    for key in ring_walk(tuple(sorted(by_key)), ctx.session):
        view, load = by_key[key]
        if load + 1.0 <= bound:
            return view
    return None


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=64)
def _ring(keys: tuple[str, ...], vnodes: int = 64) -> tuple[list[int], list[str]]:
    points = sorted((_hash(f"{key}#{i}"), key) for key in keys for i in range(vnodes))
    return [p for p, _ in points], [k for _, k in points]


def ring_walk(keys: tuple[str, ...], session: str) -> list[str]:
    """Replica keys in consistent-hash ring order starting at ``session``'s point (each once)."""
    hashes, owners = _ring(keys)
    start = bisect.bisect(hashes, _hash(session))
    seen: dict[str, None] = {}
    for i in range(len(owners)):
        seen.setdefault(owners[(start + i) % len(owners)], None)
        if len(seen) == len(keys):
            break
    return list(seen)
