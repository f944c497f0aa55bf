"""Predictive cache warming at a POP against no warming, on simulated time (issue 14 item 4).

    PYTHONPATH=. python bench/cache_warming.py [--mean-rps 1.0] [--repeat-share 0.3] [--zipf-s 1.0]
        [--prompts-per-slot 1000] [--seed 0] [--days 14] [--eval-days 7] [--peak-slots 6]
        [--gen-gpu-s 2.625] [--capacity-rps X] [--warmup-s 300] [--models last_value,...]
        [--budget-per-min 6] [--top-k 50] [--lead-s 900] [--history-days 7] [--idle-load 0.5]
        [--peak-fraction 0.5] [--min-rise 0.2] [--keep-per-slot 100] [--sweep]
        [--json out/cache_warming.json]

A multi-day replay, no wall clock. Five runs on the same arrivals and prompts: warming off;
warming on with the forecaster's forecast or with an oracle forecast (the true future rate),
so what a better forecast would add is visible; each on a fixed pool and on an autoscaled one.
The warming options are the product's per-pool ``WarmingSettings`` (cache/warming/settings.py),
their defaults its defaults; the rules are its planner's (cache/warming/plan.py).

Arrivals. The real ServeGen m-large rate series (``../shared/data/traces/servegen-m-large``,
14 days of 600 s windows, total = sum over its 162 clients, read by the forecaster's trace
reader), scaled so its mean over the days used is ``--mean-rps``; Poisson arrivals in each
window (uniform times given the count), drawn with ``--seed``. The last ``--eval-days`` days
are scored; the days before are history (popularity counts, forecaster fit).

Prompt identity: an assumption, not data. No public trace pairs prompt text (or prompt
hashes) with timestamps over several days, so which requests repeat is modelled: with
probability ``--repeat-share`` a request asks one of ``--prompts-per-slot`` popular prompts of
its 10-minute time-of-day slot, drawn by Zipf with exponent ``--zipf-s`` (rank r has weight
1 / r^s); the slot's set is the same every day and the sets of different slots do not overlap
(a prompt is popular in one slot of the day only); otherwise the prompt is a one-off that never
recurs. No published figure is used for these values: they are assumptions, and ``--sweep``
shows the result over the repeat share, the Zipf exponent and the set size. One scope (tenant,
pool, params) throughout: every key belongs to the same pool.

Cache: exact match, the product's default fixed TTL (``CacheSettings.ttl_s``, 3600 s, a hit
never extends it), on the simulated clock. A request hits when its key has a live entry; else
it is a generation that stores an entry. The cache is simulated from one TTL before the first
scored day with an empty cache. Each generation costs ``--gen-gpu-s`` GPU-seconds (default
1 / 0.381 = 2.625 s: the l4 replica of the closed loop serves 0.381 requests/s within the SLO
on the Azure conv token pairs, sim/README.md "Sizing"; one replica = one GPU), warm ones too,
at the moment they run.

Pools. Load = in flight / Ready replicas, in flight = generations started in the last 60 s /
60 x gen_gpu_s (Little's law, in GPUs; the product's in-flight requests / (replicas x
replica_slots) is the same ratio when a request holds its slot replica_slots / per-replica
capacity seconds), warm ones included; idle = ``cache.warming.plan.idle``.
- fixed: ``--capacity-rps`` requests/s, default 1.2 x the busiest history window (the
  planner's 20 % headroom over the highest rate seen before the scored days), capacity_rps x
  gen_gpu_s GPUs: sized for the peak without counting on the cache;
- autoscaled: the forecaster's backtest (``forecaster.backtest.run.run_backtest``) on the
  scaled arrivals, its ``predictive`` policy (the planner every 60 s, replicas Ready after
  ``--warmup-s``) at 1 / gen_gpu_s requests/s per replica; ``peak_slot`` gets capacity per
  replica x the replicas decided, as the forecaster publishes it (forecaster/state.py
  ``forecast_document``). The autoscaler sees arrivals, not misses (the pool is sized without
  counting on the cache) and neither the hits warming adds nor its own generations.

Forecast: that backtest's rolling forecasts (the model chosen daily at the warm-up's lead, as
the live forecaster's, ``forward`` in between), one origin per window, made at the window's
start knowing the windows before; the mean, as the forecaster publishes it. Each tick the
warmer hands ``peak_slot`` one point per window, (window start, requests/s), for the current
window and the next ones of the forecast's horizon (3 windows by default; ``lead_s`` 900
reaches 2 of them). Oracle: the same points with the true rates. The live forecaster
publishes 1-minute steps; the trace has 10-minute windows, so the bench's steps are those.

Warming: every 15 s tick, when ``peak_slot`` names a slot and the pool is idle, the keys
``choose`` returns for it are regenerated, paced by ``allowance`` (a token bucket of
``--budget-per-min`` holding ``burst`` tokens; a generation runs at the moment a token is
there, within the tick, in time order with the requests). A warm entry has the normal TTL.
Popularity as the product keeps it (cache/warming/popularity.py): every request (hit or
stored miss) is counted in its (day, slot) sorted set, at most ``--keep-per-slot`` members,
the lowest score trimmed at once when a newcomer makes one too many (equal scores by member
name: the bench names a key by a 64-bit hash of it, as the product's are SHA-256 digests;
``slot_counts``); a candidate's count is its sum over the ``history_days`` days before the
target slot's day, ``days_seen`` the number of those days it is a member on. Warm generations
are not counted. Only the ``top_k`` candidates by (count, name) are handed to ``choose``, as
the product's ``Popularity.candidates`` does.

Peak slots (scored): each scored day's ``--peak-slots`` 10-minute windows with the highest
true rate (default 6: an hour's worth), the same for every run.

Reported per run (JSON ``runs.{off,forecast_fixed,oracle_fixed,forecast_autoscaled,
oracle_autoscaled}``): ``requests``, ``hits``, ``hit_ratio``; ``peak_requests``, ``peak_hits``,
``peak_hit_ratio``; ``generations`` (misses), ``peak_misses``, ``warm_generations``; ``gpu_s``
(all generations x gen_gpu_s), ``peak_gpu_s`` (generations started in peak slots, warm ones
included), ``moved_gpu_s`` (warm generations started outside peak slots whose entry was then
hit in a peak slot), ``warm_hits``, ``warm_wasted`` (warm entries never hit before they
expired or the replay ended), ``warm_max_per_min`` (most warm generations in one clock
minute), ``targeted_slots`` (distinct slots warmed for) and ``targeted_peak_slots`` (of those,
peak slots), ``named_ticks`` (ticks in which ``peak_slot`` named a slot) and ``busy_ticks`` (of
those, ticks in which the pool was not idle); the off run also ``warmable_peak_gpu_s``: the
ceiling, the GPU-s of its peak-slot misses that warming every peak slot's chosen keys just
before it would have saved (``warmable_gpu_s``); ``vs_off``: peak_gpu_s, gpu_s and peak_misses
of the run over the off run's. Top level: ``config`` (every option), ``workload``, ``pool``
(the fixed one), ``policy``, ``forecast`` (the backtest's errors at its lead step, the models
chosen, and ``autoscaler``: the predictive policy's replica-minutes and minutes short),
``peak_slots`` (epoch window numbers: start = number x 600 s), ``sweep`` (with ``--sweep``: one
row per setting, each with the five runs) and ``wall_s``.

Measured (3 December 2026, defaults, ``--sweep``, 49 s on 2 shared cores): with the
forecaster's forecast warming never ran, on either pool: the model chosen is last value on
6 days of 7 and seasonal level on one, and neither forecast a rise of ``min_rise`` (20 %)
within ``lead_s``. With the oracle forecast it took 0.33 % of the peak slots' GPU-seconds off
them on the fixed pool (peak hit ratio 0.157 -> 0.160, 417 warm generations, 36 % wasted) and
0.29 % on the autoscaled pool, whose capacity follows demand so ``peak_fraction`` always
holds: it warmed for 172 slots (14 of them peak slots), 2,433 generations, 37 % wasted, +0.19 %
GPU-seconds in all, and was busy in 73 % of the ticks that named a slot. The ceiling (every
peak slot's chosen keys warmed) was 2.4 % of the peak GPU-seconds; 4.4 % with counts kept
untrimmed (``--keep-per-slot 100000``): with mostly one-off prompts, 100 members per slot and
day drop hot keys before their second request.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cache.settings import CacheSettings
from cache.warming.plan import WarmCandidate, WarmPolicy, allowance, choose, idle, peak_slot, wait_s
from cache.warming.settings import WarmingSettings
from forecaster.backtest.run import BacktestConfig, run_backtest
from forecaster.errors import TraceFormatError
from forecaster.series import Traffic
from forecaster.sources.traces import read_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
TRACE = DATA / "traces" / "servegen-m-large"
DAY_S = 86400
TICK_S = 15.0  # the warmer's decision period (as the backtest's tick)
# l4 replica: 0.381 requests/s within the SLO (sim/README.md, "Sizing"): GPU-s per generation.
GEN_GPU_S = round(1 / 0.381, 3)
MODELS = ["last_value", "seasonal_naive", "seasonal_level", "ets_level", "holt_winters"]
WARM_DEFAULTS = {name: f.default for name, f in WarmingSettings.model_fields.items()}


@dataclass(frozen=True)
class Prompts:
    """The prompt-identity model (module doc): share of requests that ask a popular prompt,
    Zipf exponent over a slot's set, size of each time-of-day slot's set."""

    repeat_share: float = 0.3
    zipf_s: float = 1.0
    per_slot: int = 1000


@dataclass(frozen=True)
class Requests:
    """Arrivals sorted by time. t: epoch s, shape (n,); key: int64, >= 0 a popular prompt
    (slot of day x per_slot + rank), < 0 a one-off (unique)."""

    t: np.ndarray
    key: np.ndarray


def arrivals(rates: np.ndarray, start: float, step: float, seed: int) -> np.ndarray:
    """Poisson arrival times (epoch s, sorted) for per-window rates (requests/s, shape (n,))."""
    rng = np.random.default_rng([seed, 1])
    counts = rng.poisson(np.nan_to_num(rates) * step)
    window = np.repeat(np.arange(rates.size), counts)
    return np.sort(start + (window + rng.random(window.size)) * step)


def draw_prompts(t: np.ndarray, prompts: Prompts, slot_s: int, seed: int) -> Requests:
    """Keys for arrival times ``t``: a separate random stream from the arrivals', so a sweep
    over the prompt model replays the same arrivals."""
    rng = np.random.default_rng([seed, 2])
    repeat = rng.random(t.size) < prompts.repeat_share
    weights = 1.0 / np.arange(1, prompts.per_slot + 1) ** prompts.zipf_s
    cdf = np.cumsum(weights) / weights.sum()
    rank = np.minimum(np.searchsorted(cdf, rng.random(t.size), side="right"), prompts.per_slot - 1)
    slot = (np.floor(t).astype(np.int64) % DAY_S) // slot_s
    key = np.where(repeat, slot * prompts.per_slot + rank, -1 - np.arange(t.size, dtype=np.int64))
    return Requests(t, key.astype(np.int64))


def key_hashes(keys: np.ndarray) -> np.ndarray:
    """A 64-bit mix (splitmix64) of each key id, shape as ``keys``: the bench's stand-in for the
    SHA-256 in the product's exact keys. Its 16-hex-digit form is the key name, so names sort
    as these numbers do, and equal counts are ordered by name as Redis orders equal scores
    (lexicographically), which is as good as random for a hash, and unlike ``str(id)``."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def slot_counts(keys: list[int], hashes: list[int], keep: int) -> dict[int, int]:
    """One (day, slot) sorted set after ``keys`` (in arrival order) were counted as the product's
    ``Popularity.record`` does (cache/warming/popularity.py, its Lua script): ZINCRBY 1, then,
    over ``keep`` members, remove the lowest (score, then member name). A newcomer enters with 1
    and may be the one removed. Returns key -> count of the members left."""
    score: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []  # (score, name order, key); stale entries skipped on pop
    for k, h in zip(keys, hashes):
        n = score.get(k, 0) + 1
        score[k] = n
        heapq.heappush(heap, (n, h, k))
        if n == 1 and len(score) > keep:  # only a newcomer grows the set
            while True:
                low, _, gone = heapq.heappop(heap)
                if score.get(gone) == low:
                    break
            del score[gone]
    return score


