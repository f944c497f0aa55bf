"""The settings the overlays hand to the router and the forecaster are their real settings:
each Deployment mounts its ConfigMap's ``settings.yaml`` where ``PROMPTEDGE_SETTINGS_FILE``
points, and that file is the overlay's ``settings.yaml`` as the user wrote it; the real loader
(opskit's pydantic-settings YAML source, which refuses a key no setting has) reads the rendered
file together with the Pod's environment; every PROMPTEDGE_* name in that environment is one the
code reads (pydantic-settings ignores unknown ones, so a misspelt name would silently keep the
default), and no key of the file is one the environment overrides (it would silently lose);
the loaded values say what deploy/README.md promises (Kubernetes discovery in the Pod's
namespace, KEDA mode, ...)."""

from __future__ import annotations

import base64
import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings, SettingsError

from cache.settings import CacheSettings
from forecaster.actuate.settings import ActuatorSettings
from forecaster.settings import ForecasterSettings
from opskit import SETTINGS_FILE_ENV, env_name, section_name
from router.discovery.kube import KubeDiscoverySettings, load_kube_settings
from router.settings import RouterSettings
from tests.deploy.kustomize import DEPLOY, needs_kustomize, one, rendered

ROUTER_SETTINGS = (RouterSettings, KubeDiscoverySettings, CacheSettings)
FORECASTER_SETTINGS = (ForecasterSettings, ActuatorSettings)
NAMESPACE = "llm"


