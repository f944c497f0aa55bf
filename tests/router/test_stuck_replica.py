"""A replica whose generation hangs while its ``/health`` still answers (issue 31, item 5).

A real sim engine process is stopped with SIGSTOP behind a front process (sim/front.py) that
answers ``/health`` itself and serves the engine's last ``/metrics`` page, as vLLM's API server
does for a hung engine. Through the real router, open-loop streamed traffic must keep flowing:
no error, and requests sent once the router had ``stuck_after_s`` to notice are answered by the
other replica within a bounded time. After SIGCONT the replica comes back into rotation.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.router.conftest import MODEL, sse_data
from tests.router.sim_process import ROOT, free_port, start_sim, wait_healthy

STUCK_AFTER_S = 2.0
RATE_S = 0.05  # one new request every 50 ms, whatever the others do (open loop)


@dataclass
class Outcome:
    """One streamed request: when it was sent and ended (monotonic s), status, replica, body."""

    sent: float
    ended: float
    status: int
    replica: str
    text: str


async def _one(client: httpx.AsyncClient, url: str, i: int) -> Outcome:
    body = {"model": MODEL, "stream": True, "max_tokens": 12,
            "messages": [{"role": "user", "content": f"question number {i}"}]}  # unique: never a cache hit
    sent = time.monotonic()
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        text = (await response.aread()).decode()
    return Outcome(sent, time.monotonic(), response.status_code, response.headers.get("x-promptedge-replica", ""),
                   text)


def _start_front(engine_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sim.front", "--port", str(port), "--upstream", engine_url],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def _stuck_gauge(metrics: str, replica: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("promptedge_router_replica_stuck{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["round_robin", "gpu_load"])
async def test_a_replica_stopped_behind_a_live_health_is_taken_out_and_comes_back(
        start_router, client, exact_only, policy: str) -> None:
    engine_port, other_port = free_port(), free_port()
    engine, other = start_sim(engine_port), start_sim(other_port)
    front, front_url = _start_front(f"http://127.0.0.1:{engine_port}")
    procs = [engine, other, front]
    try:
        other_url = f"http://127.0.0.1:{other_port}"
        for url in (f"http://127.0.0.1:{engine_port}", front_url, other_url):
            await wait_healthy(client, url)
        router = await start_router([front_url, other_url], policy=policy, stuck_after_s=STUCK_AFTER_S,
                                    health_interval_s=0.5)
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
            await traffic(STUCK_AFTER_S + 3.0)
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
        # bounded latency once the router had time to notice (detection + a scrape/probe round of slack)
        noticed = stopped + STUCK_AFTER_S + 1.0
        late = [o for o in outcomes if noticed <= o.sent < resumed]
        assert late, "no request was sent while the engine was stopped"
        slow = [(round(o.sent - stopped, 2), round(o.ended - o.sent, 2), o.replica) for o in late
                if o.ended - o.sent > 1.5]
        assert not slow, f"sent after detection, answered slowly (since stop s, latency s, replica): {slow}"
        assert {o.replica for o in late} == {other_url}
        # the operator sees why the replica is out
        assert _stuck_gauge(during, front_url) == 1.0
        # after SIGCONT it progresses again and takes requests again
        back = [o for o in outcomes if o.sent >= resumed + 1.0]
        assert any(o.replica == front_url for o in back), {o.replica for o in back}
        assert _stuck_gauge(after, front_url) == 0.0
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()
