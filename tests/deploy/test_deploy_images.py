"""deploy/router.Dockerfile (no Docker engine here, so read as text): CPU torch at the
Makefile's version, a pip list that covers every third-party import of router/ and cache/,
pins that are complete and agree with pyproject.toml, a non-root user, and the ONNX export
where the router Deployment looks for it."""

from __future__ import annotations

import re
import tomllib

import yaml
from packaging.requirements import Requirement

from tests.deploy.distributions import ROOT, closure, listed, normal, third_party_imports, uncovered

DOCKERFILE = ROOT / "deploy" / "router.Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "router-constraints.txt"


def pins() -> dict[str, str]:
    """deploy/router-constraints.txt as normal name -> version."""
    lines = [line for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")]
    return {normal(name): version for name, version in (line.split("==") for line in lines)}


def test_torch_is_the_cpu_build_at_the_makefiles_version() -> None:
    (torch,) = re.findall(r"pip install torch==(\S+) --index-url https://download.pytorch.org/whl/cpu\n",
                          DOCKERFILE.read_text())
    assert f"torch=={torch} --index-url https://download.pytorch.org/whl/cpu" in (ROOT / "Makefile").read_text()
    assert "torch" not in pins()  # from the CPU index only, never a CUDA wheel from PyPI


def test_the_image_installs_every_third_party_import_of_router_and_cache() -> None:
    installed = set(closure({**listed(DOCKERFILE), "torch": []}))
    missing = uncovered(third_party_imports("router", "cache"), installed)
    assert not missing, f"add to deploy/router.Dockerfile's pip install: {missing}"


def test_constraints_pin_everything_the_list_pulls_in() -> None:
    """Every distribution the listed ones install (as in this environment) is pinned, so the
    image does not resolve a newer one at build time; regenerate with the command in the file."""
    pulled = set(closure(listed(DOCKERFILE))) - {"torch"}
    assert pulled <= set(pins()), f"not pinned: {sorted(pulled - set(pins()))}"


def test_pins_satisfy_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        version = pins().get(normal(requirement.name))
        if version is not None:
            assert requirement.specifier.contains(version), f"{requirement.name}=={version} vs pyproject {text}"
    assert set(listed(DOCKERFILE)) <= {normal(Requirement(t).name) for t in project["dependencies"]}


def test_runs_as_non_root_with_the_onnx_export_where_the_deployment_reads_it() -> None:
    text = DOCKERFILE.read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert int(user[0]) != 0 and int(user[1]) != 0
    (export_dir,) = re.findall(r"load_encoder\(backend='onnx', cache_dir='([^']+)'\)", text)
    settings = yaml.safe_load((ROOT / "deploy/base/router/kustomization.yaml").read_text())
    (literals,) = [g["literals"] for g in settings["configMapGenerator"] if g["name"] == "promptedge-router-settings"]
    assert f"PROMPTEDGE_CACHE_ONNX_CACHE_DIR={export_dir}" in literals
    deployment = yaml.safe_load((ROOT / "deploy/base/router/deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user[0])
