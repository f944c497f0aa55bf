"""deploy/compose.yaml (one machine, no cluster), checked by parsing: the services it promises,
ports that do not collide, every PROMPTEDGE_* name a real setting whose value loads, the
replicas' flags real ``sim serve`` options, and the router pointed at the replicas and Redis
by their service names. No Docker engine here: nothing is started."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from cache.settings import CacheSettings
from forecaster.actuate.settings import ActuatorSettings
from forecaster.settings import ForecasterSettings
from router.settings import RouterSettings
from sim.cli import app as sim_app
from sim.replica.settings import SimSettings
from tests.deploy.kustomize import DEPLOY
from tests.deploy.test_deploy_settings import FORECASTER_SETTINGS, ROUTER_SETTINGS, unknown, use_env

COMPOSE = DEPLOY / "compose.yaml"
SETTINGS = {
    "router": ROUTER_SETTINGS,
    "forecaster": FORECASTER_SETTINGS,
    "sim-a": (SimSettings,),
    "sim-b": (SimSettings,),
}
# What each service constructs at start (the router's Kubernetes discovery settings only in
# discovery=kubernetes, which compose does not use).
LOADED = {**SETTINGS, "router": (RouterSettings, CacheSettings)}


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_the_promised_services_are_there() -> None:
    assert set(services()) == {"redis", "sim-a", "sim-b", "router", "forecaster"}
    builds = {s["build"]["dockerfile"] for s in services().values() if "build" in s}
    assert builds == {"deploy/router.Dockerfile", "deploy/Dockerfile"}
    assert all((DEPLOY.parent / b).is_file() for b in builds)


def test_host_ports_do_not_collide() -> None:
    published = [p.rsplit(":", 2)[-2] for s in services().values() for p in s.get("ports", [])]
    assert len(published) == len(set(published)) == 5


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_setting_is_real_and_loads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: str(v) for k, v in services()[name]["environment"].items()}
    assert env and not unknown(env, SETTINGS[name])
    use_env(monkeypatch, env)
    for settings in LOADED[name]:
        settings()  # raises on a value the setting refuses


def test_replica_flags_are_sim_serve_options() -> None:
    serve = typer.main.get_command(sim_app).commands["serve"]  # type: ignore[attr-defined]
    for name in ("sim-a", "sim-b"):
        service = services()[name]
        assert service["entrypoint"] == ["python", "-m", "sim"]
        context = serve.make_context("serve", list(service["command"][1:]))  # click refuses unknown flags
        assert (context.params["host"], context.params["port"]) == ("0.0.0.0", 8001)
        assert service["ports"][0].endswith(":8001") and "../sim:/app/sim:ro" in service["volumes"]


def test_the_router_reaches_the_replicas_and_redis_by_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    router = services()["router"]
    use_env(monkeypatch, {k: str(v) for k, v in router["environment"].items()})
    settings = RouterSettings()
    replicas = {(urlsplit(r.url).hostname, urlsplit(r.url).port) for r in settings.replicas}
    assert replicas == {("sim-a", 8001), ("sim-b", 8001)}
    assert {r.model for r in settings.replicas} == {services()["sim-a"]["command"][6]}
    assert urlsplit(settings.redis_url).hostname == "redis"
    assert (settings.host, settings.port) == ("0.0.0.0", 8000) and router["ports"] == ["127.0.0.1:8000:8000"]
    assert set(router["depends_on"]) == {"redis", "sim-a", "sim-b"}


def test_the_forecaster_reads_the_routers_redis_and_only_logs_its_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: str(v) for k, v in services()["forecaster"]["environment"].items()}
    use_env(monkeypatch, env)
    assert ForecasterSettings().redis_url == RouterSettings().redis_url == "redis://redis:6379/0"
    assert ActuatorSettings().mode == "dry-run"
    assert (
        ForecasterSettings().model_name
        == json.loads(services()["router"]["environment"]["PROMPTEDGE_ROUTER_REPLICAS"])[0]["model"]
    )
