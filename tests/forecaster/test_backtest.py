"""`python -m forecaster backtest` on a real trace: JSON keys as issue 5 names them, a PNG, and
the simulation's invariants (perfect foresight is never short; warm-up delays every reaction)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from forecaster.cli import app
from forecaster.backtest.simulate import SimConfig, hpa_decider, oracle_run, score, simulate


def test_backtest_cli_json_and_plot(data_dir: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "bt.json", tmp_path / "bt.png"
    proc = CliRunner().invoke(app, [
        "backtest", "--trace", str(data_dir / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"),
        "--warmup", "300", "--capacity", "1", "--json", str(out), "--plot", str(png),
    ])
    assert proc.exit_code == 0, proc.output
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"predictive", "reactive_hpa", "keda_queue", "oracle"}
    for policy in report["policies"].values():
        assert {"under_provisioned_frac", "replica_minutes"} <= set(policy)
        assert 0.0 <= policy["under_provisioned_frac"] <= 1.0 and policy["replica_minutes"] > 0
    assert report["policies"]["oracle"]["under_provisioned_frac"] == 0.0
    assert {"mae", "mae_last_value", "smape", "mase", "p90_coverage", "pinball_p90"} <= set(report["forecast"])
    assert 0.0 <= report["forecast"]["p90_coverage"] <= 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "forecasting" in proc.stderr  # the tqdm progress bar
    assert "predictive" in proc.stdout and "MAE" in proc.stdout


def test_replicas_are_ready_only_after_warmup() -> None:
    """A step in demand: the HPA-like policy reacts within a sync period but is short for the
    whole warm-up; perfect foresight is never short and pays for the warm-up in advance."""
    cfg = SimConfig(capacity=10.0, headroom=0.0, warmup_s=300.0, tick_s=15.0)
    demand = np.r_[np.full(40, 10.0), np.full(80, 50.0)]
    hpa = simulate("reactive_hpa", demand, hpa_decider(cfg), cfg)
    oracle = oracle_run(demand, cfg)
    short = hpa.ready * cfg.capacity < demand
    assert short.sum() == 300 / 15 + 1  # the tick it notices (one sync late) plus the warm-up
    oracle_score = score(oracle, demand, cfg, oracle.provisioned.sum() * 15 / 60)
    assert oracle_score["under_provisioned_frac"] == 0.0
    assert oracle.provisioned[40 - 20] == 5 and oracle.provisioned[40 - 21] == 1  # ordered 300 s early
