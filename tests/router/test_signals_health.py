"""Unit tests of metric parsing (vLLM old and new, SGLang, llama.cpp, DCGM) and health state."""

from __future__ import annotations

import pytest

from router.dispatch.signals import parse_metrics
from router.fleet.health import REFUSED_DEFAULT_S, REFUSED_MAX_S, HealthConfig, HealthState, judged_ttft
from router.forward.upstream import retry_after_s
from router.observe.counters import SimClock

VLLM_NEW = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 7.0
"""
VLLM_OLD = b"""vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
"""
SGLANG = b"""sglang:num_running_reqs{model_name="m"} 8.0
sglang:num_queue_reqs{model_name="m"} 2.0
sglang:token_usage{model_name="m"} 0.4
"""
LLAMACPP = b"""# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
llamacpp:requests_deferred 3
"""
DCGM = b"""DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 60000
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1"} 20000
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 93
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 81
"""


def test_parses_every_supported_server() -> None:
    new = parse_metrics(VLLM_NEW)
    assert (new.running, new.waiting, new.kv_usage) == (5.0, 4.0, 0.5)
    old = parse_metrics(VLLM_OLD)
    assert (old.running, old.waiting, old.kv_usage) == (1.0, 0.0, 0.75)
    sg = parse_metrics(SGLANG)
    assert (sg.running, sg.waiting, sg.kv_usage) == (8.0, 2.0, 0.4)
    lc = parse_metrics(LLAMACPP)
    assert (lc.running, lc.waiting, lc.kv_usage) == (1.0, 3.0, None)
    gpu = parse_metrics(DCGM)
    assert gpu.mem_used == pytest.approx(0.75) and gpu.gpu_util == pytest.approx(0.93) and gpu.temp_c == 81
    merged = new.merged(gpu)
    assert (merged.running, merged.mem_used, merged.temp_c) == (5.0, gpu.mem_used, 81)


def test_malformed_metric_line_raises() -> None:
    with pytest.raises(ValueError):
        parse_metrics(b'vllm:num_requests_running{model_name="m" 3\n')


def test_probes_rise_and_fall_and_start_down() -> None:
    state = HealthState(HealthConfig(rise=2, fall=2))
    assert not state.admits(0.0)  # warming up until proven healthy
    state.probe(True)
    assert not state.up
    state.probe(True)
    assert state.admits(0.0)
    state.probe(False)
    assert state.up
    state.probe(False)
    assert not state.admits(0.0)


def test_connect_failures_open_the_circuit_then_half_open_lets_one_trial_through() -> None:
    state = HealthState(HealthConfig(connect_failures=3, open_s=5.0))
    state.probe(True)
    for _ in range(3):
        state.on_evidence("connect_failure", 10.0)
    assert state.circuit(10.0) == "open" and not state.admits(14.9)
    assert not state.admits(14.9, last_resort=True)  # it cannot be reached: no last resort
    assert state.circuit(15.0) == "half_open" and state.admits(15.0)
    assert state.on_dispatch(15.0)
    assert not state.admits(15.1)  # only one trial at a time
    state.on_evidence("connect_failure", 15.2)
    assert not state.admits(16.0) and state.admits(20.2)
    assert state.on_dispatch(20.2)
    state.on_success(20.3)
    assert state.circuit(20.3) == "closed" and state.admits(20.3)


def test_a_trial_without_a_verdict_lets_the_next_request_be_the_trial() -> None:
    # A timed-out trial (a client's deadline) used to hold the circuit half-open for good.
    state = HealthState(HealthConfig(connect_failures=1, open_s=5.0))
    state.probe(True)
    state.on_evidence("connect_failure", 0.0)
    assert state.on_dispatch(5.0) and not state.admits(5.0)
    state.on_evidence(None, 6.0)  # timed out: no evidence
    state.end_trial()
    assert state.admits(6.0) and state.on_dispatch(6.0)


def test_server_errors_open_the_circuit_only_at_a_rate_over_enough_answers() -> None:
    config = HealthConfig(error_rate=0.5, error_window_s=30.0, error_min_samples=10, open_s=5.0)
    state = HealthState(config)
    state.probe(True)
    for _ in range(3):  # three 500s used to close a one-replica pool for 5 s
        state.on_evidence("server_error", 1.0)
    assert state.circuit(1.0) == "closed" and state.admits(1.0)
    for i in range(6):
        state.on_success(2.0 + i)
    state.on_evidence("server_error", 9.0)  # 4 errors of 10 answers: under the rate
    assert state.circuit(9.0) == "closed" and state.error_ratio(9.0) == pytest.approx(0.4)
    state.on_evidence("server_error", 10.0)  # 5 of 11
    assert state.circuit(10.0) == "closed"
    state.on_evidence("server_error", 11.0)  # 6 of 12: at the rate
    assert state.circuit(11.0) == "open" and not state.admits(11.0)
    assert state.admits(11.0, last_resort=True)  # it still answers: the pool's last resort


def test_errors_age_out_of_the_window_and_deadlines_are_no_evidence() -> None:
    state = HealthState(HealthConfig(error_rate=0.5, error_window_s=30.0, error_min_samples=10))
    state.probe(True)
    for i in range(9):
        state.on_evidence("server_error", float(i))
    for _ in range(100):
        state.on_evidence(None, 10.0)  # timeouts of requests whose deadline the client chose
    assert state.circuit(10.0) == "closed"
    for i in range(10):
        state.on_success(50.0 + i)  # the errors are older than the window
    state.on_evidence("server_error", 60.0)
    assert state.circuit(60.0) == "closed" and state.error_ratio(60.0) == pytest.approx(1 / 11)


def test_latency_outlier_is_ejected_for_a_while() -> None:
    config = HealthConfig(outlier_p99_s=2.0, min_samples=10, eject_s=10.0)
    state = HealthState(config)
    state.probe(True)
    for _ in range(9):
        state.on_success(1.0, ttft_s=0.1)
    state.on_success(1.0, ttft_s=5.0)
    assert not state.admits(2.0) and state.admits(2.0, last_resort=True)
    assert state.admits(11.0)


def test_only_short_prompts_give_ttft_samples() -> None:
    # a long prompt's TTFT is its own prefill, chosen by the client (finding A9)
    assert judged_ttft(5.0, "short") == 5.0
    assert judged_ttft(5.0, "medium") is None and judged_ttft(5.0, "long") is None
    assert judged_ttft(None, "short") is None


def test_sim_clock_is_identity_at_scale_1_and_compresses_time_otherwise() -> None:
    import time

    assert abs(SimClock(None, 1.0).now() - time.time()) < 1.0
    clock = SimClock(time.time() - 10.0, 60.0)
    assert 590.0 < clock.now() - clock.origin < 700.0


def test_a_replica_that_refused_gets_nothing_new_for_its_retry_after_but_as_last_resort() -> None:
    h = HealthState(HealthConfig(rise=1))
    h.probe(True)
    h.on_refused(100.0, None)  # no Retry-After: the default back-off
    assert not h.admits(101.0) and h.admits(101.0, last_resort=True)  # a pool of one still asks it
    assert h.admits(100.0 + REFUSED_DEFAULT_S)
    h.on_refused(200.0, 3600.0)  # a Retry-After of an hour is cut: the probes still judge
    assert not h.admits(200.0 + REFUSED_MAX_S - 1) and h.admits(200.0 + REFUSED_MAX_S)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 0 ", 0.0),
        (None, None),
        ("-1", None),
        ("1.5", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
        # str.isdigit() is true for these, float() refuses them:
        # a replica sending one made every request it got a 500
        ("\u00b2", None),
        ("\u0663", None),
        ("\u2460", None),
        ("9" * 400, float("9" * 400)),
    ],
)
def test_retry_after_is_read_in_its_delay_seconds_form_only(value: str | None, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds
