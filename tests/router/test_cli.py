"""``python -m router serve`` as a user starts it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

REDIS_URL = os.environ.get("PROMPTEDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def test_port_zero_flag_binds_an_ephemeral_port_not_the_default(tmp_path: Path) -> None:
    # Regression: ``--port 0`` fell back to the setting (8000) because 0 is falsy.
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": REDIS_URL,
        "PROMPTEDGE_ROUTER_PORT": "8000",
        "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": "http://127.0.0.1:9", "model": "m"}]),
    }
    log = tmp_path / "router.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "router", "serve", "--port", "0"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 120
        match = None
        while match is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", log.read_text())
        assert match is not None, log.read_text()
        port = int(match.group(1))
        assert port not in (0, 8000)
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert "status" in health.json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_redis_url_with_a_bad_option_is_a_start_up_error_not_a_traceback() -> None:
    # Regression (attack round, not fixed then): ``?socket_timeout=abc`` passed the settings check and
    # redis-py refused it only when the lifespan built the client: a traceback in the log, exit 3.
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/15?socket_timeout=abc",
        "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": "http://127.0.0.1:9", "model": "m"}]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", "0"], env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "PROMPTEDGE_REDIS_URL" in output and "socket_timeout" in output
    assert "Traceback" not in output and "hunter2" not in output


def test_a_bad_cache_setting_is_a_start_up_error_before_the_port_is_bound() -> None:
    # Regression (attack round): PROMPTEDGE_CACHE_THRESHOLD=2 was read only in the lifespan; with
    # --workers 2 the port accepted connections for about 30 s with no worker behind it, then exit 3.
    env = {
        **os.environ,
        "PROMPTEDGE_CACHE_THRESHOLD": "2",
        "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": "http://127.0.0.1:9", "model": "m"}]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", "0", "--workers", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "PROMPTEDGE_CACHE_THRESHOLD" in output and "Traceback" not in output


BAD_START = [  # (environment, the setting the error names): each found before the port is bound
    ({"PROMPTEDGE_CACHE_THRESHOLD": "2"}, "PROMPTEDGE_CACHE_THRESHOLD"),  # RouterSettings read, then the cache's
    ({"PROMPTEDGE_ROUTER_WORKERS": "0"}, "PROMPTEDGE_ROUTER_WORKERS"),  # RouterSettings itself fails
    ({"PROMPTEDGE_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/15?socket_timeout=abc"}, "PROMPTEDGE_REDIS_URL"),
]


def start_up_error(env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": "http://127.0.0.1:9", "model": "m"}]),
            **env,
        },
    )
    return done.returncode, done.stdout + done.stderr


def test_start_up_errors_are_log_lines_in_the_routers_json_format() -> None:
    # Regression: the router logs one JSON object per line by default, but its start-up errors were
    # plain "error: ..." lines, which a log pipeline parsing JSON dropped or could not parse.
    for env, name in BAD_START:
        code, output = start_up_error(env)
        assert code == 2, output
        lines = [json.loads(line) for line in output.splitlines() if line.strip()]  # no other line
        assert lines and all(line["level"] == "ERROR" and line["logger"] == "router.server" for line in lines)
        assert any(name in line["message"] for line in lines), lines
        assert "hunter2" not in output and "Traceback" not in output


def test_start_up_errors_follow_log_format_text() -> None:
    for env, name in BAD_START:
        code, output = start_up_error({**env, "PROMPTEDGE_ROUTER_LOG_FORMAT": "text"})
        assert code == 2, output
        assert re.fullmatch(r"\S+ ERROR router\.server: cannot start: .*", output.strip().splitlines()[0]), output
        assert name in output and "hunter2" not in output


def test_a_rule_across_settings_names_its_settings_not_an_empty_one() -> None:
    # attack round (cosmetic): "setting PROMPTEDGE_CACHE_ (): Value error, ..." for a rule that
    # ties two settings together (a model validator has no field of its own)
    code, output = start_up_error({"PROMPTEDGE_CACHE_SHADOW_RATE": "0.1"})
    assert code == 2, output
    assert "PROMPTEDGE_CACHE_ ()" not in output
    assert "PROMPTEDGE_CACHE_SHADOW_RATE needs PROMPTEDGE_CACHE_ERROR_BOUND" in output
