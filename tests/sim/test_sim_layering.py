"""The sim imports none of PromptEdge's packages (it stands in for the world around them)."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "sim"
FORBIDDEN = {"router", "cache", "forecaster"}


def test_sim_imports_no_promptedge_package() -> None:
    offenders = []
    for path in sorted(SIM.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert not offenders
    assert len(list(SIM.glob("*.py"))) > 10  # the glob found the package
