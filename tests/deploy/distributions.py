"""Which distributions an image installs, and whether they cover a package's imports.

Shared by the image tests (tests/deploy/test_deploy_images.py, the forecaster's in
tests/forecaster/test_actuate_deploy.py). An image installs the package with extras
(``pip install ".[router]"``); what that pulls in is read from pyproject.toml and then from the
installed distributions' metadata, so it follows the environment ``make install`` builds.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# an image's install step: pip install ".[extra,extra]"
_EXTRAS = re.compile(r'pip install "\.\[([a-z,-]+)\]"')


def normal(name: str) -> str:
    """A distribution name in PEP 503 normal form (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_extras(dockerfile: Path) -> list[str]:
    """The extras the image's last stage installs the package with (its default build: the last
    ``pip install ".[...]"`` of the file)."""
    last_stage = dockerfile.read_text().split("\nFROM ")[-1]
    found = _EXTRAS.findall(last_stage)
    assert found, f'{dockerfile.name}: no pip install ".[extras]" in its last stage'
    return found[-1].split(",")


def requirements(*extras: str) -> dict[str, list[str]]:
    """pyproject.toml's base dependencies plus those of ``extras`` (an extra naming the project
    itself, ``promptedge[forecaster]``, expanded): normal name -> the extras it is asked with."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional, own = project["optional-dependencies"], normal(project["name"])
    found: dict[str, list[str]] = {}
    todo: list[str | None] = [None, *extras]
    seen: set[str | None] = set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["dependencies"] if extra is None else optional[extra]:
            requirement = Requirement(text)
            name = normal(requirement.name)
            if name == own:
                todo += sorted(requirement.extras)
            else:
                found[name] = sorted(set(found.get(name, [])) | requirement.extras)
    return found


def closure(roots: dict[str, list[str]]) -> dict[str, str]:
    """The installed distributions ``roots`` (name -> extras) pull in on this platform, each
    with its installed version; a requirement that is not installed is left out."""
    found: dict[str, str] = {}
    todo = list(roots.items())
    done: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, extras = todo.pop()
        name = normal(name)
        if (name, tuple(extras)) in done:
            continue
        done.add((name, tuple(extras)))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            if _applies(requirement, extras):
                todo.append((requirement.name, sorted(requirement.extras)))
    return found


def _applies(requirement: Requirement, extras: list[str]) -> bool:
    if requirement.marker is None:
        return True
    environment = dict(default_environment())
    return any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in ["", *extras])


def third_party_imports(*packages: str) -> set[str]:
    """Top-level modules the given packages of this repository import, less the standard
    library and the repository's own packages."""
    imported: set[str] = set()
    for package in packages:
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    return imported - set(sys.stdlib_module_names) - {"router", "cache", "forecaster", "sim", "opskit", "__future__"}


def uncovered(modules: set[str], installed: set[str]) -> dict[str, list[str]]:
    """The modules of ``modules`` that no distribution in ``installed`` (normal names) provides,
    each with the distributions that would."""
    distributions = metadata.packages_distributions()
    return {
        module: distributions.get(module, [module])
        for module in sorted(modules)
        if not any(normal(d) in installed for d in distributions.get(module, [module]))
    }


IMAGES = {"router": ROOT / "deploy" / "router.Dockerfile", "forecaster": ROOT / "deploy" / "Dockerfile"}
