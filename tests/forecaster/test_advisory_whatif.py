"""The what-if (forecaster/advisory/whatif.py, pure) and the report built from a real Redis record
(forecaster/advisory/report.py): the numbers on a hand-checked case, agreement with the closed
loop's own emulation, and bad input that leaves numbers unknown instead of making them up."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from forecaster.advisory.record import AdvisoryLog, Observation, advisory_key
from forecaster.advisory.report import build_report, parse_span, render_text
from forecaster.advisory.whatif import Model, compare, emulate, hold_forward
from forecaster.cli import app
from forecaster.errors import ConfigError
from forecaster.settings import ForecasterSettings
from sim.loop import whatif as loop_whatif

T0 = 1_800_000_000.0  # a whole minute
NAN = math.nan


def test_the_emulation_is_the_closed_loops_minute_for_minute() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        desired = [int(x) for x in rng.integers(0, 9, size=120)]
        initial, lead = int(rng.integers(0, 5)), int(rng.integers(0, 8))
        ready, warming = emulate(initial, desired, lead)
        theirs = loop_whatif.emulate(initial, desired, lead)
        assert ready == theirs.ready and warming == theirs.warming


def test_a_scale_up_is_ready_one_lead_later_and_the_minutes_short_before_it_count() -> None:
    # demand 3/s, capacity 1/s: 3 replicas needed from minute 0; the forecaster asks for 3 at
    # minute 0 from 1 Ready; its lead is 3 minutes -> minutes 0, 1, 2 are under-provisioned.
    n = 10
    desired = np.array([3.0] + [NAN] * (n - 1))
    ready = np.full(n, 1.0)  # the cluster never scaled
    spec = np.full(n, 1.0)
    demand = np.full(n, 3.0)
    result = compare(desired, ready, spec, demand, Model(1.0, 150.0))
    assert result.forecaster.under_provisioned_minutes == 3
    assert result.cluster.under_provisioned_minutes == 10
    assert result.forecaster.replica_minutes == 30.0  # 3 allocated from the decision on
    assert result.cluster.replica_minutes == 10.0
    assert result.forecaster.gpu_hours == pytest.approx(0.5)
    assert (result.forecaster.scale_up_events, result.forecaster.scale_down_events) == (1, 0)
    assert (result.cluster.scale_up_events, result.cluster.scale_down_events) == (0, 0)
    assert result.unknown == []


def test_unknown_ready_or_demand_is_left_unknown_never_zero() -> None:
    n = 5
    nothing = np.full(n, NAN)
    result = compare(np.full(n, 2.0), nothing, nothing, nothing, Model(1.0, 60.0))
    assert result.forecaster.under_provisioned_minutes is None
    assert result.cluster.under_provisioned_minutes is None
    assert result.forecaster.replica_minutes is None and result.cluster.replica_minutes is None
    assert any("Ready" in u for u in result.unknown) and any("demand" in u for u in result.unknown)


def test_hold_forward_keeps_a_value_only_as_long_as_asked() -> None:
    out = hold_forward(np.array([NAN, 1.0, NAN, NAN, NAN]), max_age=2)
    assert np.isnan(out[0]) and list(out[1:4]) == [1.0, 1.0, 1.0] and np.isnan(out[4])


def test_parse_span_reads_units_and_refuses_nonsense() -> None:
    assert parse_span("24h") == 86400 and parse_span("90m") == 5400 and parse_span("3600") == 3600
    with pytest.raises(ConfigError, match="--since 'yesterday'"):
        parse_span("yesterday")


def _record(redis_url: str, minutes: int, ready_known: bool = True) -> AdvisoryLog:
    record = AdvisoryLog(redis_url, advisory_key("llm/vllm"))
    for m in range(minutes):
        demand = 5 + 4 * math.sin(m / 1440 * 2 * math.pi)
        record.append(
            Observation(
                T0 + m * 60 + 1,
                desired=math.ceil(demand / 2 * 1.2),
                action="keep",
                ready=max(1, math.ceil(demand / 2) - 1) if ready_known else None,
                spec=max(1, math.ceil(demand / 2)) if ready_known else None,
                demand=demand,
                lead_s=315.0,
                capacity_per_replica=2.0,
                unit="requests",
                note="" if ready_known else "get apps/deployments llm/vllm: not found",
            )
        )
    return record


def test_a_day_of_records_gives_a_complete_report_with_its_model_stated(redis_url: str) -> None:
    record = _record(redis_url, 1440)
    settings = ForecasterSettings(redis_url=redis_url)
    report = build_report(settings, record, "llm/vllm", 86400, T0 + 1440 * 60 + 30)
    doc = report.document
    assert report.complete, doc["unknown"]
    assert doc["window"]["minutes"] == 1440 and doc["observations"] == 1440
    assert doc["model"]["capacity_per_replica"] == 2.0 and doc["model"]["lead_min"] == 6
    assert "Ready 6 min later" in doc["model"]["statement"] and "2 requests/s" in doc["model"]["statement"]
    f, c = doc["forecaster_in_control"], doc["cluster"]
    # the cluster kept one replica fewer Ready than demand needed: short most of the day
    assert c["under_provisioned_minutes"] > 1000 > f["under_provisioned_minutes"]
    assert f["replica_minutes"] > c["replica_minutes"] > 0
    assert json.loads(json.dumps(doc))["series"]["demand"][0] == pytest.approx(5.0, abs=0.05)
    assert "forecaster in control" in render_text(report)


def test_no_record_says_so_and_gives_no_number(redis_url: str) -> None:
    record = AdvisoryLog(redis_url, advisory_key("llm/missing"))
    report = build_report(ForecasterSettings(redis_url=redis_url), record, "llm/missing", 3600, T0)
    doc = report.document
    assert not report.complete
    assert any("no advisory observation recorded for llm/missing" in u for u in doc["unknown"])
    for side in ("forecaster_in_control", "cluster"):
        assert all(v is None for v in doc[side].values()), doc[side]


def test_a_deployment_that_never_answered_leaves_the_cluster_side_unknown_and_says_why(redis_url: str) -> None:
    record = _record(redis_url, 60, ready_known=False)
    report = build_report(ForecasterSettings(redis_url=redis_url), record, "llm/vllm", 3600, T0 + 3600)
    doc = report.document
    assert doc["cluster"]["under_provisioned_minutes"] is None and doc["cluster"]["replica_minutes"] is None
    assert doc["forecaster_in_control"]["under_provisioned_minutes"] is None  # nothing to start it from
    assert any("Ready replica" in u for u in doc["unknown"])
    assert any("not found" in n for n in doc["notes"])


def test_prometheus_down_falls_back_to_the_recorded_demand_and_says_so(redis_url: str) -> None:
    record = _record(redis_url, 120)
    settings = ForecasterSettings(redis_url=redis_url, prometheus_url="http://127.0.0.1:1", source_timeout_s=1)
    report = build_report(settings, record, "llm/vllm", 7200, T0 + 7200)
    doc = report.document
    assert doc["demand_source"].startswith("advisory records")
    assert any("Prometheus could not answer" in n for n in doc["notes"])
    assert doc["cluster"]["under_provisioned_minutes"] is not None


def test_unreadable_redis_is_an_unknown_not_a_crash() -> None:
    record = AdvisoryLog("redis://127.0.0.1:1/0", advisory_key("llm/vllm"), timeout_s=0.5)
    report = build_report(ForecasterSettings(), record, "llm/vllm", 3600, T0)
    assert any("could not be read" in u for u in report.document["unknown"])


def test_the_cli_writes_json_and_png_and_exits_by_completeness(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record(redis_url, 180)
    for key, value in {
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_ACTUATOR_NAMESPACE": "llm",
        "PROMPTEDGE_ACTUATOR_DEPLOYMENT": "vllm",
    }.items():
        monkeypatch.setenv(key, value)
    out = CliRunner().invoke(
        app,
        [
            "report",
            "--since",
            "3h",
            "--until",
            str(T0 + 180 * 60 + 30),
            "--json",
            str(tmp_path / "r.json"),
            "--plot",
            str(tmp_path / "r.png"),
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads((tmp_path / "r.json").read_text())["observations"] == 180
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["report", "--since", "soon"])
    assert bad.exit_code == 2 and "--since 'soon'" in bad.output
    empty = CliRunner().invoke(app, ["report", "--since", "1h", "--until", str(T0 - 86400)])
    assert empty.exit_code == 1 and "unknown: no advisory observation" in empty.output
