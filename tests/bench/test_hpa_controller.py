"""The reactive baseline's decision function: HPA's algorithm, in simulated seconds."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.bench_script import BENCH, load_bench

hpa = load_bench("hpa_controller")

CFG = hpa.HpaConfig(target=2.0, min_replicas=1, max_replicas=20)


def test_desired_is_ceil_of_current_times_metric_over_target() -> None:
    d = hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=9.0, ready=3, current=3)  # 3 per pod vs 2
    assert d.replicas == 5 and "up" in d.reason


def test_within_ten_percent_tolerance_nothing_changes() -> None:
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=4 * 2.15, ready=4, current=4).replicas == 4
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=4 * 1.85, ready=4, current=4).replicas == 4
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=4 * 2.25, ready=4, current=4).replicas == 5


def test_scale_down_waits_for_the_300_s_stabilisation_window() -> None:
    state = hpa.HpaState()
    assert hpa.decide(CFG, state, 0.0, 16.0, ready=8, current=8).replicas == 8
    for t in range(15, 300, 15):  # load drops to a quarter: recommendation 2, held at 8
        assert hpa.decide(CFG, state, float(t), 4.0, ready=8, current=8).replicas == 8
    assert hpa.decide(CFG, state, 315.0, 4.0, ready=8, current=8).replicas == 2


def test_scale_up_is_immediate_but_limited_per_sync() -> None:
    d = hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=40.0, ready=1, current=1)  # wants 20
    assert d.raw == 20 and d.replicas == 5  # max(2 x 1, 1 + 4)


def test_unready_pods_count_as_zero_load_and_never_cause_a_scale_down() -> None:
    # 6 asked, 2 ready carry 6/s: 1.5x target per ready pod, but 6 pods cover it: hold at 6.
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=6.0, ready=2, current=6).replicas == 6
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, load_rps=20.0, ready=2, current=6).replicas == 10


def test_missing_metric_holds_and_bounds_apply() -> None:
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, None, ready=3, current=3).replicas == 3
    small = hpa.HpaConfig(target=2.0, min_replicas=2, max_replicas=4)
    assert hpa.decide(small, hpa.HpaState(), 0.0, 100.0, ready=4, current=4).replicas == 4
    seeded = hpa.HpaState()
    hpa.decide(small, seeded, 0.0, None, ready=4, current=4)
    assert hpa.decide(small, seeded, 301.0, 0.0, ready=4, current=4).replicas == 2
    with pytest.raises(ValueError):
        hpa.HpaConfig(target=0.0)


def test_forwarded_total_counts_misses_not_hits() -> None:
    text = (
        "\n".join(
            [
                "# HELP promptedge_router_requests_total Requests answered",
                "# TYPE promptedge_router_requests_total counter",
                'promptedge_router_requests_total{pool="m",replica="a",status="200",cache="miss"} 7.0',
                'promptedge_router_requests_total{pool="m",replica="b",status="200",cache="bypass"} 2.0',
                'promptedge_router_requests_total{pool="m",replica="",status="200",cache="exact"} 5.0',
                'promptedge_router_requests_total{pool="m",replica="",status="400",cache="none"} 3.0',
                'promptedge_router_requests_created{pool="m",replica="a",status="200",cache="miss"} 1.7e9',
            ]
        )
        + "\n"
    )
    assert hpa.forwarded_total(text) == 9.0


def test_a_new_controller_does_not_scale_down_before_its_first_window_has_passed() -> None:
    # Regression (issue 10 loop): the stabilisation window started empty, so a controller that
    # started before the traffic saw load 0 and scaled 2 -> 1 at once (the loop's reactive run:
    # 1 ready replica when the segment began, 33 requests shed with 429). The HPA controller
    # seeds the window with the current replicas the first time it sees an HPA
    # (recordInitialRecommendation in pkg/controller/podautoscaler/horizontal.go).
    state = hpa.HpaState()
    assert hpa.decide(CFG, state, 0.0, None, ready=2, current=2).replicas == 2  # no metric yet
    for t in range(15, 300, 15):
        assert hpa.decide(CFG, state, float(t), 0.0, ready=2, current=2).replicas == 2
    assert hpa.decide(CFG, state, 315.0, 0.0, ready=2, current=2).replicas == 1
    # Scale-up is never held back by the seed.
    assert hpa.decide(CFG, hpa.HpaState(), 0.0, 12.0, ready=2, current=2).replicas == 6


@pytest.mark.parametrize("api", ["refused", "silent"])
def test_an_api_server_that_is_down_or_silent_is_logged_each_sync_and_sigterm_still_stops_it(
    tmp_path: Path, api: str
) -> None:
    # Attack round: a refused connection ended the controller in a urllib3 traceback, and an API
    # server that accepts and never answers held it for minutes, deaf to SIGTERM, while the
    # loop's reactive run went on with no autoscaler.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if api == "silent":
        listener.listen(16)  # accepts (the kernel's backlog), never answers
    else:
        listener.close()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [
                    {"name": "x", "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "x", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
            }
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            str(BENCH / "hpa_controller.py"),
            "--router",
            "http://127.0.0.1:9",
            "--deployment",
            "vllm",
            "--kubeconfig",
            str(kubeconfig),
            "--target-rps",
            "1",
            "--clock-scale",
            "15",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait for the syncs themselves, not a fixed time: on a busy CI machine the controller's start
    # (importing the Kubernetes client) alone took most of a fixed 6 s, leaving one logged sync.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if sum('"error": "kubernetes:' in line for line in list(lines)) >= 2:
                break
            time.sleep(0.1)
        assert proc.poll() is None, (lines, proc.stderr.read() if proc.stderr else "")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)  # SIGTERM stops it within a sync, even one held by a silent server
        reader.join(timeout=5)
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()
    assert proc.returncode == 0 and "Traceback" not in err, err
    errors = [json.loads(line)["error"] for line in lines if '"error"' in line]
    assert sum(e.startswith("kubernetes:") for e in errors) >= 2, lines


def test_an_unusable_kubeconfig_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "no-kubeconfig"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "hpa_controller.py"),
            "--router",
            "http://127.0.0.1:9",
            "--deployment",
            "vllm",
            "--kubeconfig",
            str(missing),
            "--target-rps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and str(missing) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
