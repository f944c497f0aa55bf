"""`python -m forecaster backtest` on a real trace: JSON keys as issue 5 names them, a PNG, and
the simulation's invariants (perfect foresight is never short; warm-up delays every reaction)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forecaster.backtest.forecasts import RollingForecasts
from forecaster.backtest.simulate import SimConfig, hpa_decider, oracle_run, score, simulate
from forecaster.cli import app


def test_backtest_cli_json_and_plot(data_dir: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "bt.json", tmp_path / "bt.png"
    proc = CliRunner().invoke(
        app,
        [
            "backtest",
            "--trace",
            str(data_dir / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"),
            "--warmup",
            "300",
            "--capacity",
            "1",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
    )
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


def _flat_forecasts(y: np.ndarray, first: int, horizon: int) -> RollingForecasts:
    """Last-value forecasts (mean = upper = the last bucket) at every origin from ``first``."""
    origins = np.arange(first, y.size)
    last = y[origins - 1][:, None].repeat(horizon, axis=1)
    return RollingForecasts(origins, last, last.copy(), ["last_value"] * origins.size)


def test_predictive_floor_sees_a_surprise_step_one_minute_after_it() -> None:
    """10-minute buckets, a step from 10 to 50 nobody forecast: the predictive policy reads
    demand as per-minute counters give it, so it orders replicas one minute into the step and
    is short for that minute plus the warm-up; it used to wait for the bucket to end (10 min)."""
    from forecaster.backtest.simulate import predictive_decider
    from forecaster.plan import PlannerConfig

    step, first = 600.0, 5
    y = np.r_[np.full(10, 10.0), np.full(10, 50.0)]
    cfg = SimConfig(capacity=10.0, headroom=0.0, warmup_s=300.0, tick_s=15.0)
    planner = PlannerConfig(
        capacity_per_replica=10.0,
        headroom=0.0,
        max_replicas=100,
        lead_time_s=300.0,
        max_step=100,
        down_cooldown_s=900.0,
        upper_headroom=None,
    )
    fc = _flat_forecasts(y, first, 3)
    ticks = np.repeat(y[first:], 40)
    run = simulate("predictive", ticks, predictive_decider(fc, y, step, cfg, planner), cfg)
    short = np.flatnonzero(run.ready * cfg.capacity < ticks)
    assert short.size == 60 / 15 + 300 / 15  # one minute to observe it, then the warm-up
    assert short[0] == (10 - first) * 40  # from the step on, in one stretch
    assert np.all(np.diff(short) == 1)


def test_predictive_scales_down_once_a_bucket_is_observed_below_its_forecast() -> None:
    """A forecast of 50 for a bucket that comes in at 10: after its first minute the plan holds
    the observed rate, so the extra replicas go after the scale-down cooldown, not after the
    bucket ends."""
    from forecaster.backtest.forecasts import RollingForecasts
    from forecaster.backtest.simulate import predictive_decider
    from forecaster.plan import PlannerConfig

    step, first = 600.0, 2
    y = np.full(8, 10.0)
    cfg = SimConfig(capacity=10.0, headroom=0.0, warmup_s=300.0, tick_s=15.0)
    planner = PlannerConfig(
        capacity_per_replica=10.0,
        headroom=0.0,
        max_replicas=100,
        lead_time_s=300.0,
        max_step=100,
        max_scale_down_fraction=1.0,
        down_cooldown_s=0.0,
        upper_headroom=None,
    )
    origins = np.arange(first, y.size)
    mean = np.full((origins.size, 3), 10.0)
    mean[1, 0] = 50.0  # the origin of bucket 3 forecasts 50 for it
    fc = RollingForecasts(origins, mean, mean.copy(), ["x"] * origins.size)
    ticks = np.repeat(y[first:], 40)
    run = simulate("predictive", ticks, predictive_decider(fc, y, step, cfg, planner), cfg)
    bucket3 = run.provisioned[40:80]
    assert bucket3[0] == 5  # the forecast was believed at the bucket's start
    assert bucket3[4] == 1  # and dropped once its first minute was observed


def test_backtest_refuses_a_capacity_or_warmup_out_of_range(data_dir: Path) -> None:
    # Found in a README trial: --capacity 0 ended in an OverflowError traceback and
    # --capacity -5 printed a 100 % under-provisioned table with exit 0.
    trace = str(data_dir / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    for flag, value in (
        ("--capacity", "0"),
        ("--capacity", "-5"),
        ("--warmup", "-1"),
        ("--headroom", "-0.5"),
        ("--test-fraction", "0"),
        ("--test-fraction", "1.5"),
    ):
        proc = CliRunner().invoke(app, ["backtest", "--trace", trace, flag, value, "--no-progress"])
        assert proc.exit_code == 2, (flag, value, proc.output)
        assert flag in proc.output and "Traceback" not in proc.output


@pytest.mark.parametrize("level, columns", [(0.9, ["P90 cover"]), (0.95, ["P90 cover", "P95 cover"])])
def test_the_forecast_table_has_one_coverage_column_per_band(
    level: float, columns: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # At the default level the planner's band is the P90 band: two columns headed "P90 cover"
    # with equal numbers read as two different measures (a fresh-clone trial, 3 December).
    from forecaster.cli import _forecast_table

    row = {
        "n": 10,
        "horizon_min": 10,
        "mae": 1.0,
        "mae_last_value": 1.0,
        "mae_seasonal_naive": 2.0,
        "mase": 1.0,
        "smape": 0.1,
        "p90_coverage": 0.894,
        "upper_coverage": 0.93,
        "level": level,
    }
    _forecast_table({"forecast": row, "forecast_30min": {**row, "horizon_min": 30}})
    header, first = capsys.readouterr().out.splitlines()[:2]
    assert [c.strip() for c in header.split("  ") if c.strip().endswith("cover")] == columns
    assert ("0.930" in first) == (len(columns) == 2)
