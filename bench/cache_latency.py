"""Cache lookup latency: exact hit, semantic hit and miss at concurrency 1, 8 and 32, with the
micro-batching embedder against a naive per-request encode, in one run.

    python bench/cache_latency.py [--json PATH] [--redis-url URL] [--lookups N] [--backend auto|onnx|torch]
    python bench/cache_latency.py --precisions fp32,int8 [--rounds R] [--json PATH] [--redis-url URL]

Data: GPTCache's 999 paraphrase pairs (``../shared/data/cache-eval/gptcache-paraphrases``, MIT):
the first half of the origins are stored; an exact hit asks a stored origin again, a semantic
hit asks the paraphrase of a stored origin that the cache serves (checked in a warm-up pass),
a miss asks the paraphrase of an origin that was not stored. Every lookup in a cell asks a
different text, and the embedder's recent-text cache is off, so every semantic lookup encodes.

The naive baseline encodes each request on its own (one ``encode([text])`` per lookup in the
default thread pool), as a cache without batching does; both sides use the same encoder (the
backend is printed), so the ratio measures batching alone. A second baseline, ``st_naive``, is
what GPTCache's and RedisVL's sentence-transformers vectorizers do per request: the model's
own ``encode`` on torch with torch's default threads (one per core), one text per call; its
ratio measures the encoder path and batching together. Exact lookups never encode, so they run
against the first baseline only. Keys live under a private prefix that
is deleted at the end; no database is flushed. Targets (issue 3): semantic lookup p50 <= 15 ms
at concurrency 1 and batched throughput >= 3x naive at concurrency 32. On a shared machine
wall-clock numbers follow the neighbours' load (printed with the results), so each cell also
reports the process's CPU milliseconds per lookup, which batching is meant to cut.

``--precisions`` (issue 34, item 5) instead compares the encoder's precisions
(``PROMPTEDGE_CACHE_EMBED_PRECISION``, cache/embed/onnx.py) in one run: one cache per precision
under its own prefix, each storing the same origins with its own vectors, with the default
settings (batching embedder, the default verification stage); the semantic cell asks the paraphrases that every
precision serves, so all look up the same texts. Cells run at concurrency 1 and 8, the
precisions back to back within each of R rounds (so the neighbours' load hits them alike).
Each lookup's time is split into the encode (wall ms of its forward pass, on the embedder
thread) and the rest (exact GET, index search, candidates' re-read, verification, Python).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache import CacheRequest, CacheSettings, ResponseCache  # noqa: E402
from cache.embed.batching import BatchingEmbedder, lower_thread_priority  # noqa: E402
from cache.embed.encoder import Encoder  # noqa: E402
from cache.embed.load import load_encoder  # noqa: E402

DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
PAIRS = DATA / "cache-eval" / "gptcache-paraphrases" / "mock_data.json"
CONCURRENCY = (1, 8, 32)


class NaiveEmbedder:
    """One forward pass per request, each on a pool thread (the size of asyncio's default pool,
    at the batched side's thread priority): the baseline."""

    def __init__(self, encoder: Encoder, nice: int) -> None:
        self.encoder = encoder
        self.dim = encoder.dim
        self._pool = ThreadPoolExecutor(
            max_workers=min(32, (os.cpu_count() or 1) + 4), initializer=lower_thread_priority, initargs=(nice,)
        )

    async def embed(self, text: str, timeout_s: float = 60.0) -> np.ndarray:
        vectors = await asyncio.get_running_loop().run_in_executor(self._pool, self.encoder.encode, [text])
        return vectors[0]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def request(text: str) -> CacheRequest:
    return CacheRequest(
        "chat.completions", {"model": "bench", "messages": [{"role": "user", "content": text}]}, "bench"
    )


def response(i: int) -> dict[str, Any]:
    return {
        "id": f"b{i}",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {i}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 50, "total_tokens": 70},
    }


