"""The stand-in node's pure parts: Pod spec -> replica, warm-up, readiness, statuses, IPs."""

from __future__ import annotations

import pytest

from sim.node import DISTRIBUTIONS, PodSpecError, WarmupError, replica_spec, warmup_seconds
from sim.node.pod.probe import Readiness
from sim.node.pod.spec import ProbeSpec
from sim.node.status import IpPool, PodView, crash_backoff_s, node_capacity, pod_status, taints_without_not_ready


def pod(container: dict, annotations: dict | None = None, **spec: object) -> dict:
    return {
        "metadata": {"name": "vllm-7d9f-abcde", "namespace": "default", "uid": "u1", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", **container}], **spec},
    }


def test_vllm_serve_positional_model_with_port_and_len_as_in_a_real_deployment() -> None:
    r = replica_spec(
        pod(
            {
                "command": ["vllm", "serve"],
                "args": [
                    "meta-llama/Llama-3.1-8B-Instruct",
                    "--port",
                    "8000",
                    "--max-model-len",
                    "16k",
                    "--served-model-name",
                    "llama-8b",
                ],
                "ports": [{"containerPort": 8000, "name": "http"}],
            }
        ),
        "a100",
        "0",
    )
    assert (r.model, r.served_model_name, r.max_model_len, r.port) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "llama-8b",
        "16000",
        8000,
    )
    assert r.probe == ProbeSpec(path="/health", port=8000)  # no readinessProbe: /health, kubelet defaults
    assert (r.profile, r.warmup, r.grace_s) == ("a100", "0", 30.0)


def test_api_server_entrypoint_with_model_flag_env_refs_and_probe() -> None:
    container = {
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": ["--model=$(MODEL)", "--max-model-len", "4K"],
        "env": [{"name": "MODEL", "value": "Qwen/Qwen2.5-7B"}],
        "ports": [{"containerPort": 8080, "name": "api"}],
        "readinessProbe": {
            "httpGet": {"path": "/v1/models", "port": "api"},
            "periodSeconds": 5,
            "failureThreshold": 2,
            "successThreshold": 2,
            "initialDelaySeconds": 3,
        },
    }
    r = replica_spec(
        pod(
            container,
            {"promptedge.io/sim-profile": "t4", "promptedge.io/sim-warmup-s": "vllm-8b-cold"},
            terminationGracePeriodSeconds=120,
        ),
        "a100",
        "0",
    )
    assert (r.model, r.served_model_name, r.max_model_len, r.port) == (
        "Qwen/Qwen2.5-7B",
        "Qwen/Qwen2.5-7B",
        "4096",
        8080,
    )
    assert r.probe == ProbeSpec(
        path="/v1/models", port=8080, period_s=5, initial_delay_s=3, success_threshold=2, failure_threshold=2
    )
    assert (r.profile, r.warmup, r.grace_s) == ("t4", "vllm-8b-cold", 120.0)


def test_shell_script_is_split_and_bad_len_passes_through_for_serve_to_refuse() -> None:
    r = replica_spec(
        pod({"command": ["/bin/sh", "-c"], "args": ["vllm serve 'my model' --max-model-len lots --port 9000"]}),
        "a100",
        "0",
    )
    assert (r.model, r.max_model_len, r.port) == ("my model", "lots", 9000)


def test_unmappable_pods_raise() -> None:
    with pytest.raises(PodSpecError, match="no container"):
        replica_spec({"metadata": {}, "spec": {"containers": []}}, "a100", "0")
    with pytest.raises(PodSpecError, match="names no container port"):
        replica_spec(pod({"readinessProbe": {"httpGet": {"path": "/health", "port": "nope"}}}), "a100", "0")
    # a shell script with an open quote: the node exited with shlex's ValueError, on every
    # restart, taking every replica with it (attack round, 4 December)
    with pytest.raises(PodSpecError, match="No closing quotation"):
        replica_spec(pod({"command": ["/bin/sh", "-c", "exec vllm serve m --served-model-name 'llama"]}), "a100", "0")


def test_a_length_too_large_for_a_number_passes_through_for_serve_to_refuse() -> None:
    # 400 digits + "k" overflowed float -> int inside the node (OverflowError, node exit)
    huge = "1" * 400 + "k"
    r = replica_spec(pod({"command": ["vllm", "serve", "m"], "args": ["--max-model-len", huge]}), "a100", "0")
    assert r.max_model_len == huge


def test_warmup_number_or_distribution_seeded_by_pod_name() -> None:
    assert warmup_seconds("12.5", "p") == 12.5
    a = [warmup_seconds("vllm-8b-cached", f"vllm-{i}") for i in range(200)]
    assert a == [warmup_seconds("vllm-8b-cached", f"vllm-{i}") for i in range(200)]  # runs repeat
    assert len(set(a)) > 150  # but Pods differ
    med = DISTRIBUTIONS["vllm-8b-cached"].median_s
    assert 0.8 * med < sorted(a)[100] < 1.25 * med
    assert all(med * 0.54 <= x <= med * 1.83 for x in a)  # clipped at exp(+-3 * 0.2)
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(WarmupError):
            warmup_seconds(bad, "p")


def test_readiness_needs_consecutive_results() -> None:
    probe = ProbeSpec(path="/health", port=1, success_threshold=2, failure_threshold=3)
    r = Readiness()
    assert [r.observe(ok, probe) for ok in (True, False, True, True)] == [False, False, False, True]
    assert r.ready
    assert [r.observe(ok, probe) for ok in (False, False, True, False, False, False)] == [False] * 5 + [True]
    assert not r.ready


def test_pod_status_reports_running_not_ready_then_ready() -> None:
    view = PodView(
        ip="127.0.1.2",
        start_time="t0",
        container="vllm",
        image="img",
        running_since="t1",
        waiting_reason=None,
        ready=False,
        ready_changed_at="t0",
        restart_count=0,
        last_terminated=None,
    )
    status = pod_status(view)["status"]
    assert (status["phase"], status["podIP"]) == ("Running", "127.0.1.2")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    assert status["containerStatuses"][0]["started"] is True
    ready = pod_status(PodView(**{**view.__dict__, "ready": True}))["status"]
    assert {c["type"]: c["status"] for c in ready["conditions"]} == {
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }


def test_node_pieces() -> None:
    assert node_capacity(8, "64", "512Gi", 110)["nvidia.com/gpu"] == "8"
    taints = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoSchedule"}]
    assert taints_without_not_ready(taints) == [{"key": "gpu", "effect": "NoSchedule"}]
    assert taints_without_not_ready([{"key": "gpu"}]) is None  # nothing to write
    assert [crash_backoff_s(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]


def test_ip_pool_gives_unique_loopback_addresses() -> None:
    pool = IpPool("127.0.1")
    ips = [pool.take() for _ in range(253)]
    assert len(set(ips)) == 253 and ips[0] == "127.0.1.2" and pool.take() is None
    pool.give_back("127.0.1.7")
    assert pool.take("127.0.1.9") == "127.0.1.7"  # wanted is taken: the lowest free one
    with pytest.raises(ValueError):
        IpPool("10.0.1")


def test_ip_pool_skips_addresses_it_is_told_are_held_elsewhere() -> None:
    pool = IpPool("127.0.1")
    held = {"127.0.1.2", "127.0.1.3"}  # another process listens there
    assert pool.take("127.0.1.2", usable=lambda ip: ip not in held) == "127.0.1.4"
    assert pool.take(usable=lambda ip: False) is None
