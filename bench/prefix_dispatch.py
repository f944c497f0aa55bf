"""Prefix-cache-aware dispatch: TTFT, prefix cache hit rate and balance per policy, 4 replicas.

    nice -n 10 python bench/prefix_dispatch.py [--json PATH] [--requests N] [--offset N]
        [--mooncake-speedup X] [--conversations N] [--chat-rate X] [--workloads ...]
        [--policies ...] [--workers 1,4] [--bounds]

Workloads: ``mooncake`` (the trace's shared prefixes), ``chat`` (multi-turn), ``agentic`` (long
shared system prompts, tool outputs, many short turns), ``azure_conv`` (the Azure conversation
trace's sizes, nothing shared), ``mixed_chat`` (chat on 2 a100 + 2 t4). Each policy runs with 1
and with 4 router workers (``--workers``): each request reaches one worker at random, and each
worker sees only its own requests and keeps its own prefix index, as ``router serve --workers``
does. Last, issue 33's targets for ``predicted_ttft`` per workload and worker count.

A discrete-event simulation in virtual time (the loop of bench/vtime.py, shared with
bench/dispatch_quality.py), so a whole comparison takes about a minute of CPU and is exactly
repeatable:

- replicas: 4 x the sim's ``a100`` profile, each a ``sim.replica.latency.batch.BatchModel`` with vLLM's
  automatic prefix caching on (sim/replica/latency/prefix.py: 16-token blocks, chained hashes, LRU eviction of
  free cached blocks, prefill charged only for uncached tokens), the model the simulated vLLM
  replica serves with; each replica's step outcomes feed a ``sim.replica.metrics.ReplicaMetrics``
  exactly as the sim's engine does, and the hit rate is read back from that registry's
  Prometheus text (``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``);
- requests: chat bodies as the replayer builds them. Mooncake: ``sim.client.replay.plan_requests``
  with ``shared_prefixes`` (each ``hash_ids`` block one deterministic text, so requests share
  the prefixes the trace says), prompts capped to fit the a100's ``max_model_len``. Chat: a
  small multi-turn replay built here (``chat_sessions``): conversations of several turns, each
  turn's prompt = the app's system prompt + the whole conversation so far + a new user
  message, the assistant's turns being the sim's filler answer (sim/replica/tokens.py), so each turn
  extends the previous turn's prompt; the replica gets the token ids of the body
  (``sim.replica.tokens.chat_token_ids``) as the sim's API computes them;
- the router: ``router.dispatch.pick`` (production code) over ``ReplicaView`` snapshots built as
  the router builds them (a scrape every 0.25 s with waiting, running, KV usage and the KV size
  of ``vllm:cache_config_info``, the exact in-flight counts, learned speeds), with the router's
  own prefix state: ``router.dispatch.affinity`` (today's prefix affinity: the replica that served the
  first 2,048 characters in the last 120 s) or ``router.dispatch.prefix_index`` (``prefix_aware``: what
  prefixes went where, chunked by 256 characters, LRU per replica sized from its KV cache).

Policies: ``round_robin``, ``least_request``, ``gpu_load`` (load only; the router's default
before issue 33), ``predicted_ttft`` (the predicted time to first token, router/dispatch/ttft.py;
the default since),
``prefix_affinity`` (gpu_load + today's prefix affinity), ``prefix_aware`` (the new score with
bounded load), ``prefix_exact`` (the same score fed each replica's exact prefix cache content,
read from its block pool at dispatch: the ceiling of vLLM's KV-cache-events feed, which the
router does not consume; it measures what the approximate index loses), ``llm_d_like``:
llm-d's inference-scheduler shape, implemented here from its documented scorers (prefix-cache
scorer: fraction of the prompt's blocks the replica is believed to hold, from the same
approximate index; queue scorer: (max - q) / (max - min) of the waiting queues;
KV-cache-utilization scorer: 1 - KV usage), weights 1:1:1, highest total wins, no load bound.
``oracle``: not a policy but the hit rate a perfect-locality router would reach: every prompt
served where every earlier prompt's blocks are, with no eviction (one unbounded cache), the
ceiling of any dispatch.

Reported per workload and policy: TTFT p50/p99 (ms), prefix cache hit rate (from the replicas'
metrics) and its ratio to the oracle's, throughput (completed requests per second of virtual
time), max/mean replica load (time-averaged open requests per replica, max over mean) and
max/mean of requests served. Per workload, a floor: the TTFT p99 if every request had an idle
replica to itself, without a prefix cache and with the oracle's (no queueing at all), which
tells how much of a policy's p99 is queueing, the only part dispatch can shorten beyond
the prefix hits. And the target's bound (``late_lower_bound``): how many requests must
miss a TTFT p99 1.5x below ``gpu_load``'s under any dispatch, given the oracle's hits,
against the 1 % that p99 allows.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, replace
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import typer
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vtime import SimReplica, load_and_kv_size_signals, replay  # noqa: E402
from router.dispatch import Context, ReplicaView, Weights, pick  # noqa: E402
from router.dispatch.affinity import PrefixMap, prefix_key  # noqa: E402
from router.dispatch.prefix_index import DEFAULT_CHUNK_CHARS, PrefixIndexes, conversation  # noqa: E402
from router.dispatch.ttft import rendezvous  # noqa: E402
from sim import A100, T4, BatchModel, Profile, StepOutcome  # noqa: E402
from sim.client.replay import ReplayConfig, plan_requests  # noqa: E402
from sim.client.traces import read_trace  # noqa: E402
from sim.replica.latency.prefix import DEFAULT_BLOCK_SIZE, KVBlockPool, block_hashes  # noqa: E402
from sim.replica.metrics import ReplicaMetrics  # noqa: E402
from sim.replica.tokens import chat_token_ids, estimate_chat_tokens, filler  # noqa: E402

POLICIES = (
    "round_robin",
    "least_request",
    "gpu_load",
    "prefix_aware",
    "llm_d_like",
    "predicted_ttft",
    "prefix_affinity",
    "prefix_exact",
)
DEFAULT_POLICY = "predicted_ttft"  # the policy the targets are checked for (the router's default)
WORKLOADS = ("mooncake", "chat", "agentic", "azure_conv", "mixed_chat")
FLEET = (A100, A100, A100, A100)
MIXED = (A100, A100, T4, T4)
MOONCAKE = "traces/mooncake/conversation_trace.jsonl"
AZURE_CONV = "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True)
class Req:
    """One request: arrival (virtual s), prompt and output tokens, the replica's block hashes,
    the router's chunk hashes, today's prefix key, the conversation key and the prompt tokens
    its earlier turns sent (router/dispatch/prefix_index.py ``conversation``)."""

    at: float
    prompt: int
    output: int
    blocks: tuple[int, ...]
    chunks: tuple[int, ...]
    key: int | None
    conversation: str | None = None
    carried: int = 0
    head: int = 0


def prepare(bodies: list[tuple[float, dict[str, Any]]]) -> list[Req]:
    """Requests from (arrival s, chat body): token ids as the sim's API computes them."""
    index = PrefixIndexes(DEFAULT_CHUNK_CHARS, 400_000)
    out = []
    for at, body in bodies:
        messages = [(m["role"], m["content"]) for m in body["messages"]]
        ids = chat_token_ids(messages)
        assert len(ids) == estimate_chat_tokens(c for _, c in messages)
        conv, carried, head = conversation(body)
        out.append(
            Req(
                at,
                len(ids),
                body["max_tokens"],
                tuple(block_hashes(ids, DEFAULT_BLOCK_SIZE)),
                tuple(index.hashes(body)),
                prefix_key(body, 2048),
                conv,
                int(carried * len(ids)),
                int(head * len(ids)),
            )
        )
    return out


