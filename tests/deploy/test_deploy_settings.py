"""The settings the overlays hand to the router and the forecaster are their real settings:
every PROMPTEDGE_* name is one the code reads (pydantic-settings ignores unknown ones, so a
misspelt name would silently keep the default), and the rendered values load and say what
deploy/README.md promises (Kubernetes discovery in the Pod's namespace, KEDA mode, ...)."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from cache.settings import CacheSettings
from forecaster.actuate.settings import ActuatorSettings
from forecaster.settings import ForecasterSettings
from router.discovery_kube import KubeDiscoverySettings, load_kube_settings
from router.settings import RouterSettings
from tests.deploy.kustomize import needs_kustomize, one, rendered

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
    return env


def _base_name(generated: str) -> str:
    return generated.rsplit("-", 1)[0]  # kustomize appends -<10-character hash>


def unknown(env: dict[str, str], classes: tuple[type[BaseSettings], ...]) -> set[str]:
    """PROMPTEDGE_* names in ``env`` that none of ``classes`` reads."""
    known = set().union(*(env_names(c) for c in classes))
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


@needs_kustomize
def test_router_settings_are_real_and_load(monkeypatch: pytest.MonkeyPatch) -> None:
    env = container_env(rendered("edge-pop"), "promptedge-router")
    assert not unknown(env, ROUTER_SETTINGS)
    use_env(monkeypatch, env)
    settings = RouterSettings()
    assert (settings.discovery, settings.host, settings.port) == ("kubernetes", "0.0.0.0", 8000)
    assert settings.api_keys and not settings.admin_key  # placeholders: a key, DELETE /cache off
    kube = load_kube_settings()
    assert kube.namespace == NAMESPACE and kube.model_label == "promptedge.io/model"
    assert str(CacheSettings().onnx_cache_dir) == "/opt/promptedge/onnx"  # baked into the image


@needs_kustomize
@pytest.mark.parametrize(("overlay", "deployment", "mode"), [
    ("central", "promptedge-forecaster", "kubernetes"),
    ("central-keda", "promptedge-forecaster", "keda"),
    ("central-keda", "promptedge-desired", "keda"),
])
def test_forecaster_settings_are_real_and_load(monkeypatch: pytest.MonkeyPatch, overlay: str,
                                               deployment: str, mode: str) -> None:
    env = container_env(rendered(overlay), deployment)
    assert not unknown(env, FORECASTER_SETTINGS)
    use_env(monkeypatch, env)
    actuator = ActuatorSettings()
    assert (actuator.mode, actuator.namespace, actuator.deployment) == (mode, NAMESPACE, "vllm")
    assert ForecasterSettings().metrics_port == 9464


def test_a_misspelt_setting_is_caught() -> None:
    env = {"PROMPTEDGE_ROUTER_K8S_LABELSELECTOR": "app=vllm", "PROMPTEDGE_ROUTER_DISCOVERY": "kubernetes"}
    assert unknown(env, ROUTER_SETTINGS) == {"PROMPTEDGE_ROUTER_K8S_LABELSELECTOR"}
