"""Dispatch balance with ``router serve --workers N``: does it matter that each worker only knows
its own in-flight requests?

    python bench/workers_balance.py [--workers 1,2,4] [--replicas 4] [--requests 300] [--rounds 3]
        [--time-scale 4] [--max-tokens 64] [--groups 0] [--redis-url URL] [--json PATH]

Starts ``--replicas`` simulated vLLM replicas (``python -m sim serve``, profile a100, no warm-up,
``--time-scale``), then for each N a router with ``--workers N`` in front of them (cache off:
every request is proxied; policy gpu_load, the default before issue 33), waits until every worker has started,
and sends ``--rounds`` bursts of ``--requests`` concurrent chat completions (distinct prompts,
each on its own connection, so the kernel spreads them over the workers). Per burst it reads
each replica's ``vllm:request_success_total`` before and after (requests per replica) and
samples each replica's ``num_requests_running + num_requests_waiting`` every 20 ms (peak load).
With ``--groups K`` the prompts share K long document prefixes per burst instead (prefix
affinity, which each worker keeps for itself, decides the replicas' prefix cache hits).
Refusals (429/503 when every replica's queue is long: router/README.md, Admission) are counted
per status. Reports, per N, max/mean of requests per replica (1.0 = perfectly even), the median and the worst
burst of the rounds, the replicas' prefix cache hit rate (median); the JSON adds each burst's sampled peak load per replica (a sequential
sampler misses short peaks: indicative only) and its wall time.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import httpx
import typer
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_overhead import PY, ROOT, _wait_ready, free_port, stop, wait_settled  # noqa: E402

MODEL = "bench-model"


def replica_counts(url: str) -> tuple[float, float, float]:
    """(finished requests, prefix cache queries, prefix cache hits; tokens) of one sim replica,
    from its /metrics."""
    finished = queries = hits = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                finished += sample.value
            elif sample.name == "vllm:prefix_cache_queries_total":
                queries += sample.value
            elif sample.name == "vllm:prefix_cache_hits_total":
                hits += sample.value
    return finished, queries, hits


def prompt(i: int, groups: int, burst_id: str) -> str:
    """Request ``i``'s prompt: distinct; with ``groups`` > 0 it starts with one of ``groups``
    shared documents of about 4,000 characters (this burst's own), as chat turns over one
    document do, so where it is sent decides the replicas' prefix cache hits."""
    if groups <= 0:
        return f"burst {burst_id} request {i}"
    group = i % groups
    words = " ".join(f"w{(group * 7919 + k * 104729) % 100003}" for k in range(500))
    return f"document {burst_id}-{group}: {words}\nquestion {i}: what does it say?"


def start_router(
    replicas: list[str], workers: int, redis_url: str, log: Path, extra_env: dict[str, str] | None = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """``python -m router serve --workers N`` in front of ``replicas``, cache off, settled."""
    port = free_port()
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_CACHE_ENABLED": "false",
        "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
        "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": u, "model": MODEL} for u in replicas]),
        **(extra_env or {}),
    }
    proc = subprocess.Popen(
        [PY, "-m", "router", "serve", "--port", str(port), "--workers", str(workers), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url + "/health", proc, timeout_s=180)
    wait_settled(proc.pid, workers)
    return url, proc


async def burst(url: str, replicas: list[str], requests: int, max_tokens: int, groups: int) -> dict[str, object]:
    """``requests`` concurrent completions; per replica: requests finished and peak load; the
    replicas' prefix cache hit rate (hit tokens / queried tokens) over the burst."""
    before = [replica_counts(r) for r in replicas]
    burst_id = uuid.uuid4().hex[:8]
    peaks = [0.0] * len(replicas)
    done = asyncio.Event()

    async def sample(session: aiohttp.ClientSession) -> None:
        while not done.is_set():
            for i, r in enumerate(replicas):
                async with session.get(r + "/metrics") as answer:
                    text = await answer.text()
                load = sum(
                    s.value
                    for f in text_string_to_metric_families(text)
                    for s in f.samples
                    if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
                )
                peaks[i] = max(peaks[i], load)
            await asyncio.sleep(0.02)

    async def one(i: int) -> int:
        # a connector per request: its own connection, accepted by whichever worker the kernel picks
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            body = {
                "model": MODEL,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": prompt(i, groups, burst_id)}],
            }
            async with session.post(
                url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)
            ) as answer:
                await answer.read()
                return answer.status

    async with aiohttp.ClientSession() as sampler_session:
        sampler = asyncio.create_task(sample(sampler_session))
        started = time.monotonic()
        statuses = await asyncio.gather(*(one(i) for i in range(requests)))
        wall = time.monotonic() - started
        done.set()
        await sampler
    await asyncio.sleep(0.5)  # the replicas count a request when it finishes, just after answering
    after = [replica_counts(r) for r in replicas]
    per_replica = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    hits = sum(a[2] - b[2] for a, b in zip(after, before, strict=True))
    mean = sum(per_replica) / len(per_replica)
    return {
        "requests_per_replica": per_replica,
        "max_over_mean": round(max(per_replica) / mean, 3) if mean else None,
        "peak_load_per_replica": peaks,
        "peak_max_over_mean": round(max(peaks) * len(peaks) / sum(peaks), 3) if sum(peaks) else None,
        "prefix_hit_rate": round(hits / queries, 3) if queries else None,
        "wall_s": round(wall, 2),
        "errors": sum(s != 200 for s in statuses),
        "statuses": {str(code): statuses.count(code) for code in sorted(set(statuses))},
    }


