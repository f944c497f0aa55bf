"""A test that runs a CLI in process (typer's CliRunner) leaves no logging behind: the CLI points
the root logger at the runner's stderr, which is closed when ``invoke`` returns, and every later
record (the fake Kubernetes API server's access lines, say) printed "--- Logging error ---
... ValueError: I/O operation on closed file" into the run. tests/conftest.py puts the logging
configuration back after each test. The two tests run in this order (file order)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from router.__main__ import cli


def test_a_cli_that_configures_logging_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "replicas.yaml"
    path.write_text("replicas:\n  - url: http://a:1\n")  # no model: the CLI logs the error and exits 2
    monkeypatch.setenv("PROMPTEDGE_ROUTER_REPLICAS_FILE", str(path))
    monkeypatch.delenv("PROMPTEDGE_ROUTER_REPLICAS", raising=False)
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 2 and "replicas.0.model" in result.output


def test_the_next_test_logs_without_a_logging_error(capsys: pytest.CaptureFixture[str]) -> None:
    closed = [h for h in logging.getLogger().handlers if getattr(getattr(h, "stream", None), "closed", False)]
    logging.getLogger("aiohttp.access").warning("a record after the CLI test")
    assert "Logging error" not in capsys.readouterr().err
    assert not closed, f"root handlers writing to a closed stream: {closed}"