class Popularity:
    """The per (day, slot of day) counts as the product keeps them (``slot_counts``, at most
    ``keep`` keys each), and the candidates of a target slot as its ``Popularity.candidates``
    makes them: each earlier day's members summed over the ``history_days`` days before, the
    days seen counted, the ``top_k`` by (count, key name) kept (``choose`` looks at no others)."""

    def __init__(self, req: Requests, policy: WarmPolicy, keep: int) -> None:
        self.policy = policy
        group = np.floor(req.t).astype(np.int64) // policy.slot_s  # epoch slot number: day x per day + slot
        hashes = key_hashes(req.key)
        bounds = np.flatnonzero(np.diff(group)) + 1  # requests are in time order: a group is contiguous
        self.counts: dict[int, dict[int, int]] = {}
        self.names: dict[int, int] = {}
        for g, k, h in zip(np.split(group, bounds), np.split(req.key, bounds), np.split(hashes, bounds)):
            if g.size:
                self.counts[int(g[0])] = slot_counts(k.tolist(), h.tolist(), keep)
                self.names.update(zip(k.tolist(), h.tolist()))
        self._top: dict[float, list[tuple[int, str, float, int]]] = {}

    def top(self, slot_start_s: float) -> list[tuple[int, str, float, int]]:
        """(key, key name, count, days_seen) of the slot's candidates, hottest first."""
        if slot_start_s not in self._top:
            per_day = DAY_S // self.policy.slot_s
            group = int(slot_start_s // self.policy.slot_s)
            total: dict[int, list[float]] = {}
            for back in range(1, self.policy.history_days + 1):
                for k, c in self.counts.get(group - back * per_day, {}).items():
                    entry = total.setdefault(k, [0.0, 0])
                    entry[0] += c
                    entry[1] += 1
            rows = sorted(total.items(), key=lambda r: (-r[1][0], self.names[r[0]]))[: self.policy.top_k]
            self._top[slot_start_s] = [(k, f"{self.names[k]:016x}", c, int(d)) for k, (c, d) in rows]
        return self._top[slot_start_s]


@dataclass(frozen=True)
class Pool:
    """The GPU pool the warmer sees. Fixed: ``capacity_rps`` requests/s and ``replicas`` GPUs
    all the time. Autoscaled (``provisioned`` given): per tick of ``tick_s`` from ``t0``, the
    replicas the forecaster's backtest policy decided (``provisioned``, warming ones included:
    the product's published capacity is capacity per replica x decided replicas) and those
    Ready (``ready``, whose slots the load is measured against); ``per_replica_rps`` each."""

    capacity_rps: float
    replicas: float
    per_replica_rps: float = 0.0
    t0: float = 0.0
    tick_s: float = TICK_S
    provisioned: np.ndarray | None = None
    ready: np.ndarray | None = None

    def at(self, now: float) -> tuple[float, float]:
        """(capacity in requests/s as published, Ready replicas) at ``now``."""
        if self.provisioned is None or self.ready is None:
            return self.capacity_rps, self.replicas
        i = min(max(0, int((now - self.t0) // self.tick_s)), self.provisioned.size - 1)
        return float(self.provisioned[i]) * self.per_replica_rps, float(self.ready[i])


@dataclass
class Warming:
    """What the warmer needs: forecast points per window (``points[w]``, w the epoch window
    number now // slot_s: (window start, requests/s) for that window and those after it up to
    ``lead_s`` ahead), the pool."""

    points: dict[int, list[tuple[float, float]]]
    policy: WarmPolicy
    pool: Pool
    popularity: Popularity


@dataclass
class Tally:
    """One run's outcome. hit: per request in the replay span, shape (n,); warm: per warm
    generation (time, hits, peak hits); targeted: start of every slot warmed for."""

    hit: np.ndarray
    warm: list[list[float]] = field(default_factory=list)
    targeted: set[float] = field(default_factory=set)
    named_ticks: int = 0  # ticks in which peak_slot named a slot
    busy_ticks: int = 0  # of those, ticks in which the pool was not idle


def replay(
    req: Requests,
    t0: float,
    t1: float,
    ttl_s: float,
    gen_s: float,
    peak: set[int],
    step: float,
    warming: Warming | None,
) -> Tally:
    """Replay ``req`` (those in [t0 - ttl_s, t1), the cache empty at t0 - ttl_s) through an
    exact cache with a fixed TTL; with ``warming``, the warmer runs every tick from t0.
    ``peak``: epoch window numbers (t // step) of the peak slots."""
    t, key = req.t, req.key
    hit = np.zeros(t.size, dtype=bool)
    tally = Tally(hit)
    start = t0 - ttl_s
    lo, hi = np.searchsorted(t, [start, t1])
    n_ticks = math.ceil((t1 - start) / TICK_S)
    tick_of = ((t[lo:hi] - start) // TICK_S).astype(np.int64)
    oneoff = np.bincount(tick_of[key[lo:hi] < 0], minlength=n_ticks)
    edges = lo + np.searchsorted(tick_of, np.arange(n_ticks + 1))
    expiry: dict[int, float] = {}
    warm_of: dict[int, int] = {}  # key -> index in tally.warm of its live warm entry
    recent = [0] * 4  # generations started in the last 4 ticks (60 s), for the load
    tokens, last = 0.0, None
    keys, times = key.tolist(), t.tolist()
    for tick in range(n_ticks):
        now = start + tick * TICK_S
        gens = int(oneoff[tick])
        plan: list[tuple[float, int, float]] = []
        if warming is not None and now >= t0:
            plan, tokens, last = _warm_plan(warming, now, expiry, recent, gen_s, tokens, last, tally)
        j = 0
        for i in range(int(edges[tick]), int(edges[tick + 1])):
            ti = times[i]
            while j < len(plan) and plan[j][0] <= ti:
                gens += _warm(plan[j], expiry, warm_of, tally, ttl_s)
                j += 1
            k = keys[i]
            if k < 0:
                continue
            if expiry.get(k, -1.0) > ti:
                hit[i] = True
                if k in warm_of:
                    rec = tally.warm[warm_of[k]]
                    rec[1] += 1
                    rec[2] += int(ti // step) in peak
            else:
                expiry[k] = ti + ttl_s
                warm_of.pop(k, None)
                gens += 1
        for p in plan[j:]:
            gens += _warm(p, expiry, warm_of, tally, ttl_s)
        recent[tick % 4] = gens
    return tally


def _warm_plan(
    warming: Warming,
    now: float,
    expiry: dict[int, float],
    recent: list[int],
    gen_s: float,
    tokens: float,
    last: float | None,
    tally: Tally,
) -> tuple[list[tuple[float, int, float]], float, float | None]:
    """The warm generations of the tick starting at ``now``: (time, key, slot end), paced by the
    bucket; none when ``peak_slot`` names no slot or the pool is not idle."""
    policy = warming.policy
    points = warming.points.get(int(now // policy.slot_s))
    capacity_rps, ready = warming.pool.at(now)
    slot = peak_slot(points, now, policy, capacity_rps) if points else None
    if slot is None:
        return [], tokens, last
    tally.named_ticks += 1
    # In flight by Little's law, in GPUs: generations started in the last minute x GPU-s each.
    if not idle(sum(recent) / 60.0 * gen_s, ready, policy):
        tally.busy_ticks += 1
        return [], tokens, last
    top = warming.popularity.top(slot[0])
    cands = [WarmCandidate(name, c, d, expiry[k] if expiry.get(k, -1.0) > now else None) for k, name, c, d in top]
    key_of = {name: k for k, name, _, _ in top}
    chosen = [key_of[name] for name in choose(cands, slot[0], slot[1], policy)]
    plan, tau = [], now
    while chosen and tau < now + TICK_S:
        tokens, last = allowance(tau, last, tokens, policy)
        if tokens < 1:
            tau += wait_s(tokens, policy)
            continue
        plan.append((tau, chosen.pop(0), slot[1]))
        tokens -= 1
    if plan:
        tally.targeted.add(slot[0])
    return plan, tokens, last


def _warm(
    item: tuple[float, int, float], expiry: dict[int, float], warm_of: dict[int, int], tally: Tally, ttl_s: float
) -> int:
    """Regenerate one key at its planned time: 1 generation, or 0 when a request missed on it
    earlier in the tick and its new entry already lives through the slot (as ``choose`` would
    say now; the token is spent)."""
    tau, k, slot_end = item
    if expiry.get(k, -1.0) >= slot_end:
        return 0
    expiry[k] = tau + ttl_s
    warm_of[k] = len(tally.warm)
    tally.warm.append([tau, 0, 0])
    return 1


@dataclass(frozen=True)
class Setup:
    """What every run of one invocation shares. y: requests/s per window, scaled, shape (n,);
    t: arrival times (epoch s); first: first scored window (index into y); peak: the peak
    windows' epoch numbers (window start // step);
    points: forecast points per window for ``forecast`` and ``oracle`` (``Warming.points``)."""

    y: np.ndarray
    start: float
    step: float
    t: np.ndarray
    first: int
    peak: set[int]
    points: dict[str, dict[int, list[tuple[float, float]]]]
    pools: dict[str, Pool]
    forecast: dict[str, Any]


def prepare(args: argparse.Namespace, policy: WarmPolicy) -> Setup:
    """Read and scale the trace, draw the arrivals, pick the peak slots, make the forecasts."""
    traffic = read_trace(Path(args.trace))
    step = traffic.step
    per_day = round(DAY_S / step)
    if step != policy.slot_s:
        raise SystemExit(f"trace windows are {step:g} s; the warming slot is {policy.slot_s} s: they must match")
    raw = traffic.requests[: args.days * per_day]
    if args.eval_days >= args.days or raw.size < args.days * per_day:
        raise SystemExit(f"need {args.days} whole days with at least one before the {args.eval_days} scored")
    y = raw / np.nanmean(raw) * args.mean_rps
    first = (args.days - args.eval_days) * per_day
    capacity = args.capacity_rps or 1.2 * float(np.nanmax(y[:first]))  # the fixed pool
    peak: set[int] = set()  # epoch window numbers (t // step), as the replay reads a request's window
    base = round(traffic.start / step)
    for d in range(args.days - args.eval_days, args.days):
        day = y[d * per_day : (d + 1) * per_day]
        top = np.argsort(-np.nan_to_num(day), kind="stable")[: args.peak_slots]
        peak.update(int(base + d * per_day + i) for i in top)
    # The forecaster's backtest on the scaled arrivals: its rolling forecasts (the model chosen
    # daily at the warm-up lead, as the live forecaster's) and its predictive policy's replicas.
    # test_fraction half a window short of the scored days, so its first origin is theirs exactly.
    per_replica = 1.0 / args.gen_gpu_s
    cfg = BacktestConfig(
        warmup_s=args.warmup_s,
        capacity=per_replica,
        models=args.models,
        test_fraction=(args.eval_days * per_day - 0.5) / y.size,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' convergence warnings during selection
        bt = run_backtest(Traffic(traffic.start, step, y, name=traffic.name), y, cfg, progress=False)
    assert bt.first == first, (bt.first, first)
    fc = bt.forecasts
    horizon = fc.mean.shape[1]
    t_of = traffic.start + np.arange(y.size) * step
    points: dict[str, dict[int, list[tuple[float, float]]]] = {"forecast": {}, "oracle": {}}
    for i, o in enumerate(fc.origins):
        w = int(o)
        span = range(w, min(w + horizon, y.size))
        points["forecast"][base + w] = [(float(t_of[v]), float(fc.mean[i, v - w])) for v in span]
        points["oracle"][base + w] = [(float(t_of[v]), float(y[v])) for v in span]
    run = bt.runs["predictive"]
    t0 = traffic.start + first * step
    pools = {
        "fixed": Pool(capacity, capacity * args.gen_gpu_s),
        "autoscaled": Pool(0.0, 0.0, per_replica, t0, bt.tick_s, run.provisioned, run.ready),
    }
    report: dict[str, Any] = bt.report
    pred = report["policies"]["predictive"]
    summary = {
        "points_per_origin": horizon,
        **{k: report["forecast"][k] for k in ("horizon_steps", "mae", "mae_last_value", "mase")},
        "models_chosen": report["models_chosen"],
        "autoscaler": {
            "warmup_s": args.warmup_s,
            "per_replica_rps": round(per_replica, 4),
            "replica_minutes": round(pred["replica_minutes"], 1),
            "under_provisioned_minutes": pred["under_provisioned_minutes"],
        },
    }
    return Setup(
        y, traffic.start, step, arrivals(y, traffic.start, step, args.seed), first, peak, points, pools, summary
    )


def summarise(
    req: Requests, tally: Tally, t0: float, t1: float, step: float, peak: set[int], gen_s: float
) -> dict[str, Any]:
    """The run's fields (module doc) over the scored span [t0, t1)."""
    scored = (req.t >= t0) & (req.t < t1)
    in_peak = scored & np.isin((req.t // step).astype(np.int64), list(peak))
    warm = np.array(tally.warm, dtype=float).reshape(-1, 3)
    warm_peak = np.isin((warm[:, 0] // step).astype(np.int64), list(peak))
    requests, hits = int(scored.sum()), int(tally.hit[scored].sum())
    peak_requests, peak_hits = int(in_peak.sum()), int(tally.hit[in_peak].sum())
    per_min = np.bincount((warm[:, 0] // 60).astype(np.int64) - int(t0 // 60)) if len(warm) else np.zeros(1)
    return {
        "requests": requests,
        "hits": hits,
        "hit_ratio": round(hits / max(requests, 1), 4),
        "peak_requests": peak_requests,
        "peak_hits": peak_hits,
        "peak_hit_ratio": round(peak_hits / max(peak_requests, 1), 4),
        "generations": requests - hits,
        "peak_misses": peak_requests - peak_hits,
        "warm_generations": len(warm),
        "gpu_s": round((requests - hits + len(warm)) * gen_s, 1),
        "peak_gpu_s": round((peak_requests - peak_hits + int(warm_peak.sum())) * gen_s, 1),
        "moved_gpu_s": round(int(((~warm_peak) & (warm[:, 2] > 0)).sum()) * gen_s, 1),
        "warm_hits": int(warm[:, 1].sum()),
        "warm_wasted": int((warm[:, 1] == 0).sum()),
        "warm_max_per_min": int(per_min.max()),
        "targeted_slots": len(tally.targeted),
        "targeted_peak_slots": sum(int(s // step) in peak for s in tally.targeted),
        "named_ticks": tally.named_ticks,
        "busy_ticks": tally.busy_ticks,
    }


def warmable_gpu_s(
    req: Requests,
    hit: np.ndarray,
    popularity: Popularity,
    policy: WarmPolicy,
    peak: set[int],
    step: float,
    gen_s: float,
) -> float:
    """The ceiling of what warming can move off the peak: GPU-s of the first request in each peak
    slot of each key ``choose`` would consider for it (top_k, seen on min_days_seen days) that
    missed in the run ``hit`` comes from (the off run). Warming every such key just before its
    slot, whatever the forecast, the load and the budget, would turn exactly these into hits."""
    saved = 0
    for window in peak:
        keys = {k for k, _, _, days in popularity.top(window * step) if days >= policy.min_days_seen}
        lo, hi = np.searchsorted(req.t, [window * step, (window + 1) * step])
        first: set[int] = set()
        for i in range(int(lo), int(hi)):
            k = int(req.key[i])
            if k in keys and k not in first:
                first.add(k)
                saved += not hit[i]
    return round(saved * gen_s, 1)


def run_setting(setup: Setup, prompts: Prompts, settings: WarmingSettings, args: argparse.Namespace) -> dict[str, Any]:
    """The three runs (off, forecast, oracle) on one prompt model, with ratios to off."""
    policy = settings.policy()
    req = draw_prompts(setup.t, prompts, policy.slot_s, args.seed)
    t0 = setup.start + setup.first * setup.step
    t1 = setup.start + setup.y.size * setup.step
    ttl = float(CacheSettings.model_fields["ttl_s"].default)
    popularity = Popularity(req, policy, settings.keep_per_slot)
    runs: dict[str, Any] = {}
    for name in RUNS:
        fc, _, pool = name.partition("_")
        warming = None if name == "off" else Warming(setup.points[fc], policy, setup.pools[pool], popularity)
        tally = replay(req, t0, t1, ttl, args.gen_gpu_s, setup.peak, setup.step, warming)
        runs[name] = summarise(req, tally, t0, t1, setup.step, setup.peak, args.gen_gpu_s)
        if name == "off":
            runs[name]["warmable_peak_gpu_s"] = warmable_gpu_s(
                req, tally.hit, popularity, policy, setup.peak, setup.step, args.gen_gpu_s
            )
    off = runs["off"]
    for run in runs.values():
        run["vs_off"] = {
            k: round(run[k] / off[k], 4) if off[k] else None for k in ("peak_gpu_s", "gpu_s", "peak_misses")
        }
    return runs


RUNS = ("off", "forecast_fixed", "oracle_fixed", "forecast_autoscaled", "oracle_autoscaled")
SWEEP = (
    [("repeat_share", v) for v in (0.0, 0.1, 0.5)]
    + [("zipf_s", v) for v in (0.6, 0.8, 1.2, 1.4)]
    + [("per_slot", v) for v in (100, 10000)]
)


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run every replay (and the sweep with ``--sweep``), print the tables; returns the JSON
    document (module docstring: fields and units)."""
    started = time.perf_counter()
    # The product's per-pool settings (cache/warming/settings.py), so the bench runs its defaults.
    settings = WarmingSettings(
        enabled=True,
        history_days=args.history_days,
        top_k=args.top_k,
        budget_per_min=args.budget_per_min,
        lead_s=args.lead_s,
        min_days_seen=min(WARM_DEFAULTS["min_days_seen"], args.history_days),
        idle_load=args.idle_load,
        peak_fraction=args.peak_fraction,
        min_rise=args.min_rise,
        keep_per_slot=args.keep_per_slot,
    )
    policy = settings.policy()
    ttl = CacheSettings.model_fields["ttl_s"].default
    prompts = Prompts(args.repeat_share, args.zipf_s, args.prompts_per_slot)
    setup = prepare(args, policy)
    report: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workload": {
            "trace": Path(args.trace).name,
            "mean_rps": args.mean_rps,
            "days": args.days,
            "scored_days": args.eval_days,
            "arrivals": int(setup.t.size),
            **asdict(prompts),
            "prompt_model": "assumed: no public trace has prompt identity over several days",
        },
        "pool": {
            "capacity_rps": round(setup.pools["fixed"].capacity_rps, 4),
            "gen_gpu_s": args.gen_gpu_s,
            "replicas": round(setup.pools["fixed"].replicas, 2),
            "ttl_s": ttl,
        },
        "policy": {**asdict(policy), "keep_per_slot": settings.keep_per_slot},
        "forecast": setup.forecast,
        "peak_slots": sorted(setup.peak),  # epoch window numbers: start = number x 600 s
        "runs": run_setting(setup, prompts, settings, args),
    }
    if args.sweep:
        report["sweep"] = []
        for field_name, value in SWEEP:
            p = Prompts(**{**asdict(prompts), field_name: value})
            report["sweep"].append(
                {"setting": f"{field_name}={value}", **asdict(p), "runs": run_setting(setup, p, settings, args)}
            )
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def render(report: dict[str, Any]) -> str:
    """The side-by-side table (and the sweep's) and what it was computed on."""
    w, pool, pol = report["workload"], report["pool"], report["policy"]
    fc = report["forecast"]
    auto = fc["autoscaler"]
    lines = [
        f"{w['trace']} scaled to {w['mean_rps']:g} req/s mean, {w['days']} days, last {w['scored_days']} scored; "
        f"{w['arrivals']} arrivals; prompts (assumed, see doc): repeat share {w['repeat_share']:g}, Zipf s "
        f"{w['zipf_s']:g}, {w['per_slot']} per 10-min slot",
        f"fixed pool {pool['capacity_rps']:g} req/s = {pool['replicas']:g} GPUs; autoscaled pool: the backtest's "
        f"predictive policy at {auto['per_replica_rps']:g} req/s per GPU, warm-up {auto['warmup_s']:g} s, "
        f"{auto['replica_minutes'] / 60:.0f} GPU-h, {auto['under_provisioned_minutes']:g} min short; "
        f"{pool['gen_gpu_s']:g} GPU-s per generation",
        f"cache TTL {pool['ttl_s']} s fixed; warming: top {pol['top_k']}, >= {pol['min_days_seen']} of "
        f"{pol['history_days']} days ({pol['keep_per_slot']} kept per slot and day), {pol['budget_per_min']:g}/min, "
        f"lead {pol['lead_s']} s, idle < {pol['idle_load']:g}, peak >= {pol['peak_fraction']:g} x capacity and "
        f"> {1 + pol['min_rise']:g} x now",
        f"forecast (the backtest's, {fc['horizon_steps']} window(s) ahead): MAE {fc['mae']:.4g} req/s "
        f"(last value {fc['mae_last_value']:.4g}), models chosen per origin {fc['models_chosen']}",
        f"peak slots: each scored day's top {len(report['peak_slots']) // w['scored_days']} 10-min windows by true rate",
        "",
    ]
    lines += _table([(name, run) for name, run in report["runs"].items()])
    if report.get("sweep"):
        lines += ["", "sweep (one prompt-model setting changed from the above each row):"]
        rows = []
        for row in report["sweep"]:
            rows += [(f"{row['setting']} {name}", run) for name, run in row["runs"].items()]
        lines += _table(rows)
    return "\n".join(lines)


def _table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    head = (
        "run",
        "peak hit",
        "hit",
        "peak GPU-s",
        "vs off",
        "warmable",
        "moved GPU-s",
        "warm gens",
        "wasted",
        "GPU-s",
        "vs off",
        "max/min",
        "slots (peak)",
        "named/busy ticks",
    )
    body = [
        (
            name,
            f"{r['peak_hit_ratio']:.4f}",
            f"{r['hit_ratio']:.4f}",
            f"{r['peak_gpu_s']:.0f}",
            _ratio(r["vs_off"]["peak_gpu_s"]),
            f"{r['warmable_peak_gpu_s']:.0f}" if "warmable_peak_gpu_s" in r else "",
            f"{r['moved_gpu_s']:.0f}",
            str(r["warm_generations"]),
            str(r["warm_wasted"]),
            f"{r['gpu_s']:.0f}",
            _ratio(r["vs_off"]["gpu_s"]),
            str(r["warm_max_per_min"]),
            f"{r['targeted_slots']} ({r['targeted_peak_slots']})",
            f"{r['named_ticks']}/{r['busy_ticks']}",
        )
        for name, r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    return ["  ".join(c.ljust(wd) for c, wd in zip(row, widths)).rstrip() for row in (head, *body)]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _ranged(low: float, high: float = math.inf, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a float in [low, high] ((low, high] with ``open_low``), else a usage error."""

    def parse(text: str) -> float:
        value = float(text)
        if not (low < value if open_low else low <= value) or value > high or math.isnan(value):
            raise argparse.ArgumentTypeError(f"{text} is not in {'(' if open_low else '['}{low:g}, {high:g}]")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` lists every option with its unit)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE, help="ServeGen folder (600 s windows)")
    parser.add_argument("--days", type=int, default=14, help="first N days of the trace used")
    parser.add_argument("--eval-days", type=int, default=7, help="last N of those scored; the rest is history")
    parser.add_argument(
        "--mean-rps", type=_ranged(0, open_low=True), default=1.0, help="mean arrival rate after scaling (req/s)"
    )
    parser.add_argument(
        "--repeat-share", type=_ranged(0, 1), default=0.3, help="share of requests asking a popular prompt"
    )
    parser.add_argument("--zipf-s", type=_ranged(0), default=1.0, help="Zipf exponent over a slot's popular prompts")
    parser.add_argument("--prompts-per-slot", type=int, default=1000, help="popular prompts per 10-min slot of the day")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak-slots", type=int, default=6, help="scored peak windows per day (top by true rate)")
    parser.add_argument(
        "--gen-gpu-s", type=_ranged(0, open_low=True), default=GEN_GPU_S, help="GPU-seconds per generation"
    )
    parser.add_argument(
        "--capacity-rps",
        type=float,
        default=None,
        help="pool capacity (req/s); default 1.2 x the busiest history window",
    )
    for name, kind in (
        ("budget_per_min", float),
        ("top_k", int),
        ("lead_s", int),
        ("history_days", int),
        ("idle_load", float),
        ("peak_fraction", float),
        ("min_rise", float),
        ("keep_per_slot", int),
    ):
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=WARM_DEFAULTS[name],
            help="WarmingSettings field (cache/warming/settings.py)",
        )
    parser.add_argument("--warmup-s", type=float, default=300.0, help="replica warm-up of the autoscaled pool (s)")
    parser.add_argument(
        "--models", type=lambda s: s.split(","), default=MODELS, help="forecaster candidates, comma-separated"
    )
    parser.add_argument("--sweep", action="store_true", help="also the prompt-model sweep (same arrivals)")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "cache_warming.json")
    return parser


if __name__ == "__main__":
    parser = build_parser()
    arguments = parser.parse_args()
    try:
        result = main(arguments)
    except (TraceFormatError, ValueError) as exc:  # a trace or a setting the replay cannot use
        parser.error(str(exc))
    print(render(result))
    arguments.json.parent.mkdir(parents=True, exist_ok=True)
    arguments.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"JSON {arguments.json}, wall {result['wall_s']:.0f} s")
