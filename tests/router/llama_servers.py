"""Real servers as subprocesses for the llama.cpp integration tests (test_llama_cpp.py,
test_openai_sdk_llama.py): llama.cpp's ``llama-server`` on the SmolLM2 GGUF from
``tests/tools/build_llama.py``, and ``python -m router serve`` in front of it, each on an
ephemeral port, configured as an operator would (command-line flags, PROMPTEDGE_* variables)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.tools.build_llama import llama_files

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("PROMPTEDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
EXACT_ENTRIES = "promptedge:cache:exact:*"


def spawn(
    cmd: list[str],
    log: Path,
    ready: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], re.Match[str]]:
    """Start ``cmd`` with its output in ``log``; wait for a line matching ``ready`` (fails the test
    with the log's tail if the process exits or stays silent for ``timeout_s``)."""
    out = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    out.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(ready, log.read_text(errors="replace"))
        if match:
            return proc, match
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    pytest.fail(f"{cmd[0]} did not print {ready!r} within {timeout_s} s (exit {proc.returncode}):\n{tail}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_llama(log: Path, alias: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """A llama-server on SmolLM2-135M-Instruct reporting the model as ``alias`` (``extra``: more
    flags, e.g. ``--embeddings``); (process, base URL). Skips with the build's reason when
    build_llama.py has not built the server here."""
    files = llama_files()
    reason = files.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    proc, match = spawn(
        [
            str(files.server),
            "-m",
            str(files.gguf),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--alias",
            alias,
            "--ctx-size",
            "2048",
            "--parallel",
            "2",
            "--threads",
            "1",
            "--no-webui",
            *extra,
        ],
        log,
        r"listening on (http://127\.0\.0\.1:\d+)",
        timeout_s=180,
    )
    return proc, match.group(1)


def start_router(log: Path, replicas: list[dict[str, Any]]) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m router serve`` in front of ``replicas`` (PROMPTEDGE_ROUTER_REPLICAS entries) on
    the test Redis; (process, base URL)."""
    # llama-server shares these two cores with the suite and answers /metrics between decode
    # steps; a longer scrape timeout and staleness bound keep its load signal from timing out.
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": REDIS_URL,
        "PROMPTEDGE_ROUTER_PORT": "0",
        "PROMPTEDGE_ROUTER_SCRAPE_TIMEOUT_S": "5",
        "PROMPTEDGE_ROUTER_STALE_AFTER_S": "6",
        "PROMPTEDGE_ROUTER_REPLICAS": json.dumps(replicas),
    }
    proc, match = spawn(
        [sys.executable, "-m", "router", "serve"],
        log,
        r"Uvicorn running on (http://127\.0\.0\.1:\d+)",
        timeout_s=120,
        env=env,
    )
    return proc, match.group(1)


def wait_entries(store: redis.Redis, n: int) -> None:
    """Wait until the exact cache holds ``n`` entries: the router stores an answer after it has
    gone out (off the client's path), so a repeat sent at once could still miss."""
    for _ in range(100):
        if len(store.keys(EXACT_ENTRIES)) >= n:
            return
        time.sleep(0.05)
    pytest.fail(f"the exact cache never held {n} entries: {store.keys(EXACT_ENTRIES)}")
