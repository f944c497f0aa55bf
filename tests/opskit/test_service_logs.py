"""Every line the services print on stderr is one JSON object with the standard keys, uvicorn's
own lines included, as real processes print them: the router serving a request through a
simulated replica, ``sim serve`` (which says where it listens; text on request), the
forecaster's ``run --once`` and the KEDA ``/desired`` endpoint as its manifest starts it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis
import yaml

from forecaster.actuate.publish import DesiredStore
from tests.router.router_process import free_port, start_router
from tests.sim.replica_process import start_replica

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
KEYS = {"timestamp", "level", "logger", "message", "request_id"}


def json_lines(text: str) -> list[dict]:
    """Each non-empty line parsed; fails on a line that is not a JSON object with KEYS."""
    lines = []
    for line in text.splitlines():
        if line.strip():
            parsed = json.loads(line)
            assert isinstance(parsed, dict) and KEYS <= set(parsed), line
            lines.append(parsed)
    return lines


def test_router_lines_are_json_with_uvicorn_and_access_lines(tmp_path: Path, redis_url: str) -> None:
    port = free_port()
    replica = start_replica(port, "--model", "m", "--time-scale", "50")
    try:
        router = start_router(
            tmp_path,
            {
                "PROMPTEDGE_REDIS_URL": redis_url,
                "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": f"http://127.0.0.1:{port}", "model": "m"}]),
            },
        )
        try:
            reply = httpx.post(
                router.url + "/v1/chat/completions",
                timeout=30,
                headers={"X-Request-Id": "req-logs-1"},
                json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert reply.status_code == 200
        finally:
            router.stop()
    finally:
        replica.terminate()
        replica.wait(timeout=30)
    lines = json_lines(router.log_text())
    assert any(line["logger"] == "uvicorn.error" and "Uvicorn running on" in line["message"] for line in lines)
    (access,) = [line for line in lines if line["logger"] == "router.access"]
    assert (access["status"], access["request_id"], access["message"]) == (200, "req-logs-1", "request")


def _sim_serve(port: int, env: dict[str, str]) -> str:
    """stderr of ``python -m sim serve`` from start until it has answered /health once and stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--port", str(port)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    return err


def test_sim_serve_says_where_it_listens_in_json_or_text() -> None:
    port = free_port()
    (line,) = json_lines(_sim_serve(port, {"PROMPTEDGE_SIM_LOG_FORMAT": "json"}))
    assert line["logger"] == "sim.serve" and line["level"] == "INFO"
    assert line["message"].endswith(f"listening on http://127.0.0.1:{port}")
    port = free_port()
    text = _sim_serve(port, {"PROMPTEDGE_SIM_LOG_FORMAT": "text"}).strip()
    assert text.endswith(
        f" INFO sim.serve: replica sim-llama-8b (profile a100, time scale 1) listening on http://127.0.0.1:{port}"
    ), text


def test_forecaster_run_once_logs_json_on_stderr_and_reports_on_stdout() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTEDGE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "forecaster", "run", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PROMPTEDGE_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    assert proc.returncode == 1  # held: no demand data
    lines = json_lines(proc.stderr)
    assert any(line["level"] == "WARNING" and line["message"].startswith("hold: source unavailable") for line in lines)
    assert proc.stdout.startswith("series ")  # the report stays plain text for the terminal


def test_the_keda_endpoint_as_deployed_logs_json(redis_url: str) -> None:
    """The command of components/keda's ``/desired`` Deployment, run as the Pod runs it: its
    start-up and access lines are JSON like every other service's (it ran under uvicorn's own
    CLI, whose lines are uvicorn's text format)."""
    (manifest,) = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy/components/keda/desired.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", (ROOT / "deploy/Dockerfile").read_text(), re.M)
    command = [*container.get("command", json.loads(entrypoint)), *container.get("args", [])]
    store = DesiredStore(redis.Redis.from_url(redis_url), "llm", "vllm")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTEDGE_")}
    env.update(
        {
            "PROMPTEDGE_ACTUATOR_MODE": "keda",
            "PROMPTEDGE_ACTUATOR_DEPLOYMENT": "vllm",
            "PROMPTEDGE_ACTUATOR_NAMESPACE": "llm",
            "PROMPTEDGE_REDIS_URL": redis_url,
            # the manifest's own address is 0.0.0.0:8090: a free local port here
            "PROMPTEDGE_ACTUATOR_PUBLISH_HOST": "127.0.0.1",
            "PROMPTEDGE_ACTUATOR_PUBLISH_PORT": str(port),
        }
    )
    for item in container.get("env", []):
        if "value" in item and item["name"] not in env and item["name"] != "PROMPTEDGE_SETTINGS_FILE":
            env[item["name"]] = item["value"]
    args = [a.replace("0.0.0.0", "127.0.0.1").replace("8090", str(port)) for a in command[1:]]
    if command[0] == "python":
        argv = [sys.executable, *args]
    else:  # a console script: its entry point, from this checkout (argv[0] its name, as the wrapper)
        module, func = SCRIPTS[command[0]].split(":")
        argv = [
            sys.executable,
            "-c",
            f"import sys; sys.argv[0] = {command[0]!r}; from {module} import {func}; {func}()",
            *args,
        ]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        answer = None
        while answer is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                # published just before each poll: Redis db 15 is shared by test runs that flush it
                store.publish(3, "test", datetime.now(UTC))
                answer = httpx.get(f"http://127.0.0.1:{port}/desired", timeout=1)
            except httpx.HTTPError:
                time.sleep(0.1)
        assert answer is not None and answer.status_code == 200, answer.text if answer else proc.poll()
        assert answer.json()["desiredReplicas"] == 3
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = json_lines(err)
    assert any(line["logger"] == "uvicorn.error" and "Uvicorn running on" in line["message"] for line in lines)
    assert any(line["logger"] == "uvicorn.access" and "/desired" in line["message"] for line in lines)
