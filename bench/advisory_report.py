"""The what-if report on 24 h of 1-minute advisory history: wall time, end to end, CLI included.

    PYTHONPATH=. python bench/advisory_report.py [--json PATH] [--redis-url URL] [--repeats N]

Data: one day of the real ServeGen m-large total rate (10-minute windows, repeated per minute)
as the demand, in requests/s; the advisory record holds one observation per minute, as a daemon
in advisory mode writes it (forecaster/advisory/record.py): the decision ceil(demand x 1.2 /
capacity), the Ready replicas of a reactive cluster (the last minute's need, Ready 5 minutes
late), its spec.replicas, the demand, lead 315 s. The numbers are synthetic; the record's size
and the report's work are those of a real day.

Rows (median wall time and the child's CPU time over repeats, each a fresh process as a user
runs it): ``python -m forecaster --help`` (the floor: starting Python and importing the
forecaster, scipy and statsmodels included), ``report --since 24h`` (table only, the
baseline), ``+ --json`` and ``+ --json --plot`` (PNG), and ``Prometheus down`` (source
Prometheus on a closed port: the fallback to the recorded demand, bounded by
SOURCE_TIMEOUT_S); then the report's own work in this process (imports done). Target (issue
35): the report in under 10 s. On a shared machine the wall time follows the load average
(printed): compare the rows with the floor of the same run.
Uses the Redis database in ``--redis-url`` (default db 13) and deletes its key afterwards.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import typer

from forecaster import read_trace
from forecaster.advisory.record import AdvisoryLog, Observation, advisory_key

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data")) / "traces/servegen-m-large"
T0 = 1_800_000_000.0
CAPACITY = 20.0
TARGET_S = 10.0


def write_day(record: AdvisoryLog) -> int:
    """One observation per minute of the trace's first day; returns how many."""
    traffic = read_trace(DATA)
    rates = np.repeat(np.asarray(traffic.requests, dtype=float)[:144], 10)
    rates = np.nan_to_num(rates, nan=0.0)
    need = [max(1, math.ceil(r / CAPACITY)) for r in rates]
    for m, rate in enumerate(rates):
        spec = need[max(0, m - 1)]
        ready = need[max(0, m - 6)]
        record.append(
            Observation(
                T0 + m * 60 + 1,
                desired=max(1, math.ceil(rate * 1.2 / CAPACITY)),
                action="keep",
                ready=min(ready, spec),
                spec=spec,
                demand=float(rate),
                lead_s=315.0,
                capacity_per_replica=CAPACITY,
                unit="requests",
            )
        )
    return len(rates)


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the child: user + system, exit code) of ``python -m forecaster *args``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "forecaster", *args], env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"forecaster {args[:1]} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, done.returncode


def in_process(record: AdvisoryLog, until: float, out: Path) -> float:
    """Wall s of the report's own work in this process (imports done): read, compare, JSON, PNG."""
    from forecaster.advisory.plot import plot_report
    from forecaster.advisory.report import build_report, render_text
    from forecaster.settings import ForecasterSettings

    settings = ForecasterSettings(redis_url=record._url, source="redis")
    started = time.perf_counter()
    report = build_report(settings, record, "bench/vllm", 86400, until)
    render_text(report)
    (out / "p.json").write_text(json.dumps(report.document))
    plot_report(report, out / "p.png")
    return time.perf_counter() - started


def main(
    json_path: Path | None = typer.Option(None, "--json", help="Write the results here."),
    redis_url: str = typer.Option("redis://127.0.0.1:6379/13", help="Redis database to use (its key is deleted)."),
    repeats: int = typer.Option(3, min=1),
) -> None:
    record = AdvisoryLog(redis_url, advisory_key("bench/vllm"))
    record._client().delete(record.key)
    try:
        minutes = write_day(record)
        until = str(T0 + minutes * 60 + 30)
        env = {
            **os.environ,
            "PROMPTEDGE_REDIS_URL": redis_url,
            "PROMPTEDGE_ACTUATOR_NAMESPACE": "bench",
            "PROMPTEDGE_ACTUATOR_DEPLOYMENT": "vllm",
            "PROMPTEDGE_FORECASTER_LOG_FORMAT": "text",
        }
        env.pop("PROMPTEDGE_FORECASTER_PROMETHEUS_URL", None)
        out = Path(tempfile.mkdtemp(prefix="advisory-bench-"))
        base = ["report", "--since", "24h", "--until", until]
        in_process(record, float(until), out)  # warm: matplotlib's first import builds its font cache
        own = statistics.median(in_process(record, float(until), out) for _ in range(repeats))
        rows = {
            "python -m forecaster --help (floor)": (["--help"], env),
            "report --since 24h (baseline)": (base, env),
            "+ --json": ([*base, "--json", str(out / "r.json")], env),
            "+ --json --plot": ([*base, "--json", str(out / "r.json"), "--plot", str(out / "r.png")], env),
            "Prometheus down (fallback)": (
                [*base, "--json", str(out / "r.json")],
                {**env, "PROMPTEDGE_FORECASTER_PROMETHEUS_URL": "http://127.0.0.1:1"},
            ),
        }
        results: dict[str, dict[str, float | int]] = {}
        for name, (args, row_env) in rows.items():
            times, cpus, code = [], [], 0
            for _ in range(repeats):
                elapsed, cpu, code = timed(args, row_env)
                times.append(elapsed)
                cpus.append(cpu)
            results[name] = {
                "median_s": statistics.median(times),
                "max_s": max(times),
                "median_cpu_s": statistics.median(cpus),
                "exit_code": code,
            }
        report = json.loads((out / "r.json").read_text())
    finally:
        record._client().delete(record.key)
    typer.echo(f"{minutes} minutes of advisory history, {repeats} runs per row (fresh process each)")
    typer.echo(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    typer.echo(f"{'row':38}  {'median s':>9}  {'max s':>7}  {'CPU s':>6}  {'exit':>4}")
    for name, r in results.items():
        typer.echo(
            f"{name:38}  {r['median_s']:>9.2f}  {r['max_s']:>7.2f}  {r['median_cpu_s']:>6.2f}  {r['exit_code']:>4}"
        )
    typer.echo(f"{'in process (read, compare, JSON, PNG)':38}  {own:>9.2f}")
    worst = max(float(r["max_s"]) for n, r in results.items() if "floor" not in n)
    typer.echo(f"target: under {TARGET_S:g} s -> {'met' if worst < TARGET_S else 'NOT met'} (worst run {worst:.2f} s)")
    typer.echo(
        f"what-if: forecaster {report['forecaster_in_control']} | cluster {report['cluster']} | "
        f"scored {report['scored_minutes']} min"
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    "minutes": minutes,
                    "repeats": repeats,
                    "rows": results,
                    "in_process_s": own,
                    "load_average": os.getloadavg()[0],
                    "target_s": TARGET_S,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    typer.run(main)
