"""The packages stay houses of rooms: no package root holds more modules than a screen shows, and each
sim room's ``__init__`` re-exports only names that exist (its ``__all__`` is its public surface)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import sim

MAX_MODULES = 12  # .py files in one folder, __init__ and __main__ included


def _packages() -> list[str]:
    names = ["sim"]
    for info in pkgutil.walk_packages(sim.__path__, prefix="sim."):
        if info.ispkg:
            names.append(info.name)
    return names


def test_no_package_root_holds_more_than_twelve_modules() -> None:
    """Every product package (router, cache, forecaster, sim, opskit) and each of its subpackages."""
    top = Path(sim.__file__).resolve().parents[1]
    wide = {}
    for package in ("router", "cache", "forecaster", "sim", "opskit"):
        root = top / package
        folders = [root, *(p.parent for p in root.rglob("__init__.py") if p.parent != root)]
        for folder in folders:
            if (n := len(list(folder.glob("*.py")))) > MAX_MODULES:
                wide[str(folder.relative_to(top))] = n
    assert wide == {}, f"split these into subpackages named after responsibilities: {wide}"


def test_each_sim_package_exports_only_names_it_has() -> None:
    missing = {}
    for name in _packages():
        package = importlib.import_module(name)
        absent = [n for n in getattr(package, "__all__", []) if not hasattr(package, n)]
        if absent:
            missing[name] = absent
    assert missing == {}