def mooncake(data_dir: Path, n: int, offset: int, speedup: float) -> list[Req]:
    """``n`` Mooncake requests from the ``offset``-th, arrivals / ``speedup``, prompts built
    from their hash_ids by the replayer and capped so prompt + output fits an a100."""
    rows = read_trace(data_dir / MOONCAKE)[offset : offset + n]
    t0 = rows[0].offset_s
    cap = A100.max_model_len
    rows = [type(r)(r.offset_s - t0, r.context_tokens, max(1, min(r.generated_tokens, 2048)), r.hash_ids) for r in rows]
    cfg = ReplayConfig(
        target="", speedup=speedup, shared_prefixes=True, max_context_tokens=cap - 2048 - 16, stream=False
    )
    plan = plan_requests(rows, None, cfg)  # type: ignore[arg-type]  # every Mooncake row has hash_ids
    return prepare([(p.at_s, p.body) for p in plan])


def chat_sessions(conversations: int, rate: float, seed: int = 0) -> list[Req]:
    """A multi-turn chat replay: ``conversations`` starting as a Poisson process of ``rate``
    per second; 4 apps, each with its own system prompt (~1,500 tokens); 3-8 turns per
    conversation, 20-60 s apart; user messages of 50-400 tokens, answers of 50-300 tokens
    (sent back as the next turn's history, as the sim writes them)."""
    rng = random.Random(seed)
    apps = [f"app {a}: " + "".join(rng.choice("abcdefghij ") for _ in range(6000)) for a in range(4)]
    bodies: list[tuple[float, dict[str, Any]]] = []
    start = 0.0
    for c in range(conversations):
        start += rng.expovariate(rate)
        messages = [{"role": "system", "content": rng.choice(apps)}]
        at = start
        for _ in range(rng.randint(3, 8)):
            words = rng.randint(50, 400)
            messages.append(
                {
                    "role": "user",
                    "content": f"[{c}] " + " ".join(f"w{rng.randrange(999)}" for _ in range(words))[: 4 * words],
                }
            )
            answer = rng.randint(50, 300)
            bodies.append((at, {"model": "sim", "messages": list(messages), "max_tokens": answer}))
            messages.append({"role": "assistant", "content": filler(0, answer)})
            at += rng.uniform(20, 60)
    bodies.sort(key=lambda b: b[0])
    return prepare(bodies)


