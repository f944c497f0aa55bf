"""A replica whose generation hangs while its ``/health`` still answers (issue 31, item 5).

A real sim engine process is stopped with SIGSTOP behind a front process (sim/front.py) that
answers ``/health`` itself and serves the engine's last ``/metrics`` page, as vLLM's API server
does for a hung engine. Through the real router, open-loop streamed traffic must keep flowing:
no error, and requests sent once the router had ``stuck_after_s`` to notice are answered by the
other replica within a bounded time. After SIGCONT the replica comes back into rotation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.router.conftest import MODEL, sse_data
from tests.router.sim_process import ROOT, free_port, start_sim, wait_healthy

STUCK_AFTER_S = 2.0
RATE_S = 0.1  # one new request every 100 ms, whatever the others do (open loop)


@dataclass
class Outcome:
    """One streamed request: when it was sent and ended (monotonic s), status, replica, body."""

    sent: float
    ended: float
    status: int
    replica: str
    text: str


async def _one(client: httpx.AsyncClient, url: str, i: int) -> Outcome:
    # unique: never a cache hit. Over 512 tokens (size class medium): the requests caught by the
    # stop get a TTFT of seconds, which for short prompts rightly ejects the replica as a latency
    # outlier for eject_s (router/fleet/health.py), another mechanism than the one tested here
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": f"question number {i}: " + "tell me more " * 175}],
    }
    sent = time.monotonic()
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        text = (await response.aread()).decode()
    return Outcome(sent, time.monotonic(), response.status_code, response.headers.get("x-promptedge-replica", ""), text)


def _start_front(engine_url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sim.front", "--port", str(port), "--upstream", engine_url],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, f"http://127.0.0.1:{port}"


def _gauge(metrics: str, name: str, replica: str) -> float | None:
    """The value of ``promptedge_router_replica_<name>`` for ``replica`` in a /metrics text."""
    for line in metrics.splitlines():
        if line.startswith(f"promptedge_router_replica_{name}{{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["round_robin", "gpu_load"])
async def test_a_replica_stopped_behind_a_live_health_is_taken_out_and_comes_back(
    start_router, client, exact_only, tmp_path: Path, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    engine_port, other_port = free_port(), free_port()
    engine, other = start_sim(engine_port), start_sim(other_port)
    front, front_url = _start_front(f"http://127.0.0.1:{engine_port}", tmp_path / "front.log")
    procs = [engine, other, front]
    try:
        other_url = f"http://127.0.0.1:{other_port}"
        for url in (f"http://127.0.0.1:{engine_port}", front_url, other_url):
            await wait_healthy(client, url)
        caplog.set_level(logging.INFO, logger="router.scraper")
        router = await start_router(
            [front_url, other_url], policy=policy, stuck_after_s=STUCK_AFTER_S, health_interval_s=0.5
        )
        tasks: list[asyncio.Task[Outcome]] = []
        async with httpx.AsyncClient(timeout=60) as load:

            async def traffic(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    tasks.append(asyncio.create_task(_one(load, router.url, len(tasks))))
                    await asyncio.sleep(RATE_S)

            await traffic(1.5)
            os.kill(engine.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            await traffic(STUCK_AFTER_S + 4.0)
            during = (await client.get(router.url + "/metrics")).text
            os.kill(engine.pid, signal.SIGCONT)
            resumed = time.monotonic()
            await traffic(3.0)
            outcomes = await asyncio.gather(*tasks)
        after = (await client.get(router.url + "/metrics")).text

        # nothing lost: every request, also those caught on the engine when it stopped, is answered whole
        assert [o.status for o in outcomes] == [200] * len(outcomes)
        for o in outcomes:
            events = sse_data(o.text)
            assert events[-1] == "[DONE]" and all('"error"' not in e for e in events), o.text[-300:]
        # once the router had time to notice (detection + a probe round), nothing goes to the
        # stopped engine: every request is answered by the other replica in bounded time
        noticed = stopped + STUCK_AFTER_S + 1.0
        late = [o for o in outcomes if noticed <= o.sent < resumed]
        assert len(late) > 15, "too few requests were sent while the engine was stopped"
        assert {o.replica for o in late} == {other_url}
        slow = [(round(o.sent - stopped, 2), round(o.ended - o.sent, 2)) for o in late if o.ended - o.sent > 3.0]
        assert not slow, f"answered slowly after detection (s since the stop, latency s): {slow}"
        # the operator sees why the replica is out
        assert _gauge(during, "stuck", front_url) == 1.0 and _gauge(during, "up", front_url) == 0.0
        logged = [r.getMessage() for r in caplog.records if r.name == "router.scraper" and front_url in r.getMessage()]
        assert any("is stuck" in m for m in logged) and "progresses again" in logged[-1], logged
        # after SIGCONT its stalled streams progress: it is back in rotation
        assert _gauge(after, "stuck", front_url) == 0.0 and _gauge(after, "up", front_url) == 1.0
        if policy == "round_robin":  # (gpu_load may prefer the other: it learned the stalled streams' speed)
            back = [o for o in outcomes if o.sent >= resumed + 1.0]
            assert any(o.replica == front_url for o in back), {o.replica for o in back}
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()
