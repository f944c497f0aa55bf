"""A real sim replica process (``python -m sim serve``) for tests that kill one mid-request:
a free loopback port, the process, and waiting until it answers ``/health``."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.router.conftest import MODEL

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(port: int) -> subprocess.Popen[bytes]:
    """``python -m sim serve`` on 127.0.0.1:``port`` serving MODEL (about 100 tokens/s per request)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sim", "serve", "--port", str(port), "--model", MODEL],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_healthy(client: httpx.AsyncClient, url: str) -> None:
    """Wait until ``url``/health answers 200; AssertionError after 60 s."""
    for _ in range(600):
        try:
            if (await client.get(url + "/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never became healthy")
