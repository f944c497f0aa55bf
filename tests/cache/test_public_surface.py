"""The cache's public surface: the names cache/__init__.py exports in ``__all__`` are the only
way into the package from the router (import-linter forbids the router any cache submodule; this
test checks the names themselves), and each of them resolves."""

from __future__ import annotations

import ast
from pathlib import Path

import cache

ROOT = Path(__file__).resolve().parents[2]


def cache_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of ``cache`` or a cache submodule in one file,
    function-level imports included; ``names`` is empty for ``import cache...``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "cache" or node.module.startswith("cache."):
                found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend(
                (node.lineno, alias.name, [])
                for alias in node.names
                if alias.name == "cache" or alias.name.startswith("cache.")
            )
    return found


def test_every_exported_name_resolves_once() -> None:
    assert len(cache.__all__) == len(set(cache.__all__))
    missing = [name for name in cache.__all__ if not hasattr(cache, name)]
    assert missing == []


def test_no_exported_name_comes_from_the_training_tools() -> None:
    # serving code never imports cache.training (import-linter); the package's front door is
    # serving code too, but import-linter's contract cannot name the package's own __init__
    from_training = [
        name for name in cache.__all__ if getattr(getattr(cache, name), "__module__", "").startswith("cache.training")
    ]
    assert from_training == []


def test_the_router_imports_only_exported_names_from_cache() -> None:
    wrong = []
    for path in sorted((ROOT / "router").rglob("*.py")):
        for line, module, names in cache_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if module != "cache" or not names:
                wrong.append(f"{where}: imports {module} (only `from cache import <name>`)")
            wrong.extend(f"{where}: {name} is not in cache.__all__" for name in names if name not in cache.__all__)
    assert wrong == []


def test_the_check_sees_a_submodule_import(tmp_path: Path) -> None:
    # the router test above passes vacuously if cache_imports finds nothing: prove it finds
    # each kind of import it must refuse
    source = tmp_path / "x.py"
    source.write_text(
        "from cache import ResponseCache\nimport cache.keys\n"
        "def f():\n    from cache.semantic.index import ScopedIndex\n"
    )
    assert sorted(cache_imports(source)) == [
        (1, "cache", ["ResponseCache"]),
        (2, "cache.keys", []),
        (4, "cache.semantic.index", ["ScopedIndex"]),
    ]