def agentic_sessions(sessions: int, rate: float, seed: int = 0) -> list[Req]:
    """An agentic replay: ``sessions`` agent runs starting as a Poisson process of ``rate`` per
    second; 3 agents, each with its own long system prompt and tool definitions (~6,000
    tokens); a run is a user task (50-200 tokens) then 6-16 short turns 1-4 s apart, each the
    model's tool call (20-120 output tokens, sent back as the next turn's history) and the
    tool's output (100-1,500 tokens) appended: many short turns, each extending the last."""
    rng = random.Random(seed)
    agents = [f"agent {a}: " + "".join(rng.choice("abcdefghij ") for _ in range(24000)) for a in range(3)]
    bodies: list[tuple[float, dict[str, Any]]] = []
    start = 0.0
    for c in range(sessions):
        start += rng.expovariate(rate)
        words = rng.randint(50, 200)
        task = f"[{c}] " + " ".join(f"t{rng.randrange(999)}" for _ in range(words))[: 4 * words]
        messages = [{"role": "system", "content": rng.choice(agents)}, {"role": "user", "content": task}]
        at = start
        for _ in range(rng.randint(6, 16)):
            answer = rng.randint(20, 120)
            bodies.append((at, {"model": "sim", "messages": list(messages), "max_tokens": answer}))
            messages.append({"role": "assistant", "content": filler(0, answer)})
            size = rng.randint(100, 1500)
            output = " ".join(f"o{rng.randrange(9999)}" for _ in range(size))[: 4 * size]
            messages.append({"role": "user", "content": f"[{c}] tool output: {output}"})
            at += rng.uniform(1, 4)
    bodies.sort(key=lambda b: b[0])
    return prepare(bodies)


def azure_conv(data_dir: Path, n: int, speedup: float) -> list[Req]:
    """``n`` requests of the Azure LLM inference trace's conversation part (2023), arrivals /
    ``speedup``: each a single user message of its own random text of the trace's context
    tokens (capped to fit an a100 with its output), so prompts share almost nothing."""
    rows = read_trace(data_dir / AZURE_CONV)[:n]
    rng = random.Random(0)
    t0 = rows[0].offset_s
    bodies: list[tuple[float, dict[str, Any]]] = []
    for i, row in enumerate(rows):
        out = max(1, min(row.generated_tokens, 2048))
        tokens = max(1, min(row.context_tokens, A100.max_model_len - out - 64))
        text = f"[{i}] " + " ".join(f"a{rng.randrange(9999)}" for _ in range(tokens))[: 4 * tokens]
        body = {"model": "sim", "messages": [{"role": "user", "content": text}], "max_tokens": out}
        bodies.append(((row.offset_s - t0) / speedup, body))
    return prepare(bodies)


