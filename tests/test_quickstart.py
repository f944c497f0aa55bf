"""The README's "In front of your own server" commands, run as written against a sim replica.

The shell block after the ``<!-- quickstart`` marker in README.md is read from the file, so an
edit there is what this test runs: each line goes to ``bash -c`` unchanged, except that its two
ports (8001 for the server, 8000 for the router) become free ports (tests run side by side), and
that a line ending in ``&`` is started in its own session, which the test ends with SIGTERM (then
SIGKILL) when it is done. Then the Python block after ``<!-- quickstart-sdk`` (the OpenAI SDK)
runs against the same router. ``python`` on the PATH is the interpreter running the tests, and
the router's Redis is the test database (``PROMPTEDGE_REDIS_URL``, which the README leaves to
the environment).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the bound of each foreground command: the first request waits for the router's start-up
COMMAND_TIMEOUT_S = 150


def fenced_block(text: str, marker: str) -> str:
    """The body of the first fenced code block after the line that starts with ``marker``.
    Raises AssertionError when there is none."""
    match = re.search(re.escape(marker) + r"[^\n]*\n```[a-z]*\n(.*?)\n```", text, re.S)
    assert match, f"README.md has no fenced block after {marker!r}"
    return match.group(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def shell_env(redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PROMPTEDGE_REDIS_URL"] = redis_url
    env.pop("PROMPTEDGE_SETTINGS_FILE", None)
    env.pop("PROMPTEDGE_ROUTER_REPLICAS", None)
    return env


@pytest.fixture()
def background(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the block starts with ``&``: each in its own session, ended at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in started:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def test_readme_quickstart_serves_a_request_and_reads_stats(shell_env: dict[str, str], tmp_path: Path,
                                                            background: list[subprocess.Popen[bytes]]) -> None:
    text = README.read_text()
    commands = [line for line in fenced_block(text, "<!-- quickstart:").splitlines() if line.strip()]
    assert 1 <= len(commands) <= 5, "the quick start promises at most five commands"
    server_port, router_port = _free_port(), _free_port()
    outputs = []
    for n, command in enumerate(commands):
        command = command.replace("8001", str(server_port)).replace("8000", str(router_port))
        if command.rstrip().endswith("&"):
            log = open(tmp_path / f"background-{n}.log", "wb")
            background.append(subprocess.Popen(["bash", "-c", command.rstrip().removesuffix("&")], env=shell_env,
                                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True))
            continue
        done = subprocess.run(["bash", "-c", command], env=shell_env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
        logs = "".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("background-*.log"))
        assert done.returncode == 0, f"{command!r} exited {done.returncode}: {done.stderr}\n{logs}"
        outputs.append(done.stdout)

    first, repeat, stats = outputs
    answer = json.loads(first)
    assert answer["choices"][0]["message"]["content"], answer
    headers, _, body = repeat.replace("\r\n", "\n").partition("\n\n")
    assert re.search(r"^x-cache: exact$", headers, re.M | re.I), headers
    assert json.loads(body)["choices"] == answer["choices"]
    counts = json.loads(stats)
    assert counts["exact_hits"] >= 1 and counts["misses"] >= 1, counts

    sdk = fenced_block(text, "<!-- quickstart-sdk").replace("8000", str(router_port))
    done = subprocess.run([sys.executable, "-c", sdk], env=shell_env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the SDK example printed no answer"
