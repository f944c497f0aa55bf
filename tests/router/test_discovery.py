"""Discovery without I/O: EndpointSlice mapping, pool reconciliation, the YAML replica file,
source selection and the CLI's error message."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from router.__main__ import cli
from router.discovery import DiscoveredReplica, DiscoveryError, StaticSource, apply, build_source
from router.discovery.file import ReplicasFileError, load_replicas_file
from router.discovery.slices import SliceRules, choose_version, merge, replicas_of
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from router.settings import ReplicaSpec, RouterSettings
from tests.router.fake_kube_api import convert, endpoint, endpoint_slice

RULES = SliceRules(port_name="http", model_label="promptedge.io/model", model=None)
LABELS = {"kubernetes.io/service-name": "vllm", "promptedge.io/model": "llama"}


def spec(url: str, model: str = "llama") -> ReplicaSpec:
    return ReplicaSpec(url=url, model=model)


# --- EndpointSlice -> replicas -----------------------------------------------------------------


def test_conditions_map_to_taking_requests_or_draining() -> None:
    obj = endpoint_slice(
        "vllm-abc",
        [
            endpoint("10.0.0.1", ready=True),
            endpoint("10.0.0.2", ready=False),  # failing readiness
            endpoint("10.0.0.3", ready=None),  # unknown: ready
            endpoint("10.0.0.4", ready=False, serving=True, terminating=True),  # shutting down
            endpoint("10.0.0.5", ready=False, serving=False, terminating=True),
            endpoint("10.0.0.6", ready=None, terminating=True),  # unknown ready, terminating
        ],
        8000,
        LABELS,
    )
    replicas, problem = replicas_of(obj, RULES)
    assert problem is None
    assert [(r.spec.url, r.draining) for r in replicas] == [
        ("http://10.0.0.1:8000", False),
        ("http://10.0.0.2:8000", True),
        ("http://10.0.0.3:8000", False),
        ("http://10.0.0.4:8000", True),
        ("http://10.0.0.5:8000", True),
        ("http://10.0.0.6:8000", True),
    ]
    assert {r.spec.model for r in replicas} == {"llama"}


def test_named_port_ipv6_and_profile_label() -> None:
    obj = endpoint_slice("v6", [endpoint("fd00::7")], 9000, {**LABELS, "gpu": "a100"}, address_type="IPv6")
    obj["ports"].insert(0, {"name": "metrics", "port": 9100, "protocol": "TCP"})
    rules = SliceRules(port_name="http", model_label="promptedge.io/model", profile_label="gpu")
    (replica,), _ = replicas_of(obj, rules)
    assert replica.spec.url == "http://[fd00::7]:9000"
    assert replica.spec.profile == "a100"


@pytest.mark.parametrize(
    ("rules", "labels", "why"),
    [
        (SliceRules(port_name="grpc", model="llama"), LABELS, "no port named 'grpc'"),
        (SliceRules(model_label="promptedge.io/model"), {"kubernetes.io/service-name": "vllm"}, "no label"),
    ],
)
def test_unusable_slice_is_skipped_with_a_reason(rules: SliceRules, labels: dict[str, str], why: str) -> None:
    replicas, problem = replicas_of(endpoint_slice("s", [endpoint("10.0.0.1")], 8000, labels), rules)
    assert replicas == []
    assert problem is not None and why in problem and "slice /s" in problem


def test_model_label_falls_back_to_the_fixed_model() -> None:
    rules = SliceRules(model_label="promptedge.io/model", model="fallback")
    (replica,), _ = replicas_of(endpoint_slice("s", [endpoint("10.0.0.1")], 8000, {}), rules)
    assert replica.spec.model == "fallback"


def test_empty_slice_has_no_replicas() -> None:
    assert replicas_of(endpoint_slice("s", None, 8000, LABELS), RULES) == ([], None)


def _group(*versions: str) -> dict[str, object]:
    return {
        "kind": "APIGroup",
        "name": "discovery.k8s.io",
        "versions": [{"groupVersion": f"discovery.k8s.io/{v}", "version": v} for v in versions],
    }


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (("v1beta1",), "v1beta1"),  # Kubernetes 1.20
        (("v1", "v1beta1"), "v1"),  # 1.21-1.24
        (("v1beta1", "v1"), "v1"),  # v1 preferred whatever the server's order
        (("v1",), "v1"),  # 1.25+
        (("v1alpha1",), None),  # 1.16: nothing this router reads
        ((), None),
    ],
)
def test_api_discovery_prefers_v1_then_v1beta1(served: tuple[str, ...], chosen: str | None) -> None:
    assert choose_version(_group(*served)) == chosen


def test_a_slice_gives_the_same_replicas_in_v1_and_v1beta1() -> None:
    placed = [
        endpoint("10.0.0.1"),
        endpoint("10.0.0.2", ready=False),
        endpoint("10.0.0.3", serving=True, terminating=True),
    ]
    for i, ep in enumerate(placed):
        ep.update(nodeName=f"node-{i}", zone="z1")
    v1 = endpoint_slice("vllm-a", placed, 8000, {"m": "llama"})
    v1beta1 = convert(v1, "v1beta1")
    assert "topology" in v1beta1["endpoints"][0] and "zone" not in v1beta1["endpoints"][0]
    rules = SliceRules(model_label="m")
    assert replicas_of(v1beta1, rules) == replicas_of(v1, rules)
    assert [r.draining for r in replicas_of(v1beta1, rules)[0]] == [False, True, True]


def test_merge_prefers_the_slice_that_takes_requests() -> None:
    draining = [DiscoveredReplica(spec("http://10.0.0.1:8000"), draining=True)]
    taking = [DiscoveredReplica(spec("http://10.0.0.1:8000")), DiscoveredReplica(spec("http://10.0.0.0:8000"))]
    merged = merge([draining, taking])
    assert [(r.spec.url, r.draining) for r in merged] == [
        ("http://10.0.0.0:8000", False),
        ("http://10.0.0.1:8000", False),
    ]


# --- apply: snapshots -> pools ------------------------------------------------------------------


def test_apply_keeps_replicas_that_stay_with_their_inflight_counts() -> None:
    pools = Pools((), HealthConfig())
    apply(pools, [DiscoveredReplica(spec("http://a:1")), DiscoveredReplica(spec("http://b:1"))])
    a = pools.by_model["llama"][0]
    a.health.probe(True)
    lease = a.lease()
    changes = apply(pools, [DiscoveredReplica(spec("http://a:1")), DiscoveredReplica(spec("http://c:1"))])
    assert (changes.added, changes.removed) == (["http://c:1"], ["http://b:1"])
    assert pools.by_model["llama"][0] is a and a.inflight == 1 and a.health.up
    lease.release()
    assert a.inflight == 0


def test_apply_drains_known_replicas_and_never_adds_a_draining_one() -> None:
    pools = Pools((), HealthConfig())
    apply(pools, [DiscoveredReplica(spec("http://a:1"))])
    a = pools.by_model["llama"][0]
    a.health.probe(True)
    a.lease()
    changes = apply(
        pools,
        [DiscoveredReplica(spec("http://a:1"), draining=True), DiscoveredReplica(spec("http://new:1"), draining=True)],
    )
    assert changes.draining == ["http://a:1"] and changes.added == []
    assert [r.url for r in pools.all()] == ["http://a:1"]
    assert a.inflight == 1 and not a.health.admits(0.0)
    assert pools.eligible("llama", 0.0) == []
    apply(pools, [DiscoveredReplica(spec("http://a:1"))])  # ready again
    assert a.health.admits(0.0)


def test_apply_keeps_an_emptied_pool_and_moves_a_replica_that_changes_pool() -> None:
    pools = Pools((), HealthConfig())
    apply(pools, [DiscoveredReplica(spec("http://a:1", "llama"))])
    old = pools.by_model["llama"][0]
    apply(pools, [DiscoveredReplica(spec("http://a:1", "qwen"))])
    assert pools.by_model["llama"] == []
    assert "llama" in pools
    assert pools.by_model["qwen"][0] is not old


# --- the YAML replica file --------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "replicas.yaml"
    path.write_text(text)
    return path


def test_replica_file_loads_in_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
replicas:
  - url: http://10.0.0.5:8000/
    model: llama
    profile: a100
  - {url: "http://10.0.0.6:8000", model: llama, gpu_metrics_url: "http://10.0.0.6:9400/metrics"}
""",
    )
    specs = load_replicas_file(path)
    assert [s.url for s in specs] == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    assert specs[0].profile == "a100" and specs[1].gpu_metrics_url == "http://10.0.0.6:9400/metrics"


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (
            "replicas:\n  - url: http://a:1\n    model: m\n  - url: ftp://b:1\n    model: m\n",
            4,
            "replicas.1.url",
            "http://",
        ),
        ("replicas:\n  - url: http://a:1\n    model: m\n  - url: http://b:1\n", 4, "replicas.1.model", "required"),
        ("replicas:\n  - url: http://a:1\n    modle: m\n    model: m\n", 3, "replicas.0.modle", "not permitted"),
        ("replicas:\n  - url: http://a:1\n    model: [m]\n", 3, "replicas.0.model", "string"),
        ("replicas: []\n", 1, "replicas", "empty"),
        ("- url: http://a:1\n  model: m\n", 1, None, "mapping"),
        ("replicas:\n  - url: http://a:1\n   model: m\n", 3, None, "YAML"),
    ],
)
def test_replica_file_errors_name_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str | None, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ReplicasFileError) as info:
        load_replicas_file(path)
    error = info.value
    assert (error.path, error.line, error.field) == (path, line, field)
    assert str(error).startswith(f"{path}:{line}: ") and words in str(error)


