"""The images' Dockerfiles (no Docker engine here, so read as text): for the router, CPU torch
at the Makefile's version, a pip list that covers every third-party import of router/ and
cache/, the ONNX export where the router Deployment looks for it; for both images, pins that
are complete and agree with pyproject.toml, and a non-root user."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.deploy.distributions import IMAGES, ROOT, closure, listed, normal, third_party_imports, uncovered

DOCKERFILE = IMAGES["router"]


def pins(image: str = "router") -> dict[str, str]:
    """deploy/<image>-constraints.txt as normal name -> version."""
    text = (ROOT / "deploy" / f"{image}-constraints.txt").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {normal(name): version for name, version in (line.split("==") for line in lines)}


def test_torch_is_the_cpu_build_at_the_makefiles_version() -> None:
    (torch,) = re.findall(r"pip install torch==(\S+) --index-url https://download.pytorch.org/whl/cpu\n",
                          DOCKERFILE.read_text())
    assert f"torch=={torch} --index-url https://download.pytorch.org/whl/cpu" in (ROOT / "Makefile").read_text()
    assert "torch" not in pins()  # from the CPU index only, never a CUDA wheel from PyPI


def test_the_image_installs_every_third_party_import_of_router_and_cache() -> None:
    installed = set(closure({**listed(DOCKERFILE), "torch": []}))
    missing = uncovered(third_party_imports("router", "cache", "opskit"), installed)
    assert not missing, f"add to deploy/router.Dockerfile's pip install: {missing}"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_constraints_pin_everything_the_list_pulls_in(image: str) -> None:
    """Every distribution the listed ones install (as in this environment) is pinned, so the
    image does not resolve a newer one at build time; regenerate with the command in the file."""
    pulled = set(closure({n: e for n, e in listed(IMAGES[image]).items() if n != "prophet"})) - {"torch"}
    assert pulled <= set(pins(image)), f"not pinned: {sorted(pulled - set(pins(image)))}"
    assert "COPY deploy/" + f"{image}-constraints.txt /tmp/constraints.txt" in IMAGES[image].read_text()


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_pins_satisfy_pyproject(image: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        version = pins(image).get(normal(requirement.name))
        if version is not None:
            assert requirement.specifier.contains(version), f"{requirement.name}=={version} vs pyproject {text}"
    assert set(listed(IMAGES[image])) <= {normal(Requirement(t).name) for t in project["dependencies"]}


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_runs_as_a_non_root_user(image: str) -> None:
    (user,) = re.findall(r"^USER (\d+):(\d+)$", IMAGES[image].read_text(), re.M)
    assert int(user[0]) != 0 and int(user[1]) != 0


def test_prophet_is_optional_in_the_forecaster_image() -> None:
    text = IMAGES["forecaster"].read_text()
    assert "ARG WITH_PROPHET=0" in text and "prophet" not in pins("forecaster")


def test_the_onnx_export_is_where_the_deployment_reads_it_as_the_image_user() -> None:
    text = DOCKERFILE.read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert int(user[0]) != 0 and int(user[1]) != 0
    (export_dir,) = re.findall(r"load_encoder\(backend='onnx', cache_dir='([^']+)'\)", text)
    deployment = yaml.safe_load((ROOT / "deploy/base/router/deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PROMPTEDGE_CACHE_ONNX_CACHE_DIR"] == export_dir
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user[0])


def _containers(path: Path) -> list[dict]:
    found = []
    for doc in yaml.safe_load_all(path.read_text()):
        spec = (doc or {}).get("spec", {})
        pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec", {})
        found += pod.get("containers", [])
    return found


def test_every_manifest_runs_its_images_console_script_with_a_real_command() -> None:
    """Each promptedge/* container leaves the image's ENTRYPOINT (the console script, checked
    installed and started by tests/test_installed_package.py) in place and gives it a command
    that script has."""
    import typer

    from forecaster.cli import app as forecaster_cli
    from router.__main__ import cli as router_cli

    commands = {"router": set(typer.main.get_command(router_cli).commands),  # type: ignore[attr-defined]
                "forecaster": set(typer.main.get_command(forecaster_cli).commands)}  # type: ignore[attr-defined]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    seen = 0
    for path in [*sorted((ROOT / "deploy").glob("*.yaml")), *sorted((ROOT / "deploy").glob("*/*/*.yaml"))]:
        if path.name == "compose.yaml":
            continue
        for container in _containers(path):
            image = container.get("image", "").removeprefix("promptedge/").split(":")[0]
            if image not in IMAGES:
                continue
            seen += 1
            (entrypoint,) = re.findall(r'^ENTRYPOINT \["([^"]+)"\]$', IMAGES[image].read_text(), re.M)
            assert entrypoint in scripts and "command" not in container, f"{path.name}: {container['name']}"
            assert container["args"][0] in commands[image], f"{path.name}: {container['args']}"
    assert seen >= 6  # router; forecaster daemon x2, CronJob, /desired x2
