"""The closed loop side by side: predictive vs reactive (HPA) vs fixed at peak vs fixed at mean.

    python bench/closed_loop.py [--hours 1] [--speedup 7] [--start-hour H] [--seed 0] [--json out/closed_loop.json]
                                [--plot out/closed_loop.png] [--policies ...] [--router-policy gpu_load]

Runs ``python -m sim loop``'s ``run_loop`` on the ServeGen m-large segment with the steepest
ramp after 7 days of history that rises at most ``--max-jump`` (1.35x) a window (or
``--start-hour``), replica warm-up 300 simulated s, same trace
and seed for every policy, and prints the side-by-side table with goodput per GPU-hour as ratios
to fixed-at-peak and to reactive, then the issue-10 targets (predictive SLO attainment >= 99 %,
goodput/GPU-h >= 1.3x fixed_peak and >= 1.2x reactive, 0 failed requests) and the wall time
per simulated hour against its 10-minute target. Real data from ``PROMPTEDGE_DATA_DIR``
(default ../shared/data); the control plane from ``PROMPTEDGE_KUBE_TOOLS``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import get_args

import typer

from router.settings import Policy
from sim.cli import check_output_path
from sim.loop import LoopConfig, plot, ratios, render, run_loop, write_json

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
WALL_TARGET_S_PER_SIM_HOUR = 600.0


def targets(report: dict) -> list[tuple[str, str, bool | None]]:  # type: ignore[type-arg]
    """(target, measured, met) rows of issue 10's loop targets."""
    pol = report["policies"]
    pred = pol.get("predictive", {})
    rel = ratios(pol).get("predictive", {})
    rows: list[tuple[str, str, bool | None]] = []
    att = pred.get("slo_attainment")
    rows.append(
        (
            "predictive SLO attainment >= 99 %",
            "-" if att is None else f"{att:.1%}",
            None if att is None else att >= 0.99,
        )
    )
    for base, need in (("fixed_peak", 1.3), ("reactive", 1.2)):
        r = rel.get(f"vs_{base}")
        rows.append(
            (f"goodput/GPU-h >= {need}x {base}", "-" if r is None else f"{r:.2f}x", None if r is None else r >= need)
        )
    failed = pred.get("failed_requests")
    rows.append(
        (
            "predictive failed requests = 0",
            "-" if failed is None else str(failed),
            None if failed is None else failed == 0,
        )
    )
    for name, p in pol.items():
        per_hour = p["wall_s"] / report["segment"]["hours"]
        rows.append(
            (
                f"{name}: wall s per simulated hour <= {WALL_TARGET_S_PER_SIM_HOUR:.0f}",
                f"{per_hour:.0f}",
                per_hour <= WALL_TARGET_S_PER_SIM_HOUR,
            )
        )
    return rows


def main(
    hours: float = typer.Option(1.0, help="Segment length, simulated hours."),
    speedup: float = typer.Option(7.0, help="Simulated seconds per wall second, in every process."),
    start_hour: float | None = typer.Option(
        None, help="Segment start, hours from the trace start (default: the steepest ramp after 7 days of history)."
    ),
    max_jump: float = typer.Option(
        1.35,
        help="Default segment: the steepest ramp rising at most this factor per window; 0: any rise, a step included.",
    ),
    policies: str = typer.Option("predictive,reactive,fixed_peak,fixed_mean", help="Comma-separated, run in turn."),
    json_path: Path = typer.Option(Path("out/closed_loop.json"), "--json", help="Report with the targets, JSON."),
    plot_path: Path = typer.Option(Path("out/closed_loop.png"), "--plot", help="Demand, replicas and TTFT p95, PNG."),
    seed: int = typer.Option(0, help="Seed of arrivals, tokens and prompts (the same for every policy)."),
    router_policy: str | None = typer.Option(
        None,
        help="The router's dispatch policy (PROMPTEDGE_ROUTER_POLICY; default: the router's default).",
    ),
) -> None:
    """Issue 10's side-by-side loop on ServeGen m-large (warm-up 300 simulated s); the
    loop's other settings are ``python -m sim loop``'s."""
    check_output_path("--json", json_path)  # before the run, not in a traceback after it
    check_output_path("--plot", plot_path)
    if router_policy is not None:
        valid = get_args(Policy)
        if router_policy not in valid:
            raise typer.BadParameter(
                f"{router_policy!r} is not one of {', '.join(valid)}", param_hint="--router-policy"
            )
        os.environ["PROMPTEDGE_ROUTER_POLICY"] = router_policy  # the router process inherits it
    cfg = LoopConfig(
        trace=DATA / "traces" / "servegen-m-large",
        start_hour=start_hour,
        max_jump=max_jump or None,
        hours=hours,
        speedup=speedup,
        warmup_s=300.0,
        policies=tuple(policies.split(",")),
        seed=seed,
        tokens_trace=DATA / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
        log_dir=Path("out/closed_loop-logs"),
    )
    t0 = time.time()
    report = run_loop(cfg)
    report["bench_wall_s"] = round(time.time() - t0, 1)
    report["router_policy"] = os.environ.get("PROMPTEDGE_ROUTER_POLICY") or "default"
    typer.echo(render(report))
    typer.echo("")
    for target, measured, met in targets(report):
        typer.echo(f"  {'met ' if met else 'MISS' if met is False else 'n/a '}  {target}: {measured}")
    write_json(
        {**report, "targets": [{"target": t, "measured": m, "met": ok} for t, m, ok in targets(report)]}, json_path
    )
    plot(report, plot_path)
    typer.echo(f"JSON {json_path}, PNG {plot_path}, wall {report['bench_wall_s']:.0f} s")
    if any(p.get("invalid") for p in report["policies"].values()):
        raise typer.Exit(1)  # a process or the API server failed during a run: the table says which


if __name__ == "__main__":
    typer.run(main)