def main(
    workers: str = typer.Option("1,2,4", help="Comma-separated worker counts, one router each."),
    replicas: int = typer.Option(4, min=1),
    requests: int = typer.Option(300, min=1, max=2000, help="Concurrent requests per burst."),
    rounds: int = typer.Option(3, min=1, max=20, help="Bursts per worker count."),
    time_scale: float = typer.Option(4.0, help="The replicas' --time-scale (simulated s per wall s)."),
    max_tokens: int = typer.Option(64, min=1),
    groups: int = typer.Option(0, min=0, help="Shared document prefixes per burst (0: every prompt distinct)."),
    redis_url: str = typer.Option("redis://127.0.0.1:6379/14", help="Redis for the router (cache off)."),
    json_path: Path = typer.Option(None, "--json", help="Write the results here."),
) -> None:
    """Print, per worker count, max/mean requests and peak load per replica; write JSON."""
    counts = [int(n) for n in workers.split(",") if n]
    ports = [free_port() for _ in range(replicas)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    sims = [
        subprocess.Popen(
            [
                PY,
                "-m",
                "sim",
                "serve",
                "--port",
                str(p),
                "--model",
                MODEL,
                "--profile",
                "a100",
                "--warmup-s",
                "0",
                "--time-scale",
                str(time_scale),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    results: dict[str, object] = {}
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        for url, proc in zip(urls, sims, strict=True):
            _wait_ready(url + "/health", proc)
        for n in counts:
            log = log_dir / f"workers-balance-router-w{n}.log"
            router_url, router = start_router(urls, n, redis_url, log)
            try:
                bursts = [asyncio.run(burst(router_url, urls, requests, max_tokens, groups)) for _ in range(rounds)]
            finally:
                stop([router])
            worst = max(bursts, key=lambda b: b["max_over_mean"] or 0)
            results[str(n)] = {
                "bursts": bursts,
                "max_over_mean_worst": worst["max_over_mean"],
                "max_over_mean_median": statistics.median(b["max_over_mean"] or 0 for b in bursts),
                "prefix_hit_rate_median": statistics.median(b["prefix_hit_rate"] or 0 for b in bursts),
                "peak_max_over_mean_worst": max(b["peak_max_over_mean"] or 0 for b in bursts),
                "load_1m": round(os.getloadavg()[0], 2),
            }
            print(
                f"workers {n}: "
                + "; ".join(
                    f"per replica {b['requests_per_replica']} max/mean {b['max_over_mean']} "
                    f"peak {b['peak_load_per_replica']} prefix hits {b['prefix_hit_rate']} "
                    f"wall {b['wall_s']} s "
                    f"statuses {b['statuses']}"
                    for b in bursts
                ),
                file=sys.stderr,
            )
    finally:
        stop(sims)
    print(
        f"| workers | requests/replica max/mean, median of {rounds} | worst | prefix cache hit rate, median "
        f"| requests per replica (each burst) |"
    )
    print("|---|---|---|---|---|")
    for n, entry in results.items():
        per = " / ".join(",".join(f"{c:.0f}" for c in b["requests_per_replica"]) for b in entry["bursts"])  # type: ignore
        print(
            f"| {n} | {entry['max_over_mean_median']} | {entry['max_over_mean_worst']} "
            f"| {entry['prefix_hit_rate_median']} | {per} |"
        )  # type: ignore
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    "requests": requests,
                    "replicas": replicas,
                    "time_scale": time_scale,
                    "max_tokens": max_tokens,
                    "groups": groups,
                    "results": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    typer.run(main)