async def run_cell(cache: ResponseCache, texts: list[str], concurrency: int) -> dict[str, Any]:
    """Lookups of texts by `concurrency` workers; latency per lookup and throughput."""
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    queue = list(reversed(texts))

    async def worker() -> None:
        while queue:
            text = queue.pop()
            started = time.perf_counter()
            hit = await cache.lookup(request(text))
            latencies.append(time.perf_counter() - started)
            kind = hit.kind if hit else "miss"
            outcomes[kind] = outcomes.get(kind, 0) + 1

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    ms = sorted(x * 1000 for x in latencies)
    return {
        "lookups": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "lookups_per_s": round(len(ms) / wall, 1),
        # CPU seconds of this process (all threads): what a lookup costs on a shared machine
        "cpu_ms_per_lookup": round(1000 * cpu / len(ms), 2),
        "outcomes": outcomes,
        "loadavg_1m": round(os.getloadavg()[0], 1),
        "latencies_s": latencies,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pairs = json.loads(PAIRS.read_text())
    half = len(pairs) // 2
    client = aioredis.Redis.from_url(args.redis_url)
    prefix = f"promptedge:bench:{uuid.uuid4().hex[:8]}"
    # embedding threads, lanes and window from PROMPTEDGE_CACHE_* as in the router
    settings = CacheSettings(key_prefix=prefix, redis_timeout_s=1.0, embed_timeout_s=30.0)
    encoder = load_encoder(
        settings.embedding_model,
        settings.embedding_threads,
        args.backend or settings.embed_backend,
        settings.onnx_cache_dir,
    )
    cache = ResponseCache(client, settings, encoder=encoder)
    await cache.start()
    assert cache.semantic is not None and cache.semantic.embedder is not None
    batched = BatchingEmbedder(
        encoder,
        window_s=settings.embed_window_s,
        max_batch=settings.embed_max_batch,
        cache_size=0,
        lanes=settings.lanes(),
        nice=settings.embed_nice,
    )
    cache.semantic.embedder = batched
    try:
        for start in range(0, half, 32):  # 32 at a time: within the Redis connection pool
            await asyncio.gather(
                *(
                    cache.store(request(p["origin"]), response(start + i))
                    for i, p in enumerate(pairs[start : min(half, start + 32)])
                )
            )
        # keep only paraphrases the cache serves (the others would be misses in the hit cell)
        semantic = [p["similar"] for p in pairs[:half]]
        outcomes = [await cache.lookup(request(t)) for t in semantic]
        semantic = [t for t, h in zip(semantic, outcomes, strict=True) if h is not None and h.kind == "semantic"]
        misses = [p["similar"] for p in pairs[half:]]
        exact = [p["origin"] for p in pairs[:half]]
        await run_cell(cache, misses[-50:], 8)  # warm-up: allocator, connection pool, encoder threads
        results: dict[str, Any] = {}
        naive = NaiveEmbedder(encoder, settings.embed_nice)
        # loaded last: it sets torch's (process-wide) thread count to its default, one per core
        st_naive = NaiveEmbedder(
            load_encoder(settings.embedding_model, os.cpu_count() or 1, "torch"), settings.embed_nice
        )
        # the two modes of a cell run back to back, so a change in the neighbours' load between
        # cells moves both sides of a ratio alike
        for kind, texts in (("exact", exact), ("semantic", semantic), ("miss", misses)):
            for c in CONCURRENCY:
                modes = [("batched", batched), ("naive", naive)] + ([("st_naive", st_naive)] if kind != "exact" else [])
                for mode, embedder in modes:
                    cache.semantic.embedder = embedder  # type: ignore[assignment]
                    n = min(len(texts), args.lookups * (1 if c == 1 else 2))
                    cell = await run_cell(cache, texts[:n], c)
                    cell.pop("latencies_s")
                    results[f"{mode}/{kind}/{c}"] = cell
                    print(
                        f"  {mode:7} {kind:8} c={c:<2} p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms  "
                        f"{cell['lookups_per_s']:7.1f}/s  {cell['outcomes']}",
                        file=sys.stderr,
                    )
        cache.semantic.embedder = batched
        naive.close()
        st_naive.close()
        return {
            "results": results,
            "backend": getattr(encoder, "backend", "custom"),
            "lanes": batched.lanes,
            "threads_per_pass": settings.embedding_threads,
            "nice": settings.embed_nice,
            "window_s": settings.embed_window_s,
            "stored": half,
            "semantic_queries": len(semantic),
            "forward_passes_batched": batched.batches,
            "cpu_count": os.cpu_count(),
            "loadavg_1m_at_end": os.getloadavg()[0],
        }
    finally:
        await cache.aclose()
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
        await client.aclose()


class TimedEncoder:
    """An Encoder that records each ``encode`` call's wall seconds (on the thread that runs it)."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.backend = getattr(inner, "backend", "custom")
        self.times: list[float] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return self.inner.encode(texts)
        finally:
            self.times.append(time.perf_counter() - started)


def _quantiles(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50_ms": None, "p99_ms": None}
    ms = sorted(x * 1000 for x in seconds)
    return {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2)}


async def precision_main(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--precisions`` comparison (module doc): per precision, kind and concurrency, the
    lookups' p50/p99 over all rounds, the encode's share, CPU ms per lookup, and the load."""
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    pairs = json.loads(PAIRS.read_text())
    half = len(pairs) // 2
    client = aioredis.Redis.from_url(args.redis_url)
    run = uuid.uuid4().hex[:8]
    caches: dict[str, ResponseCache] = {}
    timed: dict[str, TimedEncoder] = {}
    try:
        for precision in precisions:
            settings = CacheSettings(
                key_prefix=f"promptedge:bench:{run}-{precision}",
                redis_timeout_s=1.0,
                embed_timeout_s=30.0,
                embed_precision=precision,
            )
            encoder = load_encoder(
                settings.embedding_model,
                settings.embedding_threads,
                args.backend or settings.embed_backend,
                settings.onnx_cache_dir,
                settings.embedding_package,
                settings.embed_precision,
            )
            timed[precision] = TimedEncoder(encoder)
            cache = ResponseCache(client, settings, encoder=timed[precision])  # type: ignore[arg-type]
            await cache.start()
            assert cache.semantic is not None and cache.semantic.embedder is not None
            # every lookup encodes: no recent-text cache
            cache.semantic.embedder = BatchingEmbedder(
                timed[precision],
                window_s=settings.embed_window_s,
                max_batch=settings.embed_max_batch,
                cache_size=0,
                lanes=settings.lanes(),
                nice=settings.embed_nice,
            )
            caches[precision] = cache
            for start in range(0, half, 32):
                await asyncio.gather(
                    *(
                        cache.store(request(p["origin"]), response(start + i))
                        for i, p in enumerate(pairs[start : min(half, start + 32)])
                    )
                )
        served: set[str] | None = None
        for cache in caches.values():
            texts = [p["similar"] for p in pairs[:half]]
            hits = [await cache.lookup(request(t)) for t in texts]
            mine = {t for t, h in zip(texts, hits, strict=True) if h is not None and h.kind == "semantic"}
            served = mine if served is None else served & mine
        assert served is not None
        kinds = {
            "semantic": [p["similar"] for p in pairs[:half] if p["similar"] in served],
            "miss": [p["similar"] for p in pairs[half:]],
            "exact": [p["origin"] for p in pairs[:half]],
        }
        for cache in caches.values():
            await run_cell(cache, kinds["miss"][-50:], 8)  # warm-up
        latencies: dict[str, list[float]] = {}
        encodes: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        loads: list[float] = []
        for round_ in range(args.rounds):
            for kind, texts in kinds.items():
                for c in (1, 8):
                    n = min(len(texts), args.lookups * (1 if c == 1 else 2))
                    # each round asks other texts where there are enough
                    offset = (round_ * n) % max(1, len(texts) - n + 1)
                    for precision in precisions:
                        key = f"{precision}/{kind}/{c}"
                        timed[precision].times.clear()
                        cell = await run_cell(caches[precision], texts[offset : offset + n], c)
                        latencies.setdefault(key, []).extend(cell.pop("latencies_s"))
                        encodes.setdefault(key, []).extend(timed[precision].times)
                        cpu.setdefault(key, []).append(cell["cpu_ms_per_lookup"])
                        loads.append(os.getloadavg()[0])
            print(f"  round {round_ + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
        results = {
            key: {
                "lookups": len(latencies[key]),
                **_quantiles(latencies[key]),
                "encode": _quantiles(encodes[key]),
                "encode_mean_ms": round(1000 * statistics.mean(encodes[key]), 2) if encodes[key] else 0.0,
                "lookup_mean_ms": round(1000 * statistics.mean(latencies[key]), 2),
                "cpu_ms_per_lookup": round(statistics.median(cpu[key]), 2),
            }
            for key in latencies
        }
        return {
            "mode": "precisions",
            "precisions": precisions,
            "backends": {p: t.backend for p, t in timed.items()},
            "results": results,
            "rounds": args.rounds,
            "semantic_queries": len(kinds["semantic"]),
            "stored": half,
            "loadavg_1m_min": round(min(loads), 1),
            "loadavg_1m_max": round(max(loads), 1),
            "cpu_count": os.cpu_count(),
        }
    finally:
        for cache in caches.values():
            await cache.aclose()
        keys = [k async for k in client.scan_iter(match=f"promptedge:bench:{run}-*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
        await client.aclose()


def precision_table(report: dict[str, Any]) -> str:
    lines = [
        f"{'lookup':9} {'conc':>4} {'precision':>9} | {'p50 ms':>7} {'p99 ms':>7} | {'encode p50':>10} {'p99':>6} "
        f"{'mean':>6} | {'rest mean':>9} | {'cpu ms':>6} | {'n':>5}"
    ]
    for kind in ("semantic", "miss", "exact"):
        for c in (1, 8):
            for precision in report["precisions"]:
                r = report["results"][f"{precision}/{kind}/{c}"]
                e = r["encode"]
                lines.append(
                    f"{kind:9} {c:>4} {precision:>9} | {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} | "
                    f"{e['p50_ms'] if e['p50_ms'] is not None else '-':>10} {e['p99_ms'] if e['p99_ms'] is not None else '-':>6} "
                    f"{r['encode_mean_ms']:>6.2f} | {r['lookup_mean_ms'] - r['encode_mean_ms']:>9.2f} | "
                    f"{r['cpu_ms_per_lookup']:>6.2f} | {r['lookups']:>5}"
                )
    return "\n".join(lines)


def verification_cost(encoder: Encoder, rounds: int = 3) -> dict[str, Any]:
    """Milliseconds the verification stage takes per lookup, rules (``select``) against the
    default stage (the learned verifier with the rules' vetoes: features of every candidate not
    vetoed + the model), on the candidate lists a real
    lookup sees: all 999 origins in one index, each paraphrase's 4 nearest neighbours (cosine
    prefilter of each path applied). Interleaved per lookup so both see the same load; the text
    caches of both paths are cleared before each round, so the learned path parses its query
    cold as a lookup does (a stored text stays parsed after its first comparison, in both).

    Rounds alternate the process's heap as loaded (encoder, verifier: the collector walks it
    all) with the heap frozen as ``router serve`` freezes it after its start
    (router/process/heap.py): ``learned`` and ``rules`` are the frozen rounds, as the router runs them;
    ``learned_unfrozen`` and ``rules_unfrozen`` the others, side by side."""
    from cache.semantic.index import ScopedIndex
    from cache.verify.features import _profile
    from cache.verify.learned import load_verifier
    from cache.verify.rules import _parse, select
    from router.process.heap import freeze_startup_heap

    pairs = json.loads(PAIRS.read_text())
    origins = [p["origin"] for p in pairs]
    queries = [p["similar"] for p in pairs]
    vectors = np.concatenate([encoder.encode(origins[i : i + 64]) for i in range(0, len(origins), 64)])
    qvectors = np.concatenate([encoder.encode(queries[i : i + 64]) for i in range(0, len(queries), 64)])
    index = ScopedIndex(dim=vectors.shape[1], max_entries=len(origins) + 1)
    for i, v in enumerate(vectors):
        index.add(str(i), "bench", v, expires_at=float("inf"))
    verifier = load_verifier()
    threshold = verifier.threshold_for(CacheSettings().semantic_precision_target)
    found = [[(origins[int(n.entry_id)], n.similarity) for n in index.search("bench", q, k=4)] for q in qvectors]
    times: dict[str, list[float]] = {"rules": [], "learned": [], "rules_unfrozen": [], "learned_unfrozen": []}
    for round_ in range(2 * rounds):
        frozen = round_ % 2 == 1
        if frozen:
            freeze_startup_heap()
        else:
            gc.unfreeze()
        suffix = "" if frozen else "_unfrozen"
        _parse.cache_clear()
        _profile.cache_clear()
        for query, candidates in zip(queries, found, strict=True):
            # learned first: it pays the query's cold parse, the rules then find it parsed
            # (the ratio favours the rules)
            learned = [c for c in candidates if c[1] >= verifier.min_cosine]
            started = time.perf_counter()
            verifier.select(query, learned, threshold, vetoes=True)  # the default stage, with the vetoes
            times["learned" + suffix].append(time.perf_counter() - started)
            rules = [c for c in candidates if c[1] >= 0.96]
            started = time.perf_counter()
            select(query, rules, 0.96)
            times["rules" + suffix].append(time.perf_counter() - started)
    gc.unfreeze()
    out: dict[str, Any] = {
        "lookups": len(times["rules"]),
        "candidates_above_prefilter_mean": round(
            float(np.mean([sum(c[1] >= verifier.min_cosine for c in cs) for cs in found])), 2
        ),
        "loadavg_1m": round(os.getloadavg()[0], 1),
    }
    for name, values in times.items():
        ms = sorted(x * 1000 for x in values)
        out[name] = {
            "p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[int(0.99 * len(ms))], 3),
            "max_ms": round(ms[-1], 3),
        }
    return out


def table(report: dict[str, Any]) -> str:
    r = report["results"]
    lines = [
        f"{'lookup':9} {'conc':>4} | {'batched p50':>11} {'p99':>8} {'/s':>7} {'cpu ms':>7} | "
        f"{'naive p50':>9} {'p99':>8} {'/s':>7} {'cpu ms':>7} | {'speed-up':>8} {'cpu ratio':>9} | "
        f"{'st_naive p50':>12} {'/s':>7} {'cpu ms':>7} | {'speed-up':>8}"
    ]
    for kind in ("exact", "semantic", "miss"):
        for c in CONCURRENCY:
            b, n = r[f"batched/{kind}/{c}"], r[f"naive/{kind}/{c}"]
            line = (
                f"{kind:9} {c:>4} | {b['p50_ms']:>11.2f} {b['p99_ms']:>8.2f} {b['lookups_per_s']:>7.1f} "
                f"{b['cpu_ms_per_lookup']:>7.2f} | {n['p50_ms']:>9.2f} {n['p99_ms']:>8.2f} "
                f"{n['lookups_per_s']:>7.1f} {n['cpu_ms_per_lookup']:>7.2f} | "
                f"{b['lookups_per_s'] / n['lookups_per_s']:>7.2f}x "
                f"{n['cpu_ms_per_lookup'] / max(b['cpu_ms_per_lookup'], 1e-9):>8.2f}x | "
            )
            st = r.get(f"st_naive/{kind}/{c}")
            line += (
                f"{st['p50_ms']:>12.2f} {st['lookups_per_s']:>7.1f} {st['cpu_ms_per_lookup']:>7.2f} | "
                f"{b['lookups_per_s'] / st['lookups_per_s']:>7.2f}x"
                if st
                else f"{'-':>12} {'-':>7} {'-':>7} | {'-':>8}"
            )
            lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--redis-url", default=os.environ.get("PROMPTEDGE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--lookups", type=int, default=100, help="lookups per cell at concurrency 1 (x2 above)")
    parser.add_argument(
        "--backend",
        choices=("auto", "onnx", "torch"),
        help="encoder backend of both sides (default: PROMPTEDGE_CACHE_EMBED_BACKEND, auto)",
    )
    parser.add_argument(
        "--verification-only",
        action="store_true",
        help="only the verification stage's cost per lookup: rules against the learned verifier",
    )
    parser.add_argument(
        "--precisions",
        help="compare these encoder precisions instead (comma-separated, e.g. fp32,int8): lookup p50/p99 "
        "and the encode's share, side by side",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the --precisions comparison")
    arguments = parser.parse_args()
    if arguments.precisions:
        report = asyncio.run(precision_main(arguments))
        print(
            f"encoder precisions {', '.join(f'{p} ({b})' for p, b in report['backends'].items())}; "
            f"{report['rounds']} rounds, {report['semantic_queries']} paraphrases served by all"
        )
        print(precision_table(report))
        print(
            f"load average (1 min) during the cells: {report['loadavg_1m_min']:.1f}-{report['loadavg_1m_max']:.1f} "
            f"on {report['cpu_count']} CPUs"
        )
        if arguments.json:
            arguments.json.parent.mkdir(parents=True, exist_ok=True)
            arguments.json.write_text(json.dumps(report, indent=2))
        sys.exit(0)
    if arguments.verification_only:
        cost = verification_cost(load_encoder(backend=arguments.backend or "auto"))
        print(
            f"verification per lookup ({cost['lookups']} lookups, {cost['candidates_above_prefilter_mean']} "
            f"candidates above the learned prefilter on average, load {cost['loadavg_1m']}):"
        )
        for name in ("rules", "learned", "rules_unfrozen", "learned_unfrozen"):
            print(
                f"  {name:16} p50 {cost[name]['p50_ms']:.3f} ms  p99 {cost[name]['p99_ms']:.3f} ms  "
                f"max {cost[name]['max_ms']:.3f} ms"
            )
        print(
            f"  learned / rules p99: {cost['learned']['p99_ms'] / max(cost['rules']['p99_ms'], 1e-9):.2f}x; "
            f"learned unfrozen / frozen p99: "
            f"{cost['learned_unfrozen']['p99_ms'] / max(cost['learned']['p99_ms'], 1e-9):.2f}x"
        )
        if arguments.json:
            arguments.json.parent.mkdir(parents=True, exist_ok=True)
            arguments.json.write_text(json.dumps({"verification": cost}, indent=2))
        sys.exit(0)
    report = asyncio.run(main(arguments))
    print(
        f"encoder backend {report['backend']} ({report['threads_per_pass']} thread(s) per pass), batched: "
        f"{report['lanes']} lanes, window {report['window_s']} s; encoder threads at nice +{report['nice']}"
    )
    print(table(report))
    print(f"load average (1 min) at the end: {report['loadavg_1m_at_end']:.1f} on {report['cpu_count']} CPUs")
    if arguments.json:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(json.dumps(report, indent=2))