def oracle_cached(reqs: list[Req], kv_tokens: int | None = None) -> list[tuple[Req, int]]:
    """(request, prompt tokens found cached) for a perfect-locality router, in arrival order:
    every request served where all earlier prompts' blocks are, i.e. the fleet as one prefix
    cache that saw every request. ``kv_tokens`` None: unbounded (no eviction, the ceiling of
    any dispatch); 0: no prefix cache; else that many tokens of cache, LRU (the fleet's KV
    pooled without duplicates: what perfect locality can keep in the same memory)."""
    blocks = (kv_tokens or 10**12) // DEFAULT_BLOCK_SIZE
    pool = KVBlockPool(blocks, DEFAULT_BLOCK_SIZE, caching=kv_tokens != 0)
    out = []
    for i, r in enumerate(sorted(reqs, key=lambda r: r.at)):
        out.append((r, pool.admit(i, r.blocks, r.prompt, r.prompt)))
        pool.computed(i, r.blocks, r.prompt)
        pool.release(i)
    return out


def hit_rate(cached: list[tuple[Req, int]]) -> float:
    """Tokens found cached / tokens queried, over ``oracle_cached``'s pairs."""
    return sum(c for _, c in cached) / sum(r.prompt for r, _ in cached)


def idle_ttft_p99_ms(cached: list[tuple[Req, int]]) -> float:
    """TTFT p99 (ms) if every request found an idle ``a100`` holding its cached prefix (the
    pairs of ``oracle_cached``): its own chunked prefill of the uncached tokens and nothing
    else, the floor no dispatch policy goes below. Each is stepped through a fresh
    ``BatchModel``; the cached prefix's KV reads are left out (at most 2 ms a step), which only
    lowers the floor."""
    ttft = []
    for r, cached_tokens in cached:
        model, elapsed = BatchModel(FLEET[0]), 0.0
        model.submit(0, r.prompt - cached_tokens, 1)
        while True:
            out = model.step()
            elapsed += out.duration_s
            if out.first_token:
                break
        ttft.append(elapsed * 1000)
    return round(float(np.percentile(ttft, 99)), 1)


