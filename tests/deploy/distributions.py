"""Which distributions an image installs, and whether they cover a package's imports.

Shared by the image tests (tests/deploy/test_deploy_images.py, the forecaster's in
tests/forecaster/test_actuate_deploy.py). Reads the installed distributions' metadata, so it
follows the environment ``make install`` builds. Run as a module to print the router image's
constraints (``python -m tests.deploy.distributions router > deploy/router-constraints.txt``,
the same with ``forecaster``).
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# deploy/router.Dockerfile's pip install line: name[extras]>=version, quoted.
_LISTED = re.compile(r'"([A-Za-z0-9_.\-]+)(\[[a-z,]+\])?[<>=!~]')


def normal(name: str) -> str:
    """A distribution name in PEP 503 normal form (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(dockerfile: Path) -> dict[str, list[str]]:
    """The quoted requirements of a Dockerfile's ``pip install``: normal name -> extras."""
    return {normal(name): [e for e in extras.strip("[]").split(",") if e]
            for name, extras in _LISTED.findall(dockerfile.read_text())}


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
    return {module: distributions.get(module, [module]) for module in sorted(modules)
            if not any(normal(d) in installed for d in distributions.get(module, [module]))}


IMAGES = {"router": ROOT / "deploy" / "router.Dockerfile", "forecaster": ROOT / "deploy" / "Dockerfile"}


def constraints(image: str) -> str:
    """deploy/<image>-constraints.txt for the environment this runs in: pins of what the image's
    pip list installs (torch excluded: the router image takes it from PyTorch's CPU index;
    prophet excluded: an optional build step without constraints)."""
    pins = closure({n: e for n, e in listed(IMAGES[image]).items() if n != "prophet"})
    lines = [f"{name}=={version}" for name, version in sorted(pins.items()) if name != "torch"]
    return (f"# Pins of {IMAGES[image].relative_to(ROOT)}'s pip install and all it pulls in (Linux, Python 3.11).\n"
            f"# Regenerate: python -m tests.deploy.distributions {image} > deploy/{image}-constraints.txt\n"
            + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.stdout.write(constraints(sys.argv[1]))
