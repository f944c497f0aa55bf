"""`run --once` on 14 days of 1-minute data: wall time per stage, baseline side by side.

    python bench/forecaster_run_once.py [--json PATH] [--redis-url URL] [--repeats N]

Data: the real ServeGen m-large total rate (14 days of 10-minute windows) turned into
per-minute request counts (Poisson draws at each window's rate, seed 0; the counts are thus
synthetic, their shape is real), written into Redis in the router's counter layout (model
``bench``), so the run reads 20,160 minutes exactly as in production.

Rows: ``last_value`` (baseline: only the last-value model, no selection) and ``default`` (the
default candidates chosen by rolling-origin backtest within the 5 s budget). Columns: Redis
read, selection + forecast + plan, total (median over repeats). Target (issue 5): total <= 10 s.
Real data from ``PROMPTEDGE_DATA_DIR`` (default ../shared/data). Uses the Redis database in ``--redis-url`` (default db 12) and deletes its keys afterwards.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import redis
import typer

from forecaster import ForecasterSettings, RedisCounterSource, read_trace, run_once
from opskit import TRAFFIC_KEY, TRAFFIC_MODELS_KEY, traffic_field, traffic_key

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data")) / "traces/servegen-m-large"
MODEL = "bench"


def load_counters(client: redis.Redis, rates: np.ndarray, first_minute: int) -> None:
    """Per-minute request counts in the router's hash layout (opskit's ``TRAFFIC_*``)."""
    counts = np.random.default_rng(0).poisson(np.repeat(rates, 10) * 60.0)
    pipe = client.pipeline(transaction=False)
    pipe.sadd(TRAFFIC_MODELS_KEY, MODEL)
    for i, count in enumerate(counts):
        minute = first_minute + i
        pipe.hset(
            traffic_key(MODEL, minute),
            mapping={traffic_field(minute, "requests"): int(count), traffic_field(minute, "misses"): int(count)},
        )
    pipe.execute()


def main(
    json_path: Path = typer.Option(ROOT / "out/bench/forecaster_run_once.json", "--json"),
    redis_url: str = typer.Option("redis://127.0.0.1:6379/12"),
    repeats: int = typer.Option(3, min=1),
) -> None:
    rates = read_trace(DATA).requests
    client = redis.Redis.from_url(redis_url)
    now = 1_750_000_000.0
    first_minute = int(now // 60) - rates.size * 10
    load_counters(client, rates, first_minute)
    rows = []
    try:
        for label, models in (("last_value", ["last_value"]), ("default", None)):
            settings = ForecasterSettings(
                redis_url=redis_url,
                model_name=MODEL,
                capacity_per_replica=20.0,
                **({"models": models} if models else {}),
            )
            reads, totals, model = [], [], ""
            for _ in range(repeats):
                source = RedisCounterSource(redis_url, MODEL, settings.history_s)
                started = time.perf_counter()
                traffic = source.fetch(now)
                reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                result = run_once(settings, source, now)
                totals.append(time.perf_counter() - started)
                model = result.model
            assert len(traffic) == 20160
            read, total = statistics.median(reads), statistics.median(totals)
            rows.append(
                {
                    "models": label,
                    "buckets": len(traffic),
                    "chosen": model,
                    "redis_read_s": round(read, 3),
                    "plan_s": round(total - read, 3),
                    "total_s": round(total, 3),
                    "target_s": 10.0,
                    "ok": total <= 10.0,
                }
            )
    finally:
        for key in client.scan_iter(TRAFFIC_KEY.format(model=MODEL, day="*")):
            client.delete(key)
        client.srem(TRAFFIC_MODELS_KEY, MODEL)
    print(
        f"{'models':12} {'buckets':>8} {'chosen':>14} {'redis read s':>12} {'plan s':>8} {'total s':>8} {'<= 10 s':>8}"
    )
    for r in rows:
        print(
            f"{r['models']:12} {r['buckets']:>8} {r['chosen']:>14} {r['redis_read_s']:>12.3f} "
            f"{r['plan_s']:>8.3f} {r['total_s']:>8.3f} {str(r['ok']):>8}"
        )
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"repeats": repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    typer.run(main)