def prefill_capacity_tokens(seconds: float) -> int:
    """The most prompt tokens one idle ``a100`` prefills within ``seconds``: full steps of
    ``max_num_batched_tokens``, each costing its prefill and the step's base time and nothing
    else (no decodes, no KV reads), so the count is optimistic."""
    p = FLEET[0]
    lo, hi = 0, int(seconds / p.prefill_s_per_token) + 1
    while lo < hi:  # the largest count whose time fits
        mid = (lo + hi + 1) // 2
        steps = -(-mid // p.max_num_batched_tokens)
        if mid * p.prefill_s_per_token + steps * p.decode_base_s <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _packs(sizes: list[int], bins: int, capacity: int) -> bool:
    """Whether ``sizes`` fit into ``bins`` bins of ``capacity`` (depth-first, largest first,
    bins of equal load tried once; exact, exponential in the worst case, instant for the
    trace's bursts of up to 17)."""
    items, load = sorted(sizes, reverse=True), [0] * bins

    def place(i: int) -> bool:
        if i == len(items):
            return True
        tried = set()
        for b in range(bins):
            if load[b] in tried or load[b] + items[i] > capacity:
                continue
            tried.add(load[b])
            load[b] += items[i]
            if place(i + 1):
                return True
            load[b] -= items[i]
        return False

    return place(0)


def late_lower_bound(cached: list[tuple[Req, int]], deadline_s: float) -> int:
    """Requests whose TTFT must exceed ``deadline_s`` under ANY dispatch over the fleet, given
    the prefix hits of ``cached`` (``oracle_cached``'s pairs, in arrival order). Requests arriving at the same
    instant (a burst) must each be prefilled by their deadline: the on-time ones of a replica
    share ``prefill_capacity_tokens(deadline_s)``. The k smallest uncached prompts are the
    likeliest k to fit, so the largest k whose prompts pack into the fleet's replicas is the
    most that can be on time; the rest of the burst is late. Optimistic for the dispatcher
    (empty replicas at every burst, no decode, no step overheads beyond the base), so a
    lower bound."""
    capacity = prefill_capacity_tokens(deadline_s)
    late = 0
    for _, burst in groupby(cached, key=lambda rc: rc[0].at):
        sizes = sorted(r.prompt - tokens for r, tokens in burst)
        k = len(sizes)
        while k and not _packs(sizes[:k], len(FLEET), capacity):
            k -= 1
        late += len(sizes) - k
    return late


def llm_d_like(views: list[ReplicaView], match: dict[str, float], ticket: int) -> ReplicaView:
    """Sum of three 0..1 scorers, equal weights, highest wins (see the module docstring)."""
    queues = [(v.signals.waiting or 0.0) if v.signals else 0.0 for v in views]
    lo, hi = min(queues), max(queues)
    totals = []
    for v, q in zip(views, queues, strict=True):
        queue_score = 1.0 if hi == lo else (hi - q) / (hi - lo)
        kv_score = 1.0 - ((v.signals.kv_usage or 0.0) if v.signals else 0.0)
        totals.append(match.get(v.key, 0.0) + queue_score + kv_score)
    n = len(views)
    return views[max(range(n), key=lambda i: (totals[i], -((i - ticket) % n)))]


@dataclass
class Worker:
    """One router worker's own state (``--workers N``: separate processes sharing nothing):
    its prefix index and affinity map, its ticket, and per replica its open requests, their
    pending prefill and that count at the replica's last scrape (``Replica.inflight_at_scrape``)."""

    index: PrefixIndexes
    affinity: PrefixMap
    open: list[int]
    pending: list[int]
    at_scrape: list[int]
    seen: list[float | None]
    ticket: int = 0

    def sync(self, replicas: list[SimReplica]) -> None:
        """Take each replica's new scrape as this worker would: its own open count then (counts
        change only in the route and step callbacks, which call this first)."""
        for r, rep in enumerate(replicas):
            if rep.scraped_at != self.seen[r]:
                self.seen[r], self.at_scrape[r] = rep.scraped_at, self.open[r]


def run(
    reqs: list[Req], policy: str, weights: Weights, fleet: tuple[Profile, ...] = FLEET, workers: int = 1, seed: int = 0
) -> dict[str, Any]:
    """Simulate one policy over ``reqs`` on ``fleet`` with ``workers`` router workers (each
    request to one of them at random, as the kernel spreads connections; each sees only its own
    requests and keeps its own prefix state; the replicas' scrapes and learned speeds are the
    same for all); returns its row of the table."""
    replicas = [SimReplica(f"r{i}", p, BatchModel(p, prefix_caching=True)) for i, p in enumerate(fleet)]
    metrics = [ReplicaMetrics(rep.key, lambda: 0.0, lambda: 0.0, lambda: 0.0) for rep in replicas]
    n = len(replicas)
    weights = replace(weights, ttft=replace(weights.ttft, workers=workers))  # as router serve --workers sets it
    crew = [
        Worker(PrefixIndexes(DEFAULT_CHUNK_CHARS, 400_000), PrefixMap(120.0), [0] * n, [0] * n, [0] * n, [None] * n)
        for _ in range(workers)
    ]
    spread = random.Random(seed + 1)
    worker_of = [spread.randrange(workers) for _ in reqs]
    matched: dict[int, dict[str, float]] = {}
    owed: dict[int, tuple[int, int]] = {}  # request -> (replica, pending prefill its worker counts)

    def leased(i: int, key: str) -> int:
        """Pending prefill the router counts: the prompt less what the index says is cached."""
        tokens = round(reqs[i].prompt * (1.0 - matched.pop(i, {}).get(key, 0.0)))
        w, r = crew[worker_of[i]], int(key[1:])
        w.open[r] += 1
        w.pending[r] += tokens
        owed[i] = (r, tokens)
        return tokens

    def route(i: int, views: list[ReplicaView], ctx: Context) -> str:
        """The policy's choice, updating the router's prefix state as the router does on dispatch."""
        req = reqs[i]
        w = crew[worker_of[i]]
        w.sync(replicas)
        w.ticket += 1
        ctx.ticket = w.ticket
        views = [
            replace(v, inflight=w.open[r], inflight_at_scrape=w.at_scrape[r], prefill_tokens=w.pending[r])
            for v in views
            for r in [int(v.key[1:])]
        ]
        if policy == "prefix_affinity":
            ctx.preferred = w.affinity.get(req.key, ctx.now)
            chosen = pick(views, "gpu_load", ctx, weights).key
            w.affinity.put(req.key, chosen, ctx.now)
        elif policy in ("prefix_aware", "llm_d_like", "predicted_ttft"):
            ctx.prefix_match = w.index.matches([v.key for v in views], req.chunks)
            ctx.prompt_tokens = req.prompt
            ctx.conversation, ctx.carried_tokens, ctx.head_tokens = req.conversation, req.carried, req.head
            chosen = (
                pick(views, policy, ctx, weights)
                if policy != "llm_d_like"
                else llm_d_like(views, dict(ctx.prefix_match), ctx.ticket)
            ).key
            matched[i] = dict(ctx.prefix_match)
            if policy == "predicted_ttft" and chosen == rendezvous(req.conversation or "", [v.key for v in views]):
                # what the router leases as pending prefill there: less the carried turns, as predicted
                matched[i][chosen] = max(matched[i].get(chosen, 0.0), req.carried / req.prompt)
            rep_signals = replicas[int(chosen[1:])].signals
            w.index.record(chosen, req.chunks, rep_signals.kv_capacity_tokens if rep_signals else None)
        elif policy == "prefix_exact":
            # What each replica's prefix cache holds right now, read from its block pool: the
            # most a router fed vLLM's KV cache events could know (blocks in flight excepted).
            size = DEFAULT_BLOCK_SIZE
            ctx.prefix_match = {
                v.key: replicas[int(v.key[1:])].model.pool.lookup(req.blocks, req.prompt) * size / req.prompt
                for v in views
            }
            ctx.prompt_tokens = req.prompt
            matched[i] = dict(ctx.prefix_match)
            chosen = pick(views, "prefix_aware", ctx, weights).key
        else:
            chosen = pick(views, policy, ctx, weights).key
        return chosen

    def on_step(r: int, out: StepOutcome) -> None:
        """A step's prefix-cache counters, published as the sim's engine does; the workers'
        own counts of the requests whose first token or end it brought."""
        m = metrics[r]
        m.prompt_tokens.inc(out.prompt_tokens + out.cached_tokens)
        m.prefix_cache_queries.inc(out.queried_tokens)
        m.prefix_cache_hits.inc(out.cached_tokens)
        for w in crew:
            w.sync(replicas)
        for i in out.first_token:
            rep_index, tokens = owed[i]
            crew[worker_of[i]].pending[rep_index] -= tokens
            owed[i] = (rep_index, 0)
        for i in out.finished:
            rep_index, tokens = owed.pop(i)
            w = crew[worker_of[i]]
            w.pending[rep_index] -= tokens
            w.open[rep_index] -= 1

    def fits(i: int) -> list[int]:  # a prompt over a replica's context may only go elsewhere
        need = reqs[i].prompt + reqs[i].output
        return [r for r, rep in enumerate(replicas) if need <= rep.profile.max_model_len]

    timeline = replay(
        reqs,
        replicas,
        route,
        random.Random(seed),
        signals=load_and_kv_size_signals,
        eligible=fits,
        on_step=on_step,
        leased=leased,
    )
    first, done = timeline.first_token, timeline.done
    end = max(done.values())
    for rep in replicas:
        rep.account(end)
    hits = queries = 0.0
    for m in metrics:
        for family in text_string_to_metric_families(m.render().decode()):
            for s in family.samples:
                if s.name == "vllm:prefix_cache_hits_total":
                    hits += s.value
                elif s.name == "vllm:prefix_cache_queries_total":
                    queries += s.value
    ttft = np.array([(first[i] - reqs[i].at) * 1000 for i in done])
    loads = [rep.load_area / (end - reqs[0].at) for rep in replicas]
    served = [rep.served for rep in replicas]
    return {
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1),
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "throughput_rps": round(len(done) / (end - reqs[0].at), 3),
        "load_max_mean": round(max(loads) / (sum(loads) / len(loads)), 3),
        "served_max_mean": round(max(served) / (sum(served) / len(served)), 3),
        "served": served,
    }


