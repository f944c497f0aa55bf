"""``python -m <package> --help`` reads as user help: no docstring markup, no broken lines.

Typer shows a command's docstring as its help unless the command has ``help=``; in rich mode a
single line break inside a paragraph is kept, so a docstring wrapped at 100 columns came out as
ragged lines, and developer notes (``double backticks``, module paths) reached users.
"""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cache.cli import app as cache_app
from forecaster.cli import app as forecaster_app
from router.__main__ import cli as router_app
from sim.cli import app as sim_app

CLIS = {"forecaster": forecaster_app, "cache": cache_app, "router": router_app, "sim": sim_app}
MARKUP = ("``", ":class:", ":func:", ":meth:", ":param", "Args:", "Returns:", "Raises", "Yields:", "\f")


def commands(app: typer.Typer) -> dict[str, Any]:
    """Command name -> the (click-style) command typer builds for it."""
    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(CLIS))
def test_help_lists_the_commands_without_docstring_markup(name: str) -> None:
    app = CLIS[name]
    runner = CliRunner()
    top = runner.invoke(app, ["--help"], prog_name=f"python -m {name}")
    assert top.exit_code == 0, top.output
    for command in commands(app):
        assert f" {command} " in top.output
    for command in [[]] + [[c] for c in commands(app)]:
        result = runner.invoke(app, [*command, "--help"], prog_name=f"python -m {name}")
        assert result.exit_code == 0, result.output
        assert [m for m in MARKUP if m in result.output] == [], (command, result.output)


def paragraphs(text: str | None) -> list[str]:
    return (text or "").strip().split("\n\n")


@pytest.mark.parametrize("name", sorted(CLIS))
def test_help_paragraphs_are_not_broken_into_lines(name: str) -> None:
    app = CLIS[name]
    texts = {"": typer.main.get_command(app).help} | {c: cmd.help for c, cmd in commands(app).items()}
    broken = {c: p for c, text in texts.items() for p in paragraphs(text) if "\n" in p}
    assert broken == {}
