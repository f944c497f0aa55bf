"""Traffic with real peaks: per-window rate statistics -> arrivals, segments, history."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis

from sim.client.traffic import (
    ClientWindow,
    RateSeries,
    TokenSampler,
    TrafficFormatError,
    build_segment,
    generate_arrivals,
    history_minutes,
    read_nab,
    read_rates,
    read_servegen,
    scale_for_peak,
    shape_for_cv,
    steepest_ramp,
)
from sim.client.traffic.arrivals import _weibull_cv
from sim.client.traffic.history import counter_fields, write_history


def _gaps_cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


@pytest.mark.parametrize(
    "pattern,cv", [("Gamma", 0.5), ("Gamma", 3.0), ("Weibull", 0.7), ("Weibull", 2.5), ("Exponential", 1.0)]
)
def test_one_client_keeps_its_rate_and_burstiness(pattern: str, cv: float) -> None:
    series = RateSeries(600.0, [[ClientWindow(5.0, cv, pattern)]] * 20)
    times = generate_arrivals(series, 0.0, series.span_s, seed=3)
    assert len(times) == pytest.approx(5.0 * series.span_s, rel=0.1 if cv < 2 else 0.3)
    assert _gaps_cv(times) == pytest.approx(cv, rel=0.2 if cv < 2 else 0.35)


@pytest.mark.parametrize("pattern,cv", [("Gamma", 3.0), ("Weibull", 2.5), ("Exponential", 1.0), ("Gamma", 0.5)])
def test_sparse_bursty_clients_keep_their_rate_window_after_window(pattern: str, cv: float) -> None:
    # Regression (issue 10 loop): a client whose mean gap is longer than the window restarts
    # every window; its first arrival must follow the stationary forward-recurrence time
    # (mean gap x (1 + cv^2) / 2), not a uniform fraction of one gap (mean gap / 2), or
    # bursty sparse clients arrive far more often than their published rate. Seen failing
    # before the fix: 6.2x the rate for Gamma cv 3, 3.6x Weibull cv 2.5, 1.8x Poisson, 1.2x Gamma cv 0.5.
    rate, windows = 1 / 1200.0, 4000
    series = RateSeries(600.0, [[ClientWindow(rate, cv, pattern)] * 10] * windows)
    times = generate_arrivals(series, 0.0, series.span_s, seed=5)
    expected = rate * 10 * series.span_s  # 20,000 arrivals
    assert len(times) == pytest.approx(expected, rel=0.06)


def test_weibull_shape_solves_the_cv() -> None:
    for cv in (0.3, 1.0, 4.0):
        assert _weibull_cv(shape_for_cv("Weibull", cv)) == pytest.approx(cv, rel=1e-6)
    assert shape_for_cv("Gamma", 2.0) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        shape_for_cv("Pareto", 1.0)


def test_clients_add_up_window_by_window_and_scale_multiplies() -> None:
    windows = [
        [ClientWindow(1.0, 1.0, "Exponential"), ClientWindow(2.0, 1.0, "Gamma")],
        [],
        [ClientWindow(10.0, 0.0, "Gamma")],
    ]
    series = RateSeries(600.0, windows)
    times = generate_arrivals(series, 0.0, 1800.0, scale=0.5, seed=1)
    per_window = np.histogram(times, bins=[0, 600, 1200, 1800])[0]
    assert per_window[0] == pytest.approx(1.5 * 600, rel=0.15)
    assert per_window[1] == 0
    assert per_window[2] == pytest.approx(5.0 * 600, abs=2)  # cv 0: evenly spaced
    assert list(times) == sorted(times)


def test_same_seed_same_arrivals_other_seed_other_arrivals() -> None:
    series = RateSeries(600.0, [[ClientWindow(2.0, 2.0, "Weibull")]] * 3)
    a, b = generate_arrivals(series, 300, 1200, seed=7), generate_arrivals(series, 300, 1200, seed=7)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, generate_arrivals(series, 300, 1200, seed=8))
    assert a.min() >= 0 and a.max() < 1200


def test_segment_outside_the_trace_is_refused() -> None:
    series = RateSeries(600.0, [[ClientWindow(1.0, 1.0, "Gamma")]] * 2)
    with pytest.raises(ValueError, match="outside"):
        generate_arrivals(series, 600, 1200)


def test_steepest_ramp_finds_the_climb_and_respects_history() -> None:
    flat, ramp = 10.0, [10, 10, 20, 40, 80, 80]
    totals = [flat] * 30 + ramp + [flat] * 30 + [10, 40, 120, 120] + [flat] * 30
    series = RateSeries(600.0, [[ClientWindow(r, 1.0, "Gamma")] for r in totals])
    start = steepest_ramp(series, hours=1.0)
    assert 60 * 600 <= start <= 63 * 600  # the second, steeper climb
    early = steepest_ramp(series, hours=1.0, min_start_s=0)
    assert early == start
    with pytest.raises(ValueError):
        steepest_ramp(series, hours=1.0, min_start_s=series.span_s)


def test_a_ramp_with_a_bounded_jump_is_preferred_to_a_step_when_asked() -> None:
    step = [10, 10, 10, 40, 40, 40]  # rises 4x in one window: the steepest, but a step
    ramp = [10, 12, 15, 19, 24, 30]  # rises 3x over the hour, at most 1.25x a window
    totals = [10.0] * 30 + step + [10.0] * 30 + ramp + [10.0] * 30
    series = RateSeries(600.0, [[ClientWindow(r, 1.0, "Gamma")] for r in totals])
    assert 27 * 600 <= steepest_ramp(series, hours=1.0) <= 33 * 600
    assert 63 * 600 <= steepest_ramp(series, hours=1.0, max_jump=1.3) <= 66 * 600  # the ramp (it starts at 66)
    sawtooth = RateSeries(600.0, [[ClientWindow(r, 1.0, "Gamma")] for r in [10.0, 20.0] * 20])
    with pytest.raises(ValueError, match="at most 1.5x"):
        steepest_ramp(sawtooth, hours=1.0, max_jump=1.5)


def test_scale_for_peak_and_build_segment() -> None:
    series = RateSeries(600.0, [[ClientWindow(r, 1.0, "Gamma")] for r in (1, 2, 4, 8)])
    scale = scale_for_peak(series, 0, 1800, peak_rps=2.0)
    assert scale == pytest.approx(0.5)
    tokens = TokenSampler([(100, 10), (2000, 300)], max_generated=200)
    seg = build_segment(series, 0, 1800, scale, tokens, seed=2)
    assert seg.window_rps == pytest.approx([0.5, 1.0, 2.0])
    assert {(r.context_tokens, r.generated_tokens) for r in seg.requests} == {(100, 10), (2000, 200)}
    assert len(seg.requests) == pytest.approx(3.5 * 600, rel=0.1)
    assert seg == build_segment(series, 0, 1800, scale, tokens, seed=2)


def test_history_minutes_are_the_days_before_clipped_at_the_trace_start() -> None:
    series = RateSeries(600.0, [[ClientWindow(r, 1.0, "Gamma")] for r in (1, 2, 3, 4)])
    minutes = history_minutes(series, start_s=1800, days=1, scale=2.0)
    assert [m for m, _ in minutes] == list(range(-30, 0))
    assert minutes[0][1] == pytest.approx(1 * 2 * 60) and minutes[-1][1] == pytest.approx(3 * 2 * 60)


def test_history_lands_in_the_router_counter_layout(redis_url: str) -> None:
    redis_client = redis.Redis.from_url(redis_url)
    start = 1_700_000_000.0
    write_history(redis_client, "m", start, [(-2, 10.0), (-1, 0.0)], miss_ratio=0.5, mean_tokens=(100.0, 20.0))
    minute = int(start // 60) - 2
    stored = redis_client.hgetall(f"promptedge:traffic:m:{minute // 1440}")
    assert stored[f"{minute}:requests".encode()] == b"10"
    assert stored[f"{minute}:misses".encode()] == b"5"
    assert stored[f"{minute}:completion_tokens".encode()] == b"200"
    assert stored[f"{minute + 1}:requests".encode()] == b"0"  # a quiet minute is an explicit 0
    assert redis_client.sismember("promptedge:traffic:models", "m")
    assert 0 < redis_client.ttl(f"promptedge:traffic:m:{minute // 1440}") <= 15 * 86400
    assert counter_fields(3.4, 1.0, (1.0, 1.0)) == {
        "requests": 3,
        "misses": 3,
        "prompt_tokens": 3,
        "completion_tokens": 3,
    }


def test_servegen_m_large_reads_as_14_days_with_a_daily_ramp(data_dir: Path) -> None:
    series = read_servegen(data_dir / "traces" / "servegen-m-large")
    assert len(series.windows) == 2016 and series.step_s == 600
    totals = series.totals()
    assert 150 < sum(totals) / len(totals) < 250  # ~196 requests/s on average
    start = steepest_ramp(series, hours=1.0, min_start_s=7 * 86400)
    seg = slice(int(start // 600), int(start // 600) + 6)
    assert max(totals[seg]) > 1.3 * totals[seg.start]


def test_nab_taxi_is_a_poisson_series_of_half_hours(data_dir: Path) -> None:
    series = read_nab(data_dir / "traces" / "nab" / "nyc_taxi.csv")
    assert series.step_s == 1800 and len(series.windows) == 10320
    assert series.windows[0][0].cv == 1.0


def test_bad_rows_name_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "chunk-0-trace.csv").write_text("0,1.0,1.0,Gamma,1,1\n600,abc,1,Gamma,1,1\n")
    with pytest.raises(TrafficFormatError, match=r"chunk-0-trace.csv:2: column 2 \(rate\)"):
        read_servegen(tmp_path)
    with pytest.raises(TrafficFormatError, match="no ServeGen"):
        read_servegen(tmp_path / "nothing")


def test_sampled_history_keeps_the_mean_and_the_burstiness_of_each_window() -> None:
    # two windows of 2 days each: Poisson clients, then a bursty client (cv 3) at the same rate
    series = RateSeries(
        86400.0 * 2,
        [[ClientWindow(0.5, 1.0, "Gamma"), ClientWindow(0.5, 1.0, "Gamma")], [ClientWindow(1.0, 3.0, "Weibull")]],
    )
    minutes = history_minutes(series, start_s=4 * 86400, days=4, scale=1.0, seed=3)
    poisson = np.array([n for m, n in minutes[: 2 * 1440]])
    bursty = np.array([n for m, n in minutes[2 * 1440 :]])
    assert all(float(n).is_integer() for n in poisson) and poisson.mean() == pytest.approx(60, rel=0.02)
    assert poisson.var() == pytest.approx(60, rel=0.15)  # Poisson: variance = mean
    assert bursty.mean() == pytest.approx(60, rel=0.05)
    assert bursty.var() == pytest.approx(60 * 9, rel=0.2)  # rate x 60 x cv^2
    assert minutes == history_minutes(series, start_s=4 * 86400, days=4, scale=1.0, seed=3)


@pytest.mark.parametrize("layout", ["csv", "servegen"])
def test_a_trace_that_is_not_text_is_refused_with_its_file_named(tmp_path: Path, layout: str) -> None:
    # new-user trial: a binary file as --trace gave "'utf-8' codec can't decode byte 0x82 in
    # position 1", naming no file
    bad = tmp_path / "trace.csv" if layout == "csv" else tmp_path / "servegen" / "chunk-0.csv"
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(b"\x00\x82\xff\xfe binary")
    with pytest.raises(TrafficFormatError, match=f"{bad}.*not UTF-8"):
        read_rates(bad if layout == "csv" else bad.parent)