def main(
    json_path: Path = typer.Option(None, "--json", help="Write {workload: {...}} here."),
    data_dir: Path = typer.Option(
        ROOT.parent / "shared" / "data", envvar="PROMPTEDGE_DATA_DIR", help="The shared real-data folder."
    ),
    requests: int = typer.Option(1000, help="Mooncake requests replayed."),
    offset: int = typer.Option(0, help="Skip this many Mooncake requests first (another window)."),
    mooncake_speedup: float = typer.Option(0.5, help="Time compression of the Mooncake trace."),
    conversations: int = typer.Option(300, help="Conversations of the multi-turn chat replay."),
    chat_rate: float = typer.Option(3.0, help="Conversations starting per second (chat replay)."),
    agent_sessions: int = typer.Option(150, help="Agent runs of the agentic replay."),
    agent_rate: float = typer.Option(1.0, help="Agent runs starting per second (agentic replay)."),
    azure_requests: int = typer.Option(1000, help="Azure conv requests replayed."),
    azure_speedup: float = typer.Option(2.0, help="Time compression of the Azure conv trace."),
    mixed_rate: float = typer.Option(1.5, help="Conversations starting per second (chat on the mixed pool)."),
    prefix_weight: float = typer.Option(Weights().prefix, help="prefix_aware's W_prefix (router PREFIX_WEIGHT)."),
    policies: str = typer.Option(",".join(POLICIES), help="Comma-separated subset of the policies to run."),
    workloads_: str = typer.Option(",".join(WORKLOADS), "--workloads", help="Comma-separated subset of the workloads."),
    workers: str = typer.Option("1,4", help="Comma-separated router worker counts to run each policy with."),
    bounds: bool = typer.Option(False, help="Also compute the late-request lower bound of issue 15 (slow)."),
) -> None:
    """Replay every workload under every policy with each worker count; print a table and
    write JSON."""
    weights = Weights(stale_after_s=1.0, prefix=prefix_weight)
    makers = {
        "mooncake": lambda: (
            mooncake(data_dir, requests, offset, mooncake_speedup),
            {"speedup": mooncake_speedup, "offset": offset},
            FLEET,
        ),
        "chat": lambda: (
            chat_sessions(conversations, chat_rate),
            {"conversations": conversations, "rate": chat_rate},
            FLEET,
        ),
        "agentic": lambda: (
            agentic_sessions(agent_sessions, agent_rate),
            {"sessions": agent_sessions, "rate": agent_rate},
            FLEET,
        ),
        "azure_conv": lambda: (
            azure_conv(data_dir, azure_requests, azure_speedup),
            {"requests": azure_requests, "speedup": azure_speedup},
            FLEET,
        ),
        "mixed_chat": lambda: (
            chat_sessions(conversations, mixed_rate, seed=1),
            {"conversations": conversations, "rate": mixed_rate, "fleet": "2 a100 + 2 t4"},
            MIXED,
        ),
    }
    counts = [int(w) for w in workers.split(",")]
    results: dict[str, dict[str, Any]] = {}
    for name in workloads_.split(","):
        reqs, params, fleet = makers[name]()
        span = reqs[-1].at - reqs[0].at
        # the perfect-locality router's hits: no prefix cache, the fleet's KV pooled, unbounded
        oracles = {
            "no_cache": oracle_cached(reqs, 0),
            "pooled_oracle": oracle_cached(reqs, sum(p.kv_capacity_tokens for p in fleet)),
            "oracle": oracle_cached(reqs),
        }
        entry: dict[str, Any] = {
            **params,
            "requests": len(reqs),
            "offered_rps": round(len(reqs) / span, 2),
            "mean_prompt_tokens": round(sum(r.prompt for r in reqs) / len(reqs)),
            "oracle_hit_rate": round(hit_rate(oracles["oracle"]), 4),
            "pooled_oracle_hit_rate": round(hit_rate(oracles["pooled_oracle"]), 4),
            "idle_ttft_p99_ms": {
                "no_cache": idle_ttft_p99_ms(oracles["no_cache"]),
                "oracle": idle_ttft_p99_ms(oracles["oracle"]),
            },
            "prefix_weight": prefix_weight,
            "workers": {},
        }
        for count in counts:
            rows: dict[str, Any] = {}
            for policy in policies.split(","):
                row = rows[policy] = run(reqs, policy, weights, fleet, count)
                row["hit_vs_oracle"] = round(row["hit_rate"] / max(entry["oracle_hit_rate"], 1e-9), 3)
                row["hit_vs_pooled_oracle"] = round(row["hit_rate"] / max(entry["pooled_oracle_hit_rate"], 1e-9), 3)
            entry["workers"][str(count)] = rows
        if bounds and "gpu_load" in entry["workers"].get("1", {}) and fleet == FLEET:
            # issue 15's target: TTFT p99 1.5x lower than load-only; which dispatch could reach it?
            deadline = entry["workers"]["1"]["gpu_load"]["ttft_p99_ms"] / 1.5 / 1000
            entry["target"] = {
                "ttft_p99_ms": round(deadline * 1000, 1),
                "late_allowed": len(reqs) // 100,
                "late_at_least": {kind: late_lower_bound(cached, deadline) for kind, cached in oracles.items()},
            }
        results[name] = entry
    results["targets"] = targets(results, DEFAULT_POLICY)
    print_table(results)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2))


