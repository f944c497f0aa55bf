"""A real ``python -m sim serve`` child process for the sim tests that need one (signals, metrics)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx


def start_replica(port: int, *args: str) -> subprocess.Popen[bytes]:
    """Start a replica on 127.0.0.1:``port`` with extra ``sim serve`` arguments and wait (60 s at
    most) until ``/health`` answers 200. Raises AssertionError with its stderr when it does not."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"replica did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
