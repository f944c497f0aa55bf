"""Cost of the per-entry error bound per semantic lookup (issue 14's target: p99 <= 2 ms).

Two parts, each timed per lookup with ``time.perf_counter_ns``:

- ``decide``: parsing the entry's stored state and deciding (cache/verify/bound/model.py, pure), for
  the shipped prior, random scores 0.70..1.0 and a pool with labels at every step;
- ``re-read``: the lookup's round trip that re-reads its 4 candidates, without and with the
  pool's counts (HGETALL) in the same pipeline (``SemanticStore.get_many_and_hash``), the two
  interleaved, on the Redis of ``--redis-url`` (a test database: keys under the prefix
  ``promptedge-bench`` are written, then deleted), concurrency 1. The bound adds the
  difference.

    python bench/entry_bound_cost.py [--lookups 20000] [--redis-url redis://127.0.0.1:6379/11] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from cache.verify.bound.model import EntryState, decide, load_prior
from cache.verify.bound.store import BoundStore, entry_state


def _ms(samples: list[int]) -> dict[str, float]:
    a = np.asarray(samples) / 1e6
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        "max_ms": round(float(a.max()), 4),
        "n": len(samples),
    }


def decide_cost(lookups: int, seed: int = 0) -> dict[str, float]:
    prior = load_prior()
    rng = random.Random(seed)
    steps = len(prior.knots)
    from cache.verify.bound.model import PoolState

    pool = PoolState(tuple(rng.randrange(500) for _ in range(steps)), tuple(rng.randrange(50) for _ in range(steps)))
    stored = [json.dumps(EntryState(rng.uniform(-2, 2), rng.uniform(0.1, 1.0), 3, 1).to_json()) for _ in range(64)]
    samples = []
    for i in range(lookups):
        score = rng.uniform(0.70, 1.0)
        raw = stored[i % len(stored)] if i % 2 else ""
        start = time.perf_counter_ns()
        decide(prior, score, entry_state(raw, prior), pool, 0.02)
        samples.append(time.perf_counter_ns() - start)
    return _ms(samples)


async def reread_cost(url: str, lookups: int) -> dict[str, dict[str, float]]:
    from cache.semantic.store import SemanticStore

    client = aioredis.Redis.from_url(url)
    prefix = "promptedge-bench"
    bound = BoundStore(client, prefix, load_prior())
    store = SemanticStore(client, prefix=prefix, dim=384, max_entries=100, stream_maxlen=100, origin="bench")
    rng = np.random.default_rng(0)
    ids = [f"bench{i}" for i in range(4)]
    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * 100}, "finish_reason": "stop"}],
    }
    try:
        for entry_id in ids:
            vector = rng.standard_normal(384).astype(np.float32)
            await store.put(
                entry_id,
                scope="s",
                text="a question of forty characters or so?",
                tenant="t",
                model="m",
                response=answer,
                vector=vector / np.linalg.norm(vector),
                ttl_s=600,
                prompt_tokens=10,
                completion_tokens=100,
            )
        for knot in bound.prior.knots:
            await bound.count_once("bench-pool", knot, True, ids[0], f"query at {knot}", 600)
        without: list[int] = []
        with_pool: list[int] = []
        for i in range(2 * lookups):
            key = bound.pool_key("bench-pool") if i % 2 else None
            start = time.perf_counter_ns()
            await store.get_many_and_hash(ids, key)
            (with_pool if i % 2 else without).append(time.perf_counter_ns() - start)
        return {"reread": _ms(without), "reread_with_pool": _ms(with_pool)}
    finally:
        await store.delete_ids(ids)
        await client.delete(
            bound.pool_key("bench-pool"),
            f"{prefix}:{{sem}}:expiry",
            f"{prefix}:{{sem}}:events",
            f"{prefix}:{{sem}}:groups",
            f"{prefix}:{{sem}}:group:t",
            *(bound.pair_key("bench-pool", ids[0], f"query at {knot}") for knot in bound.prior.knots),
        )
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict[str, Any] = {"decide": decide_cost(args.lookups)}
    report |= asyncio.run(reread_cost(args.redis_url, min(args.lookups, 5000)))
    for part in ("decide", "reread", "reread_with_pool"):
        r = report[part]
        print(
            f"{part:16} p50 {r['p50_ms']:.4f} ms  p99 {r['p99_ms']:.4f} ms  max {r['max_ms']:.3f} ms  ({r['n']} lookups)"
        )
    added = {
        q: round(report["reread_with_pool"][q] - report["reread"][q] + report["decide"][q], 4)
        for q in ("p50_ms", "p99_ms")
    }
    report["added_per_lookup"] = added
    print(
        f"added per lookup (pool in the re-read + decide): p50 {added['p50_ms']:.4f} ms, p99 {added['p99_ms']:.4f} ms"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
