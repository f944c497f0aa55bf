"""The loop's report: a side-by-side table with ratios, the JSON file and the PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (
    ("slo_attainment", "SLO att.", "{:.1%}"),
    ("goodput_per_gpu_hour", "goodput/GPU-h", "{:,.0f}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("failed_requests", "failed", "{:d}"),
    ("scale_events", "scale ev.", "{:d}"),
    ("under_provisioned_minutes", "under-prov. min", "{:d}"),
)


def ratios(policies: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Goodput per GPU-hour of each policy over fixed_peak's and over reactive's (None when
    either is missing or zero)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, p in policies.items():
        row: dict[str, float | None] = {}
        for base in ("fixed_peak", "reactive"):
            mine, theirs = p.get("goodput_per_gpu_hour"), policies.get(base, {}).get("goodput_per_gpu_hour")
            row[f"vs_{base}"] = round(mine / theirs, 3) if mine and theirs else None
        out[name] = row
    return out


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def render(report: dict[str, Any]) -> str:
    """Text table: one row per policy, the columns above, TTFT/ITL p95, the replicas' queue
    time (mean and p95 from their vLLM histograms) and the two ratios; the header states the
    clock and the SLO."""
    policies = report.get("policies", {})
    rel = ratios(policies)
    seg, slo, clock = report.get("segment", {}), report.get("slo", {}), report.get("clock", {})
    head = [
        "policy",
        *(c[1] for c in COLUMNS),
        "TTFT p95 s",
        "ITL p95 s",
        "queue mean s",
        "queue p95 s",
        "vs fixed_peak",
        "vs reactive",
    ]
    rows = []
    for name, p in policies.items():
        queue = p.get("queue_time_s") or {}
        rows.append(
            [
                name,
                *(_cell(p.get(k), f) for k, _, f in COLUMNS),
                _cell((p.get("ttft_s") or {}).get("p95"), "{:.2f}"),
                _cell((p.get("itl_s") or {}).get("p95"), "{:.3f}"),
                _cell(queue.get("mean"), "{:.2f}"),
                _cell(queue.get("p95"), "{:.2f}"),
                _cell(rel[name]["vs_fixed_peak"], "{:.2f}x"),
                _cell(rel[name]["vs_reactive"], "{:.2f}x"),
            ]
        )
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        f"closed loop: {seg.get('trace')} from hour {seg.get('start_hour')} for {seg.get('hours')} h "
        f"({seg.get('requests')} requests, seed {seg.get('seed')}); clock {clock.get('speedup')}x "
        f"(all times simulated seconds); SLO TTFT <= {slo.get('ttft_s')} s, ITL <= {slo.get('itl_s')} s",
        "  ".join(h.ljust(w) for h, w in zip(head, widths)),
    ]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(
        f"SLO att.: share of requests with TTFT <= {slo.get('ttft_s')} s and ITL <= {slo.get('itl_s')} s; "
        "goodput/GPU-h: those requests per replica-hour; under-prov. min: minutes whose Ready replicas x "
        "capacity fell short of the forwarded demand; vs X: goodput/GPU-h over X's ('-': X not run). "
        "sim/README.md, loop, Measures"
    )
    for name, p in policies.items():
        if p.get("models"):
            lines.append(
                f"{name}'s forecasts by model (decisions): "
                + ", ".join(f"{m} {n}" for m, n in sorted(p["models"].items(), key=lambda kv: -kv[1]))
            )
    for name, p in policies.items():
        warm = p.get("warming")
        if warm is not None:  # run with --warming on: what the router's warmer did
            gens = warm.get("generations", {})
            lines.append(
                f"{name}'s warming: {warm['error']}"
                if "error" in warm
                else f"{name}'s warming: {gens.get('attempted', 0)} warm generations, {gens.get('stored', 0)} stored, "
                f"{warm.get('warm_hits', 0)} hits on warmed entries"
            )
    for name, p in policies.items():
        for problem in p.get("invalid") or ():
            lines.append(f"INVALID: {name}: {problem}; its row does not measure the policy (logs in {p.get('logs')})")
    if seg.get("questions_exhausted"):
        lines.append(
            f"WARNING: every question of {seg.get('questions')} was used: later prompts only repeat "
            "(cache hits), so the replicas see less demand than the trace"
        )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> None:
    """The report with ``ratios`` added, indented."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**report, "ratios": ratios(report.get("policies", {}))}, indent=2) + "\n")


def plot(report: dict[str, Any], path: Path) -> None:
    """PNG: demand per minute; each policy's Ready and desired replicas; each policy's TTFT p95."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = report.get("policies", {})
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    first = next(iter(policies.values()), {"minutes": []})
    minutes = [r["minute"] for r in first["minutes"]]
    axes[0].plot(minutes, [r["demand_rps"] for r in first["minutes"]], color="black", label="arrivals")
    axes[0].set_ylabel("demand (req/s)")
    for name, p in policies.items():
        rows = p["minutes"]
        ready = axes[1].step(
            [r["minute"] for r in rows],
            [r["ready"] if r["ready"] is not None else float("nan") for r in rows],
            where="post",
            label=f"{name} ready",
        )[0]
        # desired above ready: replicas asked for and still warming, or asked for and cancelled
        # before Ready (GPU time with nothing served), which the ready line alone hides
        axes[1].step(
            [r["minute"] for r in rows],
            [r.get("desired") if r.get("desired") is not None else float("nan") for r in rows],
            where="post",
            linestyle=":",
            color=ready.get_color(),
            label=f"{name} desired",
        )
        axes[2].plot(
            [r["minute"] for r in rows],
            [r["ttft_s"]["p95"] if r["ttft_s"]["p95"] is not None else float("nan") for r in rows],
            label=name,
        )
    axes[1].set_ylabel("replicas (solid: Ready, dotted: desired)")
    axes[2].set_ylabel("TTFT p95 (s)")
    axes[2].axhline(report.get("slo", {}).get("ttft_s", 0), color="grey", linestyle="--", linewidth=1, label="SLO")
    axes[2].set_xlabel(f"simulated minute (clock {report.get('clock', {}).get('speedup')}x)")
    for ax in axes:
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    seg = report.get("segment", {})
    fig.suptitle(f"{Path(str(seg.get('trace'))).name}, hour {seg.get('start_hour')}, {seg.get('hours')} h")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
