"""``python -m sim serve`` flags: the app it would serve, without binding a port; and what a run
writes first (its JSON report, before the text)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sim.cli import app


@pytest.fixture()
def served(monkeypatch: pytest.MonkeyPatch) -> list[FastAPI]:
    """The apps ``serve`` hands to its uvicorn server (which is not run)."""
    apps: list[FastAPI] = []
    monkeypatch.setattr("sim.replica.serving.DrainingServer.run", lambda server, *a, **kw: apps.append(server._app))
    return apps


def max_model_len(application: FastAPI) -> int:
    with TestClient(application) as client:
        return client.get("/v1/models").json()["data"][0]["max_model_len"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--profile", "t4"], 8192),  # default: the profile's, as before the flag existed
        (["--profile", "a100"], 32768),
        (["--profile", "t4", "--max-model-len", "4096"], 4096),
    ],
)
def test_serve_max_model_len_flag(served: list[FastAPI], args: list[str], expected: int) -> None:
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 0, result.output
    assert max_model_len(served[0]) == expected


def test_serve_refuses_a_max_model_len_beyond_the_kv_cache(served: list[FastAPI]) -> None:
    result = CliRunner().invoke(app, ["serve", "--profile", "t4", "--max-model-len", "60000"])
    assert result.exit_code == 2 and served == []
    text = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert "Invalid value for --max-model-len: max_model_len 60000" in text
    assert "KV cache of profile 't4' (55000 tokens)" in text


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_serve_refuses_a_time_scale_that_is_not_positive(served: list[FastAPI], bad: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--time-scale", bad])
    assert result.exit_code == 2 and served == []
    assert "time_scale: Input should be greater than 0" in result.output
    assert "Traceback" not in result.output


def test_serve_reads_the_time_scale_from_the_environment(
    served: list[FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMPTEDGE_SIM_TIME_SCALE", "30")
    assert CliRunner().invoke(app, ["serve"]).exit_code == 0
    with TestClient(served[0]) as client:
        client.get("/health")
        assert client.app.state.replica.engine.time_scale == 30


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--ip-base", "10.0.1"], {}, "must be three octets inside 127.0.0.0/8"),
        ([], {"PROMPTEDGE_SIM_NODE_TIME_SCALE": "0"}, "time_scale: Input should be greater than 0"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], {}, "no usable kubeconfig"),
    ],
)
def test_node_refuses_bad_settings_with_exit_2(
    args: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["node", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["demo", "replay"])
def test_the_json_report_is_written_before_the_text_is_printed(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Regression: the text was rendered first, and a render that raised lost the JSON report
    report = {"requests": 3, "forecast_plan": None}
    monkeypatch.setattr("sim.demo.run.run_demo", lambda cfg: report)
    monkeypatch.setattr("sim.client.workload.load_inputs", lambda trace, questions: ([], []))
    monkeypatch.setattr("sim.client.workload.build_plan", lambda *args: [])
    monkeypatch.setattr("sim.client.workload.replay_report", lambda plan, cfg: report)

    def render(report: dict[str, Any]) -> str:
        raise RuntimeError("render failed")

    # each command prints with its own renderer: the demo's adds the forecaster section
    monkeypatch.setattr("sim.demo.report.render" if command == "demo" else "sim.client.report.render", render)
    out = tmp_path / "report.json"
    args = ["--log-dir", str(tmp_path / "logs")] if command == "demo" else ["--target", "http://127.0.0.1:1"]
    result = CliRunner().invoke(app, [command, "--json", str(out), *args])
    assert isinstance(result.exception, RuntimeError)
    assert json.loads(out.read_text()) == report
