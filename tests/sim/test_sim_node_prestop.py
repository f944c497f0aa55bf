"""Pure: reading a container's ``lifecycle.preStop`` as the stand-in node runs it, and the
kubelet's termination clock (grace period from the deletion, at least 2 s after SIGTERM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.node.pod.prestop import PreStopHook, pre_stop_hook, prestop_sleep_wall_s, sigkill_at
from sim.node.pod.spec import replica_spec

ROOT = Path(__file__).resolve().parents[2]


def hook(pre_stop: dict, ports: list | None = None) -> PreStopHook | None:
    return pre_stop_hook({"name": "vllm", "ports": ports or [], "lifecycle": {"preStop": pre_stop}})


@pytest.mark.parametrize(
    ("command", "seconds"),
    [
        (["sleep", "5"], 5.0),
        (["/bin/sleep", "2.5"], 2.5),
        (["/bin/sh", "-c", "sleep 5"], 5.0),
        (["sh", "-c", "sleep 1m"], 60.0),
    ],
)
def test_exec_sleep_is_a_sleep_of_n_seconds(command: list[str], seconds: float) -> None:
    assert hook({"exec": {"command": command}}) == PreStopHook("sleep", sleep_s=seconds)


@pytest.mark.parametrize(
    "command",
    [
        ["/bin/sh", "-c", "sleep 5 && kill -TERM 1"],  # more than a sleep: a script the image runs
        ["/usr/local/bin/drain"],
        ["sleep"],
        ["sleep", "five"],
        ["sh", "-c", "sleep 'unclosed"],
        [],
    ],
)
def test_any_other_exec_command_is_skipped_with_the_reason(command: list[str]) -> None:
    skipped = hook({"exec": {"command": command}})
    assert skipped is not None and skipped.kind == "skip" and repr(command) in skipped.what


def test_sleep_action_of_newer_kubernetes() -> None:
    assert hook({"sleep": {"seconds": 3}}) == PreStopHook("sleep", sleep_s=3.0)
    assert hook({"sleep": {"seconds": "x"}}).kind == "skip"  # type: ignore[union-attr]


def test_http_get_by_port_name_or_number_on_the_pod_ip_unless_a_host_is_given() -> None:
    by_name = hook({"httpGet": {"path": "drain", "port": "http"}}, ports=[{"name": "http", "containerPort": 8000}])
    assert by_name == PreStopHook("http", port=8000, path="/drain")
    assert by_name.url("127.0.1.7") == "http://127.0.1.7:8000/drain"
    other = hook({"httpGet": {"host": "127.0.0.9", "port": 9000, "scheme": "HTTPS"}})
    assert other is not None and other.url("127.0.1.7") == "https://127.0.0.9:9000/"
    assert hook({"httpGet": {"port": "admin"}}).kind == "skip"  # type: ignore[union-attr]
    assert hook({"tcpSocket": {"port": 8000}}).kind == "skip"  # type: ignore[union-attr]


def test_no_hook() -> None:
    assert pre_stop_hook({"name": "vllm"}) is None
    assert pre_stop_hook({"name": "vllm", "lifecycle": {"postStart": {"exec": {"command": ["true"]}}}}) is None


def test_the_deployment_we_ship_sleeps_inside_its_grace_period() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "vllm-pool.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = replica_spec({"metadata": {"name": "vllm-0"}, "spec": deployment["spec"]["template"]["spec"]}, "a100", "0")
    assert spec.pre_stop is not None and spec.pre_stop.kind == "sleep"
    assert 0 < spec.pre_stop.sleep_s < spec.grace_s


def test_sigkill_when_the_grace_period_from_the_deletion_is_over_but_never_within_2_s_of_sigterm() -> None:
    # deletion at 100 (wall), grace 60 simulated s at 20x = 3 wall s
    assert sigkill_at(100.0, 60.0, sigterm_at=100.25, time_scale=20.0) == 103.0  # preStop 5 s, then SIGTERM
    assert sigkill_at(100.0, 60.0, sigterm_at=102.95, time_scale=20.0) == pytest.approx(103.05)  # hook near the end
    assert sigkill_at(100.0, 0.0, sigterm_at=100.0, time_scale=1.0) == 102.0


def test_a_prestop_sleep_is_not_compressed_below_the_control_planes_propagation_time() -> None:
    # the control plane runs at wall speed: 10 s at 15x was 0.67 wall s, less than the ~1.1 s an
    # EndpointSlice update took to reach the router (2 x 502 in the loop's e2e test)
    assert prestop_sleep_wall_s(10, 15) == 2.0
    assert prestop_sleep_wall_s(10, 1) == 10.0  # unscaled: the sleep as written
    assert prestop_sleep_wall_s(60, 15) == 4.0  # long enough compressed: no floor
    assert prestop_sleep_wall_s(1, 15) == 1.0  # never longer than the hook asks
    assert prestop_sleep_wall_s(0, 15) == 0.0
