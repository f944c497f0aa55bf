"""A replica that dies while idle costs no client an error (issue 31, item 1).

Real processes: ``python -m router serve --workers 4`` in front of three ``python -m sim serve``
replicas. Under a steady load (200 requests, 4 at a time, each on a new client connection, so
every router worker takes its share and keeps pooled connections to every replica), one
replica is SIGKILLed while no request is on it; the load goes on at once. Asserted: every one of
the 200 requests is answered 200.

What "idle" means here, and how it is made exact: after 60 answers the load holds its next
requests until every request it sent is answered (a few ms), the victim is SIGKILLed, and the
load resumes at once. With no client request open, no router worker has a request on any
replica (a lease ends before its answer is sent), so no request can be one the victim had read
and was working on (that one is a 502 by design: it may have been generated, it is never sent
twice; tests/router/test_retry_safety.py). Asking the router's per-replica in-flight gauge
instead is too coarse: each worker publishes it once a second (router/observe/metrics_shared.py),
and the sim's own /metrics leaves a race of about a millisecond in which the victim reads a new
request after answering the scrape (bench/idle_kill.py ``--idle replica-metrics`` counts those).

What the test exercises: SIGKILL tears the victim's memory down before its sockets (15-90 ms
here), and meanwhile its kernel still accepts connections and request bytes nobody reads. The
resumed load sends requests into exactly that window, over the workers' pooled connections to
the victim and new ones. Before the fix each of those was a 502 ("failed after the request was
sent: ... Connection reset by peer"): now a reset with the request unread, from a replica whose
port refuses a new connect right after, is retried on another replica
(router/forward/unread.py). After the sockets closed, pooled connections the kernel has closed
are not reused (router/forward/liveconn.py) and refused connects are retried.

The second case stops the victim (SIGSTOP) when it is idle, lets the load run 100 ms, then
kills it: a teardown made long, so that several requests of the resumed load surely go into the
victim's sockets unread (a plain SIGKILL gives a window of a few requests, and before the fix
it failed one run in three; this one fails every run). Still no request it had read.

Not client-visible: the router's own health probes and /metrics scrapes of the victim may be
cut by the kill (they only mark it down). The two races this test used to tolerate (each about
once in ten runs, at the moment the victim's sockets closed) are retried now, and
tests/router/test_crossed_close.py makes each happen every run:

- a request written into a pooled connection at the very moment the victim's kernel closes it
  with an empty buffer: the FIN crosses the request, which reaches a closed socket and is reset
  there, unread; the router reads the FIN first, but its socket's state says a reset followed
  (router/forward/unread.py ``reset_after_end``);
- aiohttp saw the connection closing between taking it from the pool and writing the request
  ("Can not write request body"): no byte of the request left (router/forward/liveconn.py
  ``request_unwritten``).

Any error fails the test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.router.router_process import MODEL, start_replica, start_router

pytestmark = pytest.mark.slow

WORKERS = 4
TOTAL, CONCURRENCY = 200, 4
KILL_AFTER = 60  # answers before the kill: every worker has pooled connections by then
URL = "/v1/chat/completions"


async def _closed_at(port: int) -> float:
    """When 127.0.0.1:``port`` first refuses a connection (monotonic seconds): the killed
    process's sockets are closed. A connect reset meanwhile landed in the accept queue of a
    listening socket that was closing: not closed yet."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return time.monotonic()
        except ConnectionResetError:
            pass
        await asyncio.sleep(0)


def _retries(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("promptedge_router_retries_total{")
    )


@pytest.mark.parametrize("stopped_s", [0.0, 0.1], ids=["killed", "stopped-then-killed"])
async def test_a_replica_killed_while_idle_costs_no_client_an_error(
    stopped_s: float, tmp_path: Path, redis_url: str
) -> None:
    replicas = [start_replica(tmp_path) for _ in range(3)]
    victim, victim_url = replicas[0]
    router = None
    try:
        router = start_router(
            tmp_path,
            args=("--workers", str(WORKERS)),
            env={
                "PROMPTEDGE_REDIS_URL": redis_url,
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": url, "model": MODEL} for _, url in replicas]),
                "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
            },
        )
        answers: list[tuple[float, float, int, str, str]] = []  # (sent, answered, status, replica, body)
        stopped_at = killed_at = closed_at = None
        todo = iter(range(TOTAL))
        running = asyncio.Event()  # cleared: the load holds its next requests
        running.set()
        open_requests = 0
        # no keep-alive to the router: each request is a new connection, which any worker may accept
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as client:

            async def load() -> None:
                nonlocal open_requests
                for i in todo:
                    body = {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"q{i} {time.time_ns()}"}],
                        "max_tokens": 4,
                    }
                    await running.wait()
                    open_requests += 1
                    sent = time.monotonic()
                    try:
                        answer = await client.post(router.url + URL, json=body)
                    finally:
                        open_requests -= 1
                    answers.append(
                        (
                            sent,
                            time.monotonic(),
                            answer.status_code,
                            answer.headers.get("x-promptedge-replica", ""),
                            answer.text[:300],
                        )
                    )

            async def kill_when_idle() -> None:
                nonlocal stopped_at, killed_at, closed_at
                while len(answers) < KILL_AFTER:
                    await asyncio.sleep(0.01)
                running.clear()
                while open_requests:
                    await asyncio.sleep(0.001)
                if stopped_s:  # a longer teardown: it reads nothing from here on, then dies
                    os.kill(victim.pid, signal.SIGSTOP)
                    stopped_at = time.monotonic()
                    running.set()
                    await asyncio.sleep(stopped_s)
                os.kill(victim.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                running.set()
                closed_at = await _closed_at(int(victim_url.rsplit(":", 1)[1]))

            async with asyncio.timeout(120):
                await asyncio.gather(kill_when_idle(), *(load() for _ in range(CONCURRENCY)))
            retried = _retries((await client.get(router.url + "/metrics")).text)
        victim.wait(timeout=10)
        assert killed_at is not None and closed_at is not None
        assert len(answers) == TOTAL
        assert any(replica == victim_url for _, done, _, replica, _ in answers if done < killed_at)  # it was pooled
        assert sum(sent > closed_at for sent, *_ in answers) >= TOTAL / 2  # the load went on well past the kill
        # sent while the victim read nothing and its sockets were not closed yet
        in_window = sum((stopped_at or killed_at) <= sent < closed_at for sent, *_ in answers)
        errors = [
            (round((sent - killed_at) * 1000), round((done - killed_at) * 1000), status, body)
            for sent, done, status, _, body in answers
            if status != 200
        ]
        print(
            f"sockets closed {(closed_at - killed_at) * 1000:.0f} ms after the SIGKILL; {in_window} requests "
            f"sent in between; {retried:g} retries; errors (sent, answered: ms after the kill; status, body): "
            f"{errors}"
        )
        assert errors == [], f"{len(errors)} of {TOTAL} requests failed: {errors}"
    finally:
        if router is not None:
            router.stop()
        for proc, _ in replicas:
            proc.kill()
            proc.wait(timeout=10)
