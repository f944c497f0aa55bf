"""Each package's public surface is its ``__init__``'s ``__all__`` (cache's has its own test,
tests/cache/test_public_surface.py): every exported name resolves, and what one product package
imports of another is on that surface. Each package also has one error root."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("router", "cache", "forecaster", "sim", "opskit")
# modules besides a package's __init__ that are public on purpose, each with its own __all__
SURFACES = ("router", "forecaster", "forecaster.actuate", "sim", "opskit", "opskit.redis_client")


@pytest.mark.parametrize("name", SURFACES)
def test_every_exported_name_resolves_once(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    assert [n for n in exported if not hasattr(module, n)] == []


def imports_of(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import in one file, function-level ones
    included; ``names`` is empty for ``import x.y``."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
    return found


def test_product_packages_import_each_other_only_through_the_surfaces() -> None:
    surfaces = {name: set(importlib.import_module(name).__all__) for name in SURFACES}
    wrong = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, module, names in imports_of(path):
                top = module.partition(".")[0]
                if top not in PRODUCT or top == package or top == "cache":  # cache: its own test
                    continue
                where = f"{path.relative_to(ROOT)}:{line}"
                if module not in surfaces or not names:
                    wrong.append(f"{where}: imports {module} (only `from <surface> import <name>`)")
                    continue
                wrong.extend(f"{where}: {n} is not in {module}.__all__" for n in names if n not in surfaces[module])
    assert wrong == []


def test_the_check_sees_what_it_must_refuse(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        "from opskit import configure\nimport opskit._logfmt\ndef f():\n    from opskit._settings import env_name\n"
    )
    assert sorted(imports_of(source)) == [
        (1, "opskit", ["configure"]),
        (2, "opskit._logfmt", []),
        (4, "opskit._settings", ["env_name"]),
    ]


def error_classes(package: str) -> list[type[BaseException]]:
    """The public exception classes defined in ``package``'s modules (a leading ``_`` marks
    one that never leaves its module)."""
    found = []
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rpartition(".")[2].startswith("__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                found.append(value)
    return found


@pytest.mark.parametrize(
    ("package", "root"), [("router", "router.errors.RouterError"), ("forecaster", "forecaster.errors.ForecasterError")]
)
def test_one_error_root_per_package(package: str, root: str) -> None:
    module, _, name = root.rpartition(".")
    base = getattr(importlib.import_module(module), name)
    classes = error_classes(package)
    assert len(classes) > 5  # the walk found the package's errors
    assert [c.__qualname__ for c in classes if not issubclass(c, base)] == []


def test_the_roots_keep_the_built_in_bases_handlers_catch() -> None:
    from router.discovery.kube import NoServedVersion
    from router.errors import RedisUnavailable, RouterError
    from router.observe.tracing import TracingError

    assert issubclass(NoServedVersion, ValueError) and issubclass(TracingError, RuntimeError)
    assert issubclass(RedisUnavailable, RouterError)
