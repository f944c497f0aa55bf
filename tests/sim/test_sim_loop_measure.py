"""The closed loop's measures, report and preparation (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.client.replay import Outcome, PlannedRequest
from sim.loop import LoopConfig, plot, ratios, render, run_loop, write_json
from sim.loop.measure import RequestRecord, ScaleSample, gpu_hours, is_good, per_minute, scale_events, summarize
from sim.loop.run import prepare, replicas_for, to_records


def _req(
    at: float, ttft: float | None = 0.5, itl: float | None = 0.05, ok: bool = True, hit: bool = False
) -> RequestRecord:
    return RequestRecord(at, ok, ttft, itl, hit, None if ok else "HTTP 503")


def test_a_request_is_good_only_within_both_slos() -> None:
    assert is_good(_req(0), 2.0, 0.2)
    assert not is_good(_req(0, ttft=2.5), 2.0, 0.2)
    assert not is_good(_req(0, itl=0.3), 2.0, 0.2)
    assert not is_good(_req(0, ok=False, ttft=None, itl=None), 2.0, 0.2)
    assert is_good(_req(0, itl=None), 2.0, 0.2)  # a one-token answer has no ITL


def test_gpu_hours_integrate_pods_holding_a_gpu_between_samples() -> None:
    samples = [ScaleSample(0, 2, 2, 0, 2), ScaleSample(1800, 4, 2, 2, 4)]
    assert gpu_hours(samples, 3600) == pytest.approx(2 * 0.5 + 4 * 0.5)
    assert scale_events(samples) == 1
    assert scale_events(samples + [ScaleSample(1900, 4, 4, 0, 4)]) == 1


def test_minutes_count_demand_latency_and_under_provisioning() -> None:
    reqs = (
        [_req(t) for t in range(0, 60, 2)] + [_req(60 + t, ttft=3.0) for t in range(0, 60, 1)] + [_req(125, hit=True)]
    )
    samples = [ScaleSample(10, 1, 1, 0, 1), ScaleSample(70, 2, 1, 1, 2), ScaleSample(130, 2, 2, 0, 2)]
    rows = per_minute(reqs, samples, 180, capacity_rps=0.6, ttft_slo_s=2.0, itl_slo_s=0.2)
    assert [r["demand_rps"] for r in rows] == [0.5, 1.0, pytest.approx(1 / 60, abs=1e-4)]
    assert [r["under_provisioned"] for r in rows] == [False, True, False]
    assert rows[1]["slo_attainment"] == 0 and rows[0]["slo_attainment"] == 1
    assert rows[1]["ready"] == 1 and rows[1]["warming"] == 1 and rows[2]["hit_ratio"] == 1.0
    total = summarize(reqs, samples, 180, 0.6, 2.0, 0.2)
    assert total["requests"] == 91 and total["good"] == 31 and total["under_provisioned_minutes"] == 1
    assert total["gpu_hours"] == pytest.approx((1 * 60 + 2 * 60 + 2 * 50) / 3600, abs=1e-4)
    assert total["goodput_per_gpu_hour"] == pytest.approx(31 / total["gpu_hours"], rel=1e-3)


def test_replayer_outcomes_become_simulated_seconds() -> None:
    plan = [PlannedRequest(10.0, "new", 11, {}), PlannedRequest(20.0, "repeat", 1, {})]
    outs = [
        Outcome("new", True, None, 2.0, 0.5, "miss", "r", 0.0),
        Outcome("repeat", True, None, 0.1, 0.05, "exact", None, 0.0),
    ]
    a, b = to_records(plan, outs, speedup=6.0)
    assert a.at_s == 60.0 and a.ttft_s == 3.0 and a.itl_s == pytest.approx((12.0 - 3.0) / 10) and not a.hit
    assert b.hit and b.itl_s is None


def test_ratios_table_json_and_plot(tmp_path: Path) -> None:
    minutes = [{"minute": 0, "demand_rps": 1.0, "ready": 2, "ttft_s": {"p95": 0.4}}]
    report = {
        "clock": {"speedup": 6.0},
        "slo": {"ttft_s": 2.0, "itl_s": 0.2},
        "segment": {"trace": "t", "start_hour": 1.0, "hours": 1.0, "requests": 10, "seed": 0},
        "policies": {
            "predictive": {
                "goodput_per_gpu_hour": 300.0,
                "slo_attainment": 0.99,
                "gpu_hours": 2.0,
                "failed_requests": 0,
                "scale_events": 3,
                "under_provisioned_minutes": 0,
                "queue_time_s": {"mean": 0.123, "p95": 1.9, "requests": 10},
                "minutes": minutes,
            },
            "reactive": {"goodput_per_gpu_hour": 200.0, "minutes": minutes},
            "fixed_peak": {"goodput_per_gpu_hour": 150.0, "minutes": minutes},
        },
    }
    assert ratios(report["policies"])["predictive"] == {"vs_fixed_peak": 2.0, "vs_reactive": 1.5}
    text = render(report)
    assert "6.0x" in text and "simulated" in text and "2.00x" in text and "1.50x" in text
    assert "queue mean s" in text and "0.12" in text and "1.90" in text
    # the abbreviated columns are explained under the table, with the SLO the report used
    assert "TTFT <= 2.0 s and ITL <= 0.2 s" in text and "under-prov. min:" in text and "sim/README.md" in text
    write_json(report, tmp_path / "r.json")
    assert '"vs_reactive": 1.5' in (tmp_path / "r.json").read_text()
    plot(report, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_replicas_for_is_the_planners_rule() -> None:
    assert replicas_for(1.0, 0.5, 0.2, 8) == 3
    assert replicas_for(0.0, 0.5, 0.2, 8) == 1 and replicas_for(100, 0.5, 0.2, 8) == 8


def test_prepare_rescales_the_ramp_to_the_peak_replicas(data_dir: Path) -> None:
    cfg = LoopConfig(
        trace=data_dir / "traces" / "servegen-m-large",
        hours=0.5,
        capacity_rps=0.4,
        peak_replicas=5,
        tokens_trace=data_dir / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
        progress=False,
    )
    prep = prepare(cfg)
    assert prep.replicas["fixed_peak"] == 5
    assert max(prep.segment.window_rps) == pytest.approx(5 * 0.4 / 1.2)
    assert prep.replicas["predictive"] < prep.replicas["fixed_peak"]  # a ramp: it starts lower
    assert len(prep.plan) == len(prep.segment.requests) and prep.plan[-1].at_s < 1800 / 6.0
    assert prep.history and prep.history[-1][0] == -1
    with pytest.raises(ValueError):
        LoopConfig(trace=Path("x"), policies=("psychic",))


def test_the_history_is_sampled_counts_by_default_as_the_routers_counters_hold_it(data_dir: Path) -> None:
    # The live minutes the forecaster reads are counts; a history of expected rates (flat inside
    # each 10-minute window) calibrated its band far too narrow, then its volatility scale sat at
    # its maximum on every live minute (closed loop, 3 December).
    kwargs = dict(
        trace=data_dir / "traces" / "servegen-m-large",
        hours=0.5,
        capacity_rps=0.4,
        history_days=1.0,
        tokens_trace=data_dir / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
        progress=False,
    )
    sampled = [r for _, r in prepare(LoopConfig(**kwargs)).history]
    expected = [r for _, r in prepare(LoopConfig(**kwargs, history="expected")).history]
    assert len(sampled) == len(expected) == 1440
    assert all(r == int(r) for r in sampled)
    flat = sum(a == b for a, b in zip(expected, expected[1:]))
    assert flat >= 1200  # ten equal minutes per window
    assert sum(a == b for a, b in zip(sampled, sampled[1:])) < flat / 4
    assert sum(sampled) == pytest.approx(sum(expected), rel=0.05)
    with pytest.raises(ValueError, match="history"):
        LoopConfig(trace=Path("x"), history="smooth")


def test_a_relative_log_dir_gives_the_control_plane_an_absolute_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sim.loop.world import ControlPlane

    monkeypatch.chdir(tmp_path)
    assert ControlPlane(Path("tools"), Path("out/loop/kube")).run_dir == tmp_path / "out" / "loop" / "kube"


def test_run_problems_names_dead_processes_and_a_blind_observer() -> None:
    from sim.loop.run import run_problems

    assert run_problems({"node": None, "router": None, "forecaster": None}, 0, 100) == []
    assert run_problems({"node": None, "hpa": -9}, 0, 100) == ["hpa exited with code -9 during the run"]
    assert run_problems({}, 2, 100) == []  # a transient error or two is not a blind run
    assert run_problems({}, 13, 15) == ["the API server failed 13 of 28 samples"]


def test_the_segment_starts_on_a_whole_simulated_minute_so_history_and_live_minutes_share_buckets() -> None:
    # The CI failure of stop 23: the segment started at an arbitrary second, so history minute m
    # (written to bucket floor(start / 60) + m) began up to 60 s before live minute m, and the
    # forecaster saw the daily step in a bucket shifted against the traffic it planned for.
    from sim.loop.run import segment_start

    for origin, now, speedup in ((1_000.0, 1_003.7, 15.0), (5_000.25, 5_009.9, 7.0), (0.0, 0.0, 1.0)):
        replay_at, sim_start = segment_start(origin, now, speedup)
        assert sim_start % 60 == 0
        assert sim_start == pytest.approx(origin + (replay_at - origin) * speedup)  # one clock
        assert now <= replay_at < now + 60 / speedup  # waits less than one simulated minute
        for m in (0, 14, 15):  # a live arrival anywhere in segment minute m counts in bucket start // 60 + m
            for x in (0.0, 30.0, 59.999):
                assert int((sim_start + 60 * m + x) // 60) == int(sim_start // 60) + m


@pytest.mark.parametrize(("field", "value"), [("hours", 0.0), ("hours", -1.0), ("speedup", 0.0), ("warmup_s", -5.0)])
def test_a_bad_setting_is_refused_by_name_and_value(field: str, value: float) -> None:
    # A new user's `--hours 0` was told "need speedup > 0, hours > 0 and warmup_s >= 0": which one?
    with pytest.raises(ValueError, match=rf"^{field} must be .* got {value:g}"):
        LoopConfig(trace=Path("x"), **{field: value})


def test_no_policy_is_refused_not_run_as_an_empty_table() -> None:
    # `--policies ""` printed an empty table and exited 0.
    with pytest.raises(ValueError, match="no policy"):
        LoopConfig(trace=Path("x"), policies=())


def test_a_missing_trace_is_reported_as_missing(tmp_path: Path) -> None:
    from sim.client.traffic.rates import TrafficFormatError, read_rates

    with pytest.raises(TrafficFormatError, match="does not exist"):
        read_rates(tmp_path / "nowhere" / "servegen")


@pytest.mark.parametrize("set_to", [None, "/srv/my-data"])
def test_a_missing_trace_says_which_data_folder_was_looked_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, set_to: str | None
) -> None:
    # the trial round (Dec 4): with PROMPTEDGE_DATA_DIR set, the message still told the user
    # to set it, not what it was set to
    from sim.client.traffic.rates import TrafficFormatError, read_rates

    if set_to is None:
        monkeypatch.delenv("PROMPTEDGE_DATA_DIR", raising=False)
        expected = "PROMPTEDGE_DATA_DIR is not set"
    else:
        monkeypatch.setenv("PROMPTEDGE_DATA_DIR", set_to)
        expected = f"PROMPTEDGE_DATA_DIR is {set_to}"
    with pytest.raises(TrafficFormatError, match=expected):
        read_rates(tmp_path / "nowhere" / "servegen")


def test_a_missing_default_token_trace_names_the_data_folder_setting(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With --trace given and no data folder, the loop failed on a file the user never passed
    # (the Azure token counts) with "[Errno 2]" and no word of PROMPTEDGE_DATA_DIR.
    from sim.loop import run

    monkeypatch.setattr(run, "DEFAULT_TOKENS", tmp_path / "traces" / "azure.csv")
    cfg = LoopConfig(trace=data_dir / "traces" / "servegen-m-large", hours=0.5, capacity_rps=0.4, progress=False)
    monkeypatch.setenv("PROMPTEDGE_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=f"PROMPTEDGE_DATA_DIR is {tmp_path}"):
        run.prepare(cfg)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("speedup", float("inf"), "speedup"),
        ("hours", float("nan"), "hours"),
        ("warmup_s", float("inf"), "warmup_s"),
        ("capacity_rps", -1.0, "capacity_rps"),
        ("capacity_rps", 0.0, "capacity_rps"),
        ("history_days", -1.0, "history_days"),
        ("miss_ratio", 1.5, "miss_ratio"),
    ],
)
def test_the_loop_refuses_values_it_cannot_run_with_the_field_named(field: str, value: float, match: str) -> None:
    # inf speedup reached the router as a NaN, -1 capacity as numpy's "lam < 0", -1 history days
    # as "zero-size array to reduction operation" (new-user trial, 4 December)
    with pytest.raises(ValueError, match=match):
        LoopConfig(trace=Path("x"), **{field: value})


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_loop_starts(tmp_path: Path, option: str) -> None:
    # a file where the folder should be: the loop ran its whole hour, then lost the report
    # in a traceback (new-user trial, 4 December)
    from typer.testing import CliRunner

    from sim.cli import app

    (tmp_path / "README.md").write_text("a file, not a folder\n")
    target = tmp_path / "README.md" / "out.x"
    result = CliRunner().invoke(app, ["loop", "--trace", str(tmp_path / "no-such-trace"), option, str(target)])
    assert result.exit_code == 2, result.output
    assert str(target) in result.output and option in result.output
    assert "no-such-trace" not in result.output  # refused first, before the trace was even read
    assert "Traceback" not in result.output


def test_a_segment_past_the_trace_end_says_so_with_the_trace_length(data_dir: Path) -> None:
    # new-user trial: --start-hour 400 on a 336 h trace said "the segment has no traffic"
    cfg = LoopConfig(
        trace=data_dir / "traces" / "servegen-m-large", start_hour=400.0, hours=0.25, capacity_rps=0.4, progress=False
    )
    with pytest.raises(ValueError, match="outside the trace.*0 to 336 h"):
        prepare(cfg)


def test_the_models_the_forecaster_chose_are_counted_from_its_log_and_shown() -> None:
    # new-user trial: neither the table nor the JSON said the forecaster chose last value
    from sim.loop.measure import models_chosen

    lines = [
        '{"message": "decision 3 (keep, exit 0) at 1796393224.4 (2026-12-04T14:07:04Z) on last_value: upper ...", '
        '"level": "INFO"}',
        "2026-12-04 INFO forecaster decision 4 (up, exit 0) at 1796393284.4 (2026-12-04T14:08:04Z) on "
        "seasonal_naive: upper forecast 0.125 at +6 min needs 4",
        '{"message": "decision 4 (keep, exit 0) at 1796393344.5 (2026-12-04T14:09:04Z) on last_value: keep 4"}',
        '{"message": "warm-up 120 s (setting: no Ready pod)"}',
    ]
    assert models_chosen(lines) == {"last_value": 2, "seasonal_naive": 1}
    assert models_chosen(["nothing here"]) == {}
    report = {
        "clock": {"speedup": 7.0},
        "slo": {"ttft_s": 2.0, "itl_s": 0.2},
        "segment": {},
        "policies": {"predictive": {"goodput_per_gpu_hour": 1.0, "models": models_chosen(lines), "minutes": []}},
    }
    assert "predictive's forecasts by model (decisions): last_value 2, seasonal_naive 1" in render(report)


def test_missing_kube_tools_are_named_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # new-user trial: "starting the control plane" was printed, then the tools were found missing
    from sim.loop.world import WorldError

    cfg = LoopConfig(trace=tmp_path / "no-trace", kube_tools=tmp_path / "no-tools", progress=True)
    with pytest.raises(WorldError, match="no Kubernetes tools at .*no-tools"):
        run_loop(cfg)
    assert "starting" not in capsys.readouterr().err


def test_a_segment_longer_than_the_trace_says_so(data_dir: Path) -> None:
    # new-user trial: --hours 1000 named "a 1000.0 h segment ... after -2390400 s"
    cfg = LoopConfig(trace=data_dir / "traces" / "servegen-m-large", hours=400.0, capacity_rps=0.4, progress=False)
    with pytest.raises(ValueError, match="--hours 400 is longer than the trace.*336 h"):
        prepare(cfg)


def test_the_cli_names_missing_kube_tools_without_pointing_at_logs_it_never_wrote(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trial round (Dec 4): the message ended "(logs in out/loop)", a folder nothing was written to
    from typer.testing import CliRunner

    from sim.cli import app

    monkeypatch.setenv("PROMPTEDGE_KUBE_TOOLS", str(tmp_path / "no-tools"))
    result = CliRunner().invoke(
        app, ["loop", "--trace", str(data_dir / "traces" / "servegen-m-large"), "--log-dir", str(tmp_path / "logs")]
    )
    assert result.exit_code == 2, result.output
    assert "no Kubernetes tools at" in result.output and "no-tools" in result.output
    assert "logs in" not in result.output
