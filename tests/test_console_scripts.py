"""The console scripts in pyproject.toml start the same CLIs as ``python -m``, under their own
names, and each service's CLI has the ``settings`` listing its help points to."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SCRIPTS = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Call the script's entry point as the installed wrapper does (argv[0] = its name)."""
    module, func = SCRIPTS[name].split(":")
    code = f"import sys; sys.argv = {[name, *args]!r}; from {module} import {func}; {func}()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_three_services_have_scripts() -> None:
    assert sorted(SCRIPTS) == ["promptedge-forecaster", "promptedge-router", "promptedge-sim"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_is_its_cli_with_a_settings_command(name: str) -> None:
    done = run_script(name, "--help")
    assert done.returncode == 0, done.stderr
    assert f"Usage: {name}" in done.stdout and " settings " in done.stdout
    listing = run_script(name, "settings")
    assert listing.returncode == 0, listing.stderr
    package = name.removeprefix("promptedge-").upper()
    assert f"PROMPTEDGE_{package}_LOG_FORMAT" in listing.stdout
