"""The demo's picture (matplotlib, Agg backend: no display needed): per simulated minute, in
the minute each was answered (as the router counts), the requests sent, the cache hits and the
misses forwarded to the replicas, then the forecaster's forecast of misses and its upper band;
below, the replicas the plan needs and the decision."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

log = logging.getLogger("sim.demo")


def plot_demand(report: dict[str, Any], path: Path) -> bool:
    """Write the PNG; minutes on the x axis count from the forecaster's first plan minute (the
    last replay minute when there is no plan), all rates per simulated second. True when it is
    written; False, with a warning naming ``path``, when it cannot be drawn or written (the
    picture is drawn after the replay: it must never cost the report)."""
    try:
        import matplotlib
    except ImportError:
        log.warning(
            "the demand picture %s was not written: matplotlib is not installed (pip install 'promptedge[plot]')", path
        )
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, replicas) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(2, 1))
    try:
        _draw(report, rates, replicas)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    except (OSError, ValueError, OverflowError) as exc:  # not writable; data matplotlib refuses
        log.warning("the demand picture %s was not written: %s", path, exc)
        return False
    finally:
        plt.close(fig)
    return True


def _draw(report: dict[str, Any], rates: Axes, replicas: Axes) -> None:
    """The rates above, the replicas below, and the title."""
    rows = report.get("demand_minutes") or []
    plan = report.get("forecast_plan") or []
    zero = plan[0]["minute"] if plan else (rows[-1]["minute"] if rows else 0)
    x = _edges([r["minute"] - zero for r in rows])
    for key, label, color in (
        ("sent", "requests sent (in the minute answered)", "black"),
        ("hits", "cache hits", "tab:green"),
        ("misses", "misses forwarded (reach the GPUs)", "tab:blue"),
    ):
        rates.plot(x, _last_twice([r[key] / 60 for r in rows]), color=color, label=label, drawstyle="steps-post")
    planner = report.get("forecast_planner") or {}
    if plan:
        ahead = _edges([s["minute"] - zero for s in plan])
        mean, upper = _last_twice([s["forecast"] for s in plan]), _last_twice([s["upper"] for s in plan])
        rates.plot(
            ahead,
            mean,
            color="tab:red",
            drawstyle="steps-post",
            label=f"forecast of misses ({report.get('forecast_model', '?')})",
        )
        rates.fill_between(ahead, mean, upper, step="post", color="tab:red", alpha=0.2, label="upper band")
        replicas.step(
            ahead,
            _last_twice([s["replicas"] for s in plan]),
            where="post",
            color="tab:red",
            label="replicas the plan needs",
        )
        decided = (report.get("forecast_decision") or {}).get("replicas")
        if isinstance(decided, int):
            replicas.axhline(decided, color="grey", linestyle="--", linewidth=1, label=f"decided: {decided}")
            if planner:
                rates.axhline(
                    decided * planner["capacity_per_replica"],
                    color="grey",
                    linestyle="--",
                    linewidth=1,
                    label=f"capacity of the {decided} decided replicas",
                )
        for ax in (rates, replicas):
            ax.axvline(0, color="grey", linewidth=0.8)
    else:
        replicas.text(
            0.5,
            0.5,
            f"no forecast: {report.get('forecast_error', 'not run')}",
            ha="center",
            transform=replicas.transAxes,
        )
    speedup = report.get("speedup")
    rates.set_ylabel("per simulated second")
    replicas.set_ylabel("replicas")
    clock = f"router clock, {speedup:g}x" if speedup else "router clock"
    replicas.set_xlabel(f"simulated minutes from the forecast's start ({clock})")
    for ax in (rates, replicas):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
    capacity = f"; capacity {planner['capacity_per_replica']:.3g} misses/s per replica" if planner else ""
    rates.figure.suptitle(f"sim demo: {report.get('requests', 0)} requests{capacity}")


def _edges(minutes: list[int]) -> list[int]:
    """Bucket starts plus the last bucket's end: a step drawn "post" then shows every bucket."""
    return [*minutes, minutes[-1] + 1] if minutes else []


def _last_twice(values: list[float]) -> list[float]:
    return [*values, values[-1]] if values else []