def env_names(settings: type[BaseSettings]) -> set[str]:
    """Every environment variable ``settings`` reads: prefix + field name, or its aliases."""
    prefix = settings.model_config.get("env_prefix", "")
    names = set()
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def container_env(objects: tuple[dict[str, Any], ...], deployment: str) -> dict[str, str]:
    """The environment of the Deployment's first container as the kubelet builds it: envFrom
    (ConfigMaps, Secrets) then env, with fieldRef metadata.namespace resolved."""
    container = one(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one(objects, "ConfigMap", _base_name(source["configMapRef"]["name"]))["data"])
        else:
            data = one(objects, "Secret", _base_name(source["secretRef"]["name"]))["data"]
            env.update({k: base64.b64decode(v).decode() for k, v in data.items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = NAMESPACE
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            env[item["name"]] = one(objects, "ConfigMap", _base_name(ref["name"]))["data"][ref["key"]]
    return env


def mounted_settings(objects: tuple[dict[str, Any], ...], deployment: str) -> tuple[dict[str, Any], str]:
    """(the volumeMount, the file's text) that the Deployment's first container reads at
    ``PROMPTEDGE_SETTINGS_FILE``: a configMap volume item, resolved to the rendered ConfigMap's
    data; fails when the variable is unset or no mounted ConfigMap key lands on that path."""
    spec = one(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    container = spec["containers"][0]
    path = PurePosixPath(container_env(objects, deployment)[SETTINGS_FILE_ENV])
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        configmap = volumes[mount["name"]].get("configMap")
        if configmap is None or not path.is_relative_to(mount["mountPath"]):
            continue
        relative = str(path.relative_to(mount["mountPath"]))
        data = one(objects, "ConfigMap", _base_name(configmap["name"]))["data"]
        keys = {i["path"]: i["key"] for i in configmap.get("items", [])} or {k: k for k in data}
        if relative in keys:
            return mount, data[keys[relative]]
    raise AssertionError(f"{deployment}: no ConfigMap key mounted at {SETTINGS_FILE_ENV}={path}")


def use_pod_settings(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    objects: tuple[dict[str, Any], ...],
    deployment: str,
    text: str | None = None,
) -> dict[str, str]:
    """The Pod's settings in this process: its environment, with PROMPTEDGE_SETTINGS_FILE
    pointing at a copy of the mounted file (or ``text``) in ``tmp_path``. Returns the env."""
    env = container_env(objects, deployment)
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(mounted_settings(objects, deployment)[1] if text is None else text)
    use_env(monkeypatch, {**env, SETTINGS_FILE_ENV: str(settings_file)})
    return env


def _base_name(generated: str) -> str:
    return generated.rsplit("-", 1)[0]  # kustomize appends -<10-character hash>


def unknown(env: dict[str, str], classes: tuple[type[BaseSettings], ...]) -> set[str]:
    """PROMPTEDGE_* names in ``env`` that none of ``classes`` reads (nor the settings file's)."""
    known = set().union(*(env_names(c) for c in classes)) | {SETTINGS_FILE_ENV}
    return {name for name in env if name.startswith("PROMPTEDGE_") and name not in known}


def test_env_names_follow_prefix_and_aliases() -> None:
    names = env_names(RouterSettings)
    assert {"PROMPTEDGE_REDIS_URL", "PROMPTEDGE_ROUTER_ADMIN_KEY"} <= names
    assert "PROMPTEDGE_ROUTER_REDIS_URL" not in names  # an alias replaces the prefixed name


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Only ``env``'s PROMPTEDGE_* settings in the process environment."""
    for name in [n for n in os.environ if n.startswith("PROMPTEDGE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


# (overlay, Deployment, the overlay file its settings file must be, the settings classes it loads)
PODS = [
    ("edge-pop", "promptedge-router", "edge-pop/settings.yaml", ROUTER_SETTINGS),
    ("central", "promptedge-forecaster", "central/settings.yaml", FORECASTER_SETTINGS),
    ("central-keda", "promptedge-forecaster", "central/settings.yaml", FORECASTER_SETTINGS),
    ("central-keda", "promptedge-desired", "central/settings.yaml", FORECASTER_SETTINGS),
    ("vllm-advisory", "promptedge-forecaster", "vllm-advisory/settings.yaml", FORECASTER_SETTINGS),
]


@needs_kustomize
@pytest.mark.parametrize(("overlay", "deployment", "source", "classes"), PODS, ids=[f"{p[0]}-{p[1]}" for p in PODS])
def test_the_pod_reads_the_overlays_settings_file(
    overlay: str, deployment: str, source: str, classes: tuple[type[BaseSettings], ...]
) -> None:
    """What the user edits (the overlay's settings.yaml) is, byte for byte, the file the Pod's
    PROMPTEDGE_SETTINGS_FILE names, mounted read-only; the environment sets no PROMPTEDGE_*
    name the code ignores and none that shadows a key of the file."""
    objects = rendered(overlay)
    mount, text = mounted_settings(objects, deployment)
    assert text == (DEPLOY / "overlays" / source).read_text()
    assert mount.get("readOnly") is True
    env = container_env(objects, deployment)
    assert not unknown(env, classes)
    document = yaml.safe_load(text)
    sections = {section_name(c): c for c in classes}
    assert set(document) <= set(sections), (
        f"sections no settings class of {deployment} reads: {set(document) - set(sections)}"
    )
    shadowed = {
        f"{s}.{key}"
        for s, values in document.items()
        for key in values
        if env_name(sections[s], key, sections[s].model_fields[key]) in env
    }
    assert not shadowed, f"the Pod's environment overrides these keys of {source}: {shadowed}"


@needs_kustomize
def test_router_settings_load_from_the_mounted_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_pod_settings(monkeypatch, tmp_path, rendered("edge-pop"), "promptedge-router")
    settings = RouterSettings()
    assert (settings.discovery, settings.host, settings.port) == ("kubernetes", "0.0.0.0", 8000)
    assert settings.redis_url == "redis://promptedge-redis:6379/0"
    assert settings.api_keys and not settings.admin_key  # placeholders: a key, DELETE /cache off
    kube = load_kube_settings()
    assert kube.namespace == NAMESPACE and kube.model_label == "promptedge.io/model"
    assert (kube.label_selector, kube.port_name) == ("kubernetes.io/service-name=vllm", "http")
    cache = CacheSettings()
    assert str(cache.onnx_cache_dir) == "/opt/promptedge/onnx"  # baked into the image
    assert (cache.ttl_s, cache.semantic_enabled) == (3600, True)  # from the overlay's file


@needs_kustomize
@pytest.mark.parametrize(
    ("overlay", "deployment", "mode"),
    [
        ("central", "promptedge-forecaster", "kubernetes"),
        ("central-keda", "promptedge-forecaster", "keda"),
        ("central-keda", "promptedge-desired", "keda"),
    ],
)
def test_forecaster_settings_load_from_the_mounted_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, overlay: str, deployment: str, mode: str
) -> None:
    use_pod_settings(monkeypatch, tmp_path, rendered(overlay), deployment)
    actuator = ActuatorSettings()
    assert (actuator.mode, actuator.namespace, actuator.deployment) == (mode, NAMESPACE, "vllm")
    forecaster = ForecasterSettings()
    assert forecaster.metrics_port == 9464
    assert (forecaster.model_name, forecaster.capacity_per_replica, forecaster.max_replicas) == (
        "llama-3.1-8b",
        2.0,
        10,
    )
    # one Redis for both: the daemon publishes where the KEDA endpoint reads (a YAML anchor)
    assert actuator.redis_url == forecaster.redis_url == "redis://promptedge-redis:6379/0"
    if deployment == "promptedge-desired":
        assert (actuator.publish_host, actuator.publish_port) == ("0.0.0.0", 8090)


@needs_kustomize
def test_the_loader_really_reads_the_mounted_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Not vacuous: the same rendered file with one key misspelt stops the router's settings."""
    objects = rendered("edge-pop")
    text = mounted_settings(objects, "promptedge-router")[1].replace("ttl_s:", "ttl_secs:")
    use_pod_settings(monkeypatch, tmp_path, objects, "promptedge-router", text)
    with pytest.raises(SettingsError, match=r"section 'cache' has unknown settings \['ttl_secs'\]"):
        CacheSettings()


def test_a_misspelt_setting_is_caught() -> None:
    env = {"PROMPTEDGE_ROUTER_K8S_LABELSELECTOR": "app=vllm", "PROMPTEDGE_ROUTER_DISCOVERY": "kubernetes"}
    assert unknown(env, ROUTER_SETTINGS) == {"PROMPTEDGE_ROUTER_K8S_LABELSELECTOR"}


@needs_kustomize
def test_the_central_overlays_commented_pops_load_when_uncommented(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The several-POPs example in overlays/central/settings.yaml is a working setting: with its
    ``# `` removed the forecaster Pod reads both POPs, and redis_url stays where the state is."""
    objects = rendered("central")
    text = mounted_settings(objects, "promptedge-forecaster")[1]
    lines = text.splitlines()
    start = lines.index("  # pops:")
    example = [line for line in lines[start:] if line.startswith("  #   ")]
    assert len(example) == 2
    uncommented = text.replace("  # pops:", "  pops:")
    for line in example:
        uncommented = uncommented.replace(line, "    " + line.removeprefix("  #   "))
    use_pod_settings(monkeypatch, tmp_path, objects, "promptedge-forecaster", uncommented)
    forecaster = ForecasterSettings()
    assert list(forecaster.pops) == ["paris", "nyc"]
    assert forecaster.redis_url == "redis://promptedge-redis:6379/0"
