"""A Redis Sentinel failover under traffic through the real router: how long the cache is gone,
what the clients see meanwhile, and whether it comes back by itself.

    python bench/redis_failover.py [--sentinels 3] [--prompts 20] [--concurrency 4]
                                   [--before-s 3] [--after-s 3] [--cache-timeout-s 0.05]
                                   [--json out/redis_failover.json]

Starts a Sentinel group (sim/stack/redis_topology.py: master, replica, ``--sentinels`` sentinels with
``down-after-milliseconds`` 1,000 and ``failover-timeout`` 3,000), one simulated vLLM replica
(``python -m sim serve``) and the router as a user runs it (``python -m router serve``) on the
``redis+sentinel://`` URL with the production defaults (exact cache only: the embedding model's
load is not what is measured; the cache's 50 ms bound; a rate limit on every request, so the
limiter's Redis calls are on the path too). It seeds ``--prompts`` prompts into the cache, waits
until the replica has every write, runs a closed-loop probe (sim/client/traffic/probe.py) for
``--before-s``, SIGKILLs the master, waits for the sentinels to promote the replica, and goes on
until hits return plus ``--after-s``.

Reported, side by side in one run: per phase (``before`` = the baseline, ``outage`` = the
seconds without cache hits, ``after``) the requests, hits, misses, errors (any status but 200),
requests/s and latency p50/p99 (ms), and the outage's ratios to the baseline; plus the
sentinels' own failover time (kill -> a new master named), and hits that served another
request's answer (must be 0). Table on stdout, JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from sim.client.traffic.probe import chat_prompts, phases, probe, wrong_hits  # noqa: E402
from sim.stack.redis_topology import LocalSentinel, binaries_missing  # noqa: E402
from tests.router.router_process import MODEL, start_replica, start_router  # noqa: E402


async def _seed(client: httpx.AsyncClient, url: str, prompts: list[dict[str, Any]]) -> dict[int, set[str]]:
    generated: dict[int, set[str]] = {}
    for i, body in enumerate(prompts):
        for _ in range(200):
            answered = await client.post(url, json=body)
            if answered.headers.get("x-cache") == "exact":
                break
            generated.setdefault(i, set()).add(answered.json()["id"])
            await asyncio.sleep(0.02)
        else:
            raise RuntimeError(f"prompt {i} was never stored")
    return generated


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    with LocalSentinel(sentinels=args.sentinels) as group:
        replica, replica_url = start_replica(tmp, max_model_len=256)
        router = start_router(
            tmp,
            env={
                "PROMPTEDGE_REDIS_URL": group.url,
                "PROMPTEDGE_LOG_FORMAT": "text",
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": replica_url, "model": MODEL}]),
                "PROMPTEDGE_ROUTER_HEALTH_INTERVAL_S": "1",
                "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
                "PROMPTEDGE_ROUTER_RATE_LIMITS": json.dumps(
                    {"*": {"requests_per_s": 100_000, "tokens_per_min": 10**9}}
                ),
                "PROMPTEDGE_CACHE_REDIS_TIMEOUT_S": str(args.cache_timeout_s),
            },
        )
        try:
            url = router.url + "/v1/chat/completions"
            prompts = chat_prompts(MODEL, args.prompts)
            async with httpx.AsyncClient(timeout=30) as client:
                generated = await _seed(client, url, prompts)
                await asyncio.to_thread(group.wait_replica_synced)
                stop = asyncio.Event()
                started = time.monotonic()
                traffic = asyncio.create_task(probe(url, prompts, stop, concurrency=args.concurrency))
                await asyncio.sleep(args.before_s)
                old = group.kill_master()
                fault_t = time.monotonic()
                new = await asyncio.to_thread(group.wait_failover, old, 60.0)
                promoted_s = time.monotonic() - fault_t
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # until hits come back, then --after-s more
                    await asyncio.sleep(0.1)
                    health = (await client.get(router.url + "/health")).json()
                    if health.get("cache") is True:
                        break
                await asyncio.sleep(args.after_s)
                stop.set()
                samples = await traffic
                ended = time.monotonic()
        finally:
            router.stop()
            replica.terminate()
            replica.wait(10)
    rows = phases(samples, started, fault_t, ended)
    for row in rows:
        row["rps"] = round(row["requests"] / row["seconds"], 1) if row["seconds"] else 0.0
    before, outage = rows[0], rows[1]
    return {
        "sentinels": args.sentinels,
        "down_after_ms": group.down_after_ms,
        "concurrency": args.concurrency,
        "cache_timeout_s": args.cache_timeout_s,
        "prompts": args.prompts,
        "old_master_port": old,
        "new_master_port": new,
        "sentinel_failover_s": round(promoted_s, 2),
        "seconds_without_hits": outage["seconds"],
        "requests_served_in_outage": outage["misses"],
        "errors": sum(r["errors"] for r in rows),
        "wrong_hits": len(wrong_hits(samples, generated)),
        "outage_vs_before": {
            "rps": round(outage["rps"] / before["rps"], 2) if before["rps"] else None,
            "p99": round(outage["p99_ms"] / before["p99_ms"], 2) if before["p99_ms"] else None,
        },
        "phases": rows,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'phase':<8} {'seconds':>8} {'requests':>9} {'hits':>6} {'misses':>7} {'errors':>7} "
        f"{'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}"
    ]
    for r in report["phases"]:
        lines.append(
            f"{r['phase']:<8} {r['seconds']:>8.2f} {r['requests']:>9} {r['hits']:>6} {r['misses']:>7} "
            f"{r['errors']:>7} {r['rps']:>7.1f} {r['p50_ms']:>8} {r['p99_ms']:>8}"
        )
    ratio = report["outage_vs_before"]
    lines += [
        f"sentinel failover (kill -> new master named): {report['sentinel_failover_s']} s; "
        f"seconds without cache hits: {report['seconds_without_hits']}; requests served in it: "
        f"{report['requests_served_in_outage']}; errors: {report['errors']}; wrong hits: "
        f"{report['wrong_hits']}",
        f"outage / before: req/s x{ratio['rps']}, p99 x{ratio['p99']}; "
        f"{report['sentinels']} sentinels, down-after {report['down_after_ms']} ms, "
        f"concurrency {report['concurrency']}, cache bound {report['cache_timeout_s']} s; "
        f"load average {report['load_average']}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentinels", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--before-s", type=float, default=3.0)
    parser.add_argument("--after-s", type=float, default=3.0)
    parser.add_argument(
        "--cache-timeout-s",
        type=float,
        default=0.05,
        help="the cache's bound per Redis call (production default 0.05; on a loaded "
        "2-core machine 0.25 keeps the baseline's lookups from timing out)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    reason = binaries_missing()
    if reason:
        sys.exit(f"cannot run: {reason}")
    with tempfile.TemporaryDirectory(prefix="promptedge-failover-") as tmp:
        report = asyncio.run(run(args, Path(tmp)))
    print(table(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"report written to {args.json}")


if __name__ == "__main__":
    main()