def targets(results: dict[str, dict[str, Any]], policy: str) -> dict[str, Any]:
    """Issue 33's targets for ``policy``, per workload and worker count: its TTFT p99 over the
    best policy's (<= 1.05), gpu_load's over its (>= 1.5 on chat and agentic), its hit rate over
    the pooled oracle's (>= 0.95 on chat) and its load max/mean (<= 1.3)."""
    out: dict[str, Any] = {}
    for name, e in results.items():
        for count, rows in e.get("workers", {}).items():
            if policy not in rows:
                continue
            mine = rows[policy]
            best = min(rows, key=lambda p: rows[p]["ttft_p99_ms"])
            t: dict[str, Any] = {
                "best": best,
                "p99_vs_best": round(mine["ttft_p99_ms"] / max(rows[best]["ttft_p99_ms"], 1e-9), 3),
                "hit_vs_pooled_oracle": mine["hit_vs_pooled_oracle"],
                "load_max_mean": mine["load_max_mean"],
            }
            if "gpu_load" in rows:
                t["gpu_load_p99_over_mine"] = round(rows["gpu_load"]["ttft_p99_ms"] / max(mine["ttft_p99_ms"], 1e-9), 3)
            out[f"{name}/w{count}"] = t
    return out


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(
        "| workload (offered req/s, mean prompt tokens; oracle hit rate unbounded / pooled KV) | workers | policy "
        "| TTFT p50 ms | TTFT p99 ms | hit rate | vs oracle | vs pooled oracle | req/s | load max/mean "
        "| served max/mean |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, e in results.items():
        if "workers" not in e:
            continue
        label = (
            f"{name} ({e['offered_rps']}, {e['mean_prompt_tokens']}; {e['oracle_hit_rate']:.3f} / "
            f"{e['pooled_oracle_hit_rate']:.3f})"
        )
        for count, rows in e["workers"].items():
            for policy in [p for p in POLICIES if p in rows]:
                r = rows[policy]
                print(
                    f"| {label} | {count} | {policy} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} "
                    f"| {r['hit_rate']:.3f} | {r['hit_vs_oracle']:.2f} | {r['hit_vs_pooled_oracle']:.2f} "
                    f"| {r['throughput_rps']:.2f} | {r['load_max_mean']:.2f} | {r['served_max_mean']:.2f} |"
                )
        floor = e["idle_ttft_p99_ms"]
        print(
            f"| {label} | | floor, an idle replica per request: TTFT p99 {floor['no_cache']:.0f} ms without a "
            f"prefix cache, {floor['oracle']:.0f} ms with the oracle's | | | | | | | | |"
        )
        if "target" in e:
            t, least = e["target"], e["target"]["late_at_least"]
            print(
                f"| {label} | 1 | TTFT p99 <= {t['ttft_p99_ms']:.0f} ms (1.5x below gpu_load) allows "
                f"{t['late_allowed']} later; any dispatch has at least {least['no_cache']} without a prefix cache, "
                f"{least['pooled_oracle']} with the pooled oracle's, {least['oracle']} with the oracle's "
                "| | | | | | | | |"
            )
    print()
    print(
        f"| targets of {DEFAULT_POLICY} (workload/workers) | best p99 | p99 / best (<= 1.05) "
        "| gpu_load p99 / its (>= 1.5 chat, agentic) | hit / pooled oracle (>= 0.95 chat) | load max/mean (<= 1.3) |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for key, t in results.get("targets", {}).items():
        print(
            f"| {key} | {t['best']} | {t['p99_vs_best']:.2f} | {t.get('gpu_load_p99_over_mine', 0.0):.2f} "
            f"| {t['hit_vs_pooled_oracle']:.2f} | {t['load_max_mean']:.2f} |"
        )


if __name__ == "__main__":
    typer.run(main)
