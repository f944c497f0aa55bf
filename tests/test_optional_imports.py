"""The router and the forecaster start without the heavy libraries their installs leave out
(pyproject.toml's extras: ``router`` has no torch, ``forecaster`` no matplotlib or prophet).

Each check runs in a fresh interpreter (a module imported by an earlier test would hide an
import), imports the process's entry point as its console script does, builds the router's app,
and then looks at ``sys.modules``. A second check makes those libraries unimportable, as in an
install without them, and the entry points must still import and answer ``--help``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sentence_transformers", "transformers", "prophet", "matplotlib", "statsmodels", "sklearn")
ENTRY_POINTS = {
    # router: the console script's module and the app it serves
    "router": "import router.__main__\nfrom router.app import create_app\nfrom router.settings import RouterSettings\n"
    "create_app(RouterSettings())",
    "forecaster": "import forecaster.cli",
}
# Installed here (make install) but absent from the image: importing them fails, as there.
_BLOCKER = """
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PROMPTEDGE_REDIS_URL", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


@pytest.mark.parametrize("process", sorted(ENTRY_POINTS))
def test_the_entry_point_imports_none_of_the_heavy_libraries(process: str) -> None:
    code = ENTRY_POINTS[process] + (
        f"\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize("script", ["router.__main__:run", "forecaster.cli:main"])
def test_the_console_script_answers_help_without_them(script: str) -> None:
    module, func = script.split(":")
    code = _BLOCKER.format(blocked=set(HEAVY)) + textwrap.dedent(f"""
        sys.argv = ["promptedge", "--help"]
        from {module} import {func}
        try:
            {func}()
        except SystemExit as exc:
            assert not exc.code, exc.code
        """)
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Usage:" in done.stdout


@pytest.mark.parametrize(("script", "blocked", "extra"), [("opskit._entry:forecaster", "scipy", "forecaster")])
def test_a_script_without_its_extra_says_what_to_install(script: str, blocked: str, extra: str) -> None:
    """A ``promptedge[router]`` install also puts promptedge-forecaster on PATH: run there, it
    names the extra to install instead of ending in a traceback (a new user's report:
    ``ModuleNotFoundError: No module named 'scipy'``)."""
    module, func = script.split(":")
    code = _BLOCKER.format(blocked={blocked}) + textwrap.dedent(f"""
        sys.argv = ["promptedge", "--help"]
        from {module} import {func}
        {func}()
        """)
    done = run_python(code)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"pip install 'promptedge[{extra}]'" in done.stderr and blocked in done.stderr, done.stderr
