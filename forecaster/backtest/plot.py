"""PNG of a backtest: demand with the forecast band at the lead-time horizon, and ready
capacity per policy (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forecaster.backtest.run import BacktestResult
from forecaster.errors import ConfigError


def plot_backtest(result: BacktestResult, path: Path) -> None:
    """Two panels over the test period (hours from its start): top, demand and the forecast
    made ``lead`` steps earlier with its upper band; bottom, ready replicas x capacity."""
    rep = result.report
    step = float(rep["step_s"])  # type: ignore[arg-type]
    lead = int(rep["lead_steps"])  # type: ignore[arg-type]
    capacity = float(rep["capacity"])  # type: ignore[arg-type]
    fc = result.forecasts
    hours = np.arange(result.y.size - result.first) * step / 3600
    target_hours = (fc.origins + lead - 1 - result.first) * step / 3600
    try:  # the plot extra (matplotlib) is not in the forecaster's image
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'promptedge[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    top.plot(hours, result.y[result.first :], color="black", lw=0.8, label="demand")
    top.plot(target_hours, fc.mean[:, lead - 1], color="tab:blue", lw=0.8, label=f"forecast +{lead * step / 60:g} min")
    top.fill_between(
        target_hours, fc.mean[:, lead - 1], fc.upper[:, lead - 1], color="tab:blue", alpha=0.25, label="upper band"
    )
    top.set_ylabel("demand (trace unit)")
    top.legend(loc="upper right")
    top.set_title(f"{rep['trace']}: warm-up {float(rep['warmup_s']) / 60:g} min")  # type: ignore[arg-type]
    tick_hours = np.arange(result.tick_demand.size) * result.tick_s / 3600
    bottom.plot(tick_hours, result.tick_demand, color="black", lw=0.6, label="demand")
    colors = {"predictive": "tab:blue", "reactive_hpa": "tab:red", "keda_queue": "tab:orange", "oracle": "tab:green"}
    for name, run in result.runs.items():
        bottom.step(
            tick_hours,
            run.ready * capacity,
            where="post",
            lw=0.8,
            color=colors.get(name),
            label=f"{name} ready capacity",
        )
    bottom.set_xlabel("hours into the test period")
    bottom.set_ylabel("ready capacity (trace unit)")
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
