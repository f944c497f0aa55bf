"""PNG of the what-if report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forecaster.advisory.report import STEP_S, Report
from forecaster.errors import ConfigError


def plot_report(report: Report, path: Path) -> None:
    """Two panels over the window (hours from its start): top, the demand against the Ready
    capacity of the cluster and of the forecaster in control; bottom, replicas: the
    forecaster's decisions, its emulated Ready and allocated replicas, the cluster's Ready
    and spec.replicas. Unknown minutes are gaps. The title states the model. Raises
    ConfigError when matplotlib is missing."""
    try:  # the plot extra (matplotlib) is not in the forecaster's image
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'promptedge[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = report.document
    model = doc["model"]
    cap = float(model["capacity_per_replica"])
    hours = np.arange(report.demand.size) * STEP_S / 3600
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    top.plot(hours, report.demand, color="black", lw=1, label=f"demand ({doc['demand_source'][:60]})")
    top.plot(hours, report.ready * cap, color="tab:red", lw=1, label="cluster: Ready x capacity")
    top.plot(
        hours, report.whatif.whatif_ready * cap, color="tab:blue", lw=1, label="forecaster in control: Ready x capacity"
    )
    top.set_ylabel(model["demand_unit"])
    top.legend(loc="upper left", fontsize=8)
    bottom.step(hours, report.desired, where="post", color="tab:blue", lw=0.8, ls="--", label="forecaster's decision")
    bottom.step(hours, report.whatif.whatif_ready, where="post", color="tab:blue", lw=1.2, label="what-if Ready")
    bottom.step(
        hours, report.whatif.whatif_allocated, where="post", color="tab:cyan", lw=0.8, label="what-if allocated"
    )
    bottom.step(hours, report.ready, where="post", color="tab:red", lw=1.2, label="cluster Ready")
    bottom.step(hours, report.spec, where="post", color="tab:orange", lw=0.8, label="cluster spec.replicas")
    bottom.set_ylabel("replicas")
    bottom.set_xlabel("hours from the window's start")
    bottom.legend(loc="upper left", fontsize=8)
    f, c = doc["forecaster_in_control"], doc["cluster"]
    fig.suptitle(
        f"{doc['target']}: under-provisioned min {f['under_provisioned_minutes']} (forecaster) vs "
        f"{c['under_provisioned_minutes']} (cluster); replica-min {f['replica_minutes']} vs {c['replica_minutes']}\n"
        f"model: {cap:g} {model['demand_unit']} per Ready replica, Ready {model['lead_min']} min after a scale-up, "
        f"{model['gpus_per_replica']:g} GPU per replica",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