def test_missing_replica_file(tmp_path: Path) -> None:
    with pytest.raises(ReplicasFileError, match="cannot read"):
        load_replicas_file(tmp_path / "nope.yaml")


# --- choosing the source -------------------------------------------------------------------------


def test_build_source_static_env_file_and_conflicts(tmp_path: Path) -> None:
    path = write(tmp_path, "replicas:\n  - {url: 'http://a:1', model: m}\n")
    from_env = build_source(RouterSettings(replicas=[spec("http://b:1", "m")]))
    from_file = build_source(RouterSettings(replicas_file=path))
    assert isinstance(from_env, StaticSource) and [s.url for s in from_env.specs] == ["http://b:1"]
    assert isinstance(from_file, StaticSource) and [s.url for s in from_file.specs] == ["http://a:1"]
    with pytest.raises(DiscoveryError, match="not both"):
        build_source(RouterSettings(replicas=[spec("http://b:1")], replicas_file=path))
    with pytest.raises(DiscoveryError, match="no replicas"):
        build_source(RouterSettings())
    with pytest.raises(DiscoveryError, match="takes no static replicas"):
        build_source(RouterSettings(discovery="kubernetes", replicas_file=path))


def test_kubernetes_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMPTEDGE_ROUTER_K8S_LABEL_SELECTOR", raising=False)
    with pytest.raises(DiscoveryError, match="PROMPTEDGE_ROUTER_K8S_LABEL_SELECTOR"):
        build_source(RouterSettings(discovery="kubernetes"))
    monkeypatch.setenv("PROMPTEDGE_ROUTER_K8S_LABEL_SELECTOR", "kubernetes.io/service-name=vllm")
    with pytest.raises(DiscoveryError, match="MODEL_LABEL"):
        build_source(RouterSettings(discovery="kubernetes"))


def test_serve_reports_a_bad_replica_file_without_a_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "replicas:\n  - url: http://a:1\n")
    monkeypatch.setenv("PROMPTEDGE_ROUTER_REPLICAS_FILE", str(path))
    monkeypatch.delenv("PROMPTEDGE_ROUTER_REPLICAS", raising=False)
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 2
    assert f"{path}:2: replicas.0.model: Field required" in result.output
    assert "Traceback" not in result.output


def test_in_cluster_without_a_service_account_token_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from router.discovery.kube import load_kube_settings, new_api_client

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    settings = load_kube_settings(label_selector="kubernetes.io/service-name=vllm", model="llama")
    with pytest.raises(DiscoveryError, match="in-cluster"):
        new_api_client(settings)
