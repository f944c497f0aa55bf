"""The README's "In front of your own server" commands, run as written: against a sim replica,
and against llama.cpp's ``llama-server`` where tests/tools/build_llama.py has built it.

The shell block after the ``<!-- quickstart`` marker in README.md is read from the file, so an
edit there is what this test runs: each line goes to ``bash -c`` unchanged, except that its two
ports (8001 for the server, 8000 for the router) become free ports (tests run side by side), and
that a line ending in ``&`` is started in its own session, which the test ends with SIGTERM (then
SIGKILL) when it is done. Then the Python block after ``<!-- quickstart-sdk`` (the OpenAI SDK)
runs against the same router. ``python`` on the PATH is the interpreter running the tests, and
the router's Redis is the test database (``PROMPTEDGE_REDIS_URL``, which the README leaves to
the environment).

The llama variant does what the README tells a llama-server user: it leaves out the block's first
line (the sim) and starts ``llama-server`` itself (SmolLM2-135M-Instruct) on the address the
router line's replica URL points at, under the model name that line uses (``--alias``); the
other lines run unchanged and are held to the same promises. Where llama-server is not built,
it skips with the build's reason, as tests/router/test_llama_cpp.py does.
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
from urllib.parse import urlsplit

import pytest

from tests.router.llama_servers import spawn, stop
from tests.tools.build_llama import llama_files

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the bound of each foreground command: the first request waits for the router's start-up
COMMAND_TIMEOUT_S = 150
# llama-server's --n-predict: the README's request sets no max_tokens, and SmolLM2 can run on
LLAMA_MAX_TOKENS = 48


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


def _quickstart_commands(text: str) -> list[str]:
    commands = [line for line in fenced_block(text, "<!-- quickstart:").splitlines() if line.strip()]
    assert 1 <= len(commands) <= 5, "the quick start promises at most five commands"
    return commands


def _run_commands(
    commands: list[str], shell_env: dict[str, str], tmp_path: Path, background: list[subprocess.Popen[bytes]]
) -> list[str]:
    """Run ``commands`` (ports already replaced) one by one in ``bash -c``: a line ending in ``&``
    in the background, the others to completion, each of which must exit 0; their stdouts."""
    outputs = []
    for n, command in enumerate(commands):
        if command.rstrip().endswith("&"):
            log = open(tmp_path / f"background-{n}.log", "wb")
            background.append(
                subprocess.Popen(
                    ["bash", "-c", command.rstrip().removesuffix("&")],
                    env=shell_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            continue
        done = subprocess.run(
            ["bash", "-c", command], env=shell_env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(tmp_path.glob("*.log")))
        assert done.returncode == 0, f"{command!r} exited {done.returncode}: {done.stderr}\n{logs}"
        outputs.append(done.stdout)
    return outputs


def _check_outputs(outputs: list[str], text: str, router_port: int, shell_env: dict[str, str]) -> None:
    """What the README promises of the block's three requests, then its SDK example on the router."""
    first, repeat, stats = outputs
    answer = json.loads(first)
    assert answer["choices"][0]["message"]["content"], answer
    headers, _, body = repeat.replace("\r\n", "\n").partition("\n\n")
    assert re.search(r"^x-cache: exact$", headers, re.M | re.I), headers
    assert json.loads(body)["choices"] == answer["choices"]
    counts = json.loads(stats)
    assert counts["exact_hits"] >= 1 and counts["misses"] >= 1, counts

    sdk = fenced_block(text, "<!-- quickstart-sdk").replace("8000", str(router_port))
    done = subprocess.run(
        [sys.executable, "-c", sdk], env=shell_env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the SDK example printed no answer"


def test_readme_quickstart_serves_a_request_and_reads_stats(
    shell_env: dict[str, str], tmp_path: Path, background: list[subprocess.Popen[bytes]]
) -> None:
    text = README.read_text()
    server_port, router_port = _free_port(), _free_port()
    commands = [
        c.replace("8001", str(server_port)).replace("8000", str(router_port)) for c in _quickstart_commands(text)
    ]
    _check_outputs(_run_commands(commands, shell_env, tmp_path, background), text, router_port, shell_env)


@pytest.mark.llama
@pytest.mark.slow
def test_readme_quickstart_in_front_of_llama_server(
    shell_env: dict[str, str], tmp_path: Path, background: list[subprocess.Popen[bytes]]
) -> None:
    """The same block as a llama-server user runs it: without its first line (the sim), in front of
    a llama-server already listening where the router line's replica URL points, serving the model
    under the name that line gives it (``--alias``)."""
    files = llama_files()
    reason = files.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    text = README.read_text()
    server_port, router_port = _free_port(), _free_port()
    sim, *commands = _quickstart_commands(text)
    assert sim.startswith("python -m sim serve"), f"the first line is no longer the sim: {sim!r}"
    commands = [c.replace("8001", str(server_port)).replace("8000", str(router_port)) for c in commands]
    replicas = json.loads(re.search(r"PROMPTEDGE_ROUTER_REPLICAS='([^']*)'", commands[0]).group(1))
    assert len(replicas) == 1, replicas
    url = urlsplit(replicas[0]["url"])
    # The server's own settings, which the README leaves to the user: one thread and a cap on the
    # answer's length (the README's request sets no max_tokens) keep the run short on two cores.
    proc, _ = spawn(
        [
            str(files.server),
            "-m",
            str(files.gguf),
            "--host",
            str(url.hostname),
            "--port",
            str(url.port),
            "--alias",
            replicas[0]["model"],
            "--n-predict",
            str(LLAMA_MAX_TOKENS),
            "--ctx-size",
            "2048",
            "--parallel",
            "1",
            "--threads",
            "1",
            "--no-webui",
        ],
        tmp_path / "llama-server.log",
        r"listening on http://",
        timeout_s=180,
    )
    try:
        _check_outputs(_run_commands(commands, shell_env, tmp_path, background), text, router_port, shell_env)
    finally:
        stop(proc)
