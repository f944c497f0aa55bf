"""Console scripts that name the extra a missing dependency comes from.

``pip install 'promptedge[router]'`` also puts ``promptedge-forecaster`` and ``promptedge-sim``
on PATH; run without their extras, they would end in a ``ModuleNotFoundError`` traceback. This
imports the CLI first and turns a missing third-party module into one line that names the
extra (exit 2); a missing module of PromptEdge's own is a bug and is raised as it is.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

OWN_PACKAGES = frozenset({"router", "cache", "forecaster", "sim", "opskit"})


def console(target: str, script: str, extra: str) -> None:
    """Run ``target`` (``"module:function"``) as console script ``script``; a third-party module
    that cannot be imported exits 2 with ``pip install 'promptedge[extra]'``."""
    module_name, function = target.split(":")
    try:
        entry: Callable[[], object] = getattr(importlib.import_module(module_name), function)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing in OWN_PACKAGES:
            raise
        sys.stderr.write(
            f"{script} needs the '{extra}' extra ({missing} is not installed): pip install 'promptedge[{extra}]'\n"
        )
        raise SystemExit(2) from None
    entry()


def forecaster() -> None:
    """Entry point of ``promptedge-forecaster`` (the same CLI as ``python -m forecaster``)."""
    console("forecaster.cli:main", "promptedge-forecaster", "forecaster")


def sim() -> None:
    """Entry point of ``promptedge-sim`` (the same CLI as ``python -m sim``)."""
    console("sim.cli:run", "promptedge-sim", "sim")
