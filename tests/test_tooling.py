"""The static checks hold over the tree: ruff's lint and format check (the whole tree) and mypy
strict on the pure cores (the modules of the import-linter contract "pure cores do no I/O").
Their settings live in pyproject.toml under [tool.ruff] and [tool.mypy]; the tools come with the
``test`` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the tools are installed next to this interpreter


def _run(tool: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    assert exe.exists(), f"{tool} is not installed next to {sys.executable}: pip install -e '.[test]'"
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_ruff_lint_finds_nothing() -> None:
    proc = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".", timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_would_change_nothing() -> None:
    proc = _run("ruff", "format", "--check", "--no-cache", ".", timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_on_the_pure_cores_finds_nothing() -> None:
    # No arguments: the files, strictness and per-library settings all come from pyproject.toml.
    proc = _run("mypy", "--config-file", str(ROOT / "pyproject.toml"), timeout_s=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
