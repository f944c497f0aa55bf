"""A replica SIGKILLed while idle under load: how many client-visible errors (issue 31, item 1).

Real processes: ``python -m router serve --workers W`` in front of three ``python -m sim serve``
replicas on a real Redis; ``--requests`` requests, ``--concurrency`` at a time, each on a new
client connection (so every worker has pooled connections to every replica). After
``--kill-after`` answers, replica 0 is SIGKILLed when it is idle, as ``--idle`` says:

- ``quiesce`` (default): the load holds its next requests until none is open, the victim is
  killed and the load resumes at once (into the ~15-90 ms in which the dead process's kernel
  still accepts connections and request bytes nobody reads). Nothing it had read is lost, so
  every error counts against the router. ``--stopped-ms`` N first SIGSTOPs the idle victim and
  lets the load run N ms (a long teardown: more requests land in it).
- ``replica-metrics``: killed once its own /metrics shows nothing running or waiting, the load
  never held: the victim may read a new request in the millisecond between that answer and
  the kill; such a request was possibly processed and its 502 is by design (never sent twice).

Repeated ``--runs`` times; per run it prints the errors and, for each, whether the client sent
it before or after the dead replica's sockets were closed (its port refused a connection), the
router's retries and how many requests were sent while the victim read nothing.

    PYTHONPATH=. PROMPTEDGE_TEST_REDIS_URL=redis://127.0.0.1:6379/11 \\
        python bench/idle_kill.py --runs 5 --workers 4 [--transport aiohttp|httpx] [--idle quiesce|replica-metrics]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

import httpx

from router.dispatch.signals import parse_metrics
from tests.router.router_process import MODEL, start_replica, start_router


async def _closed_at(port: int) -> float:
    """When 127.0.0.1:``port`` first refuses a connection (monotonic seconds)."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return time.monotonic()
        except ConnectionResetError:  # queued on a listening socket as it closed: not closed yet
            pass
        await asyncio.sleep(0)


def _retries(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("promptedge_router_retries_total{")
    )


async def one_run(
    tmp: Path,
    workers: int,
    transport: str,
    total: int,
    concurrency: int,
    kill_after: int,
    idle: str = "quiesce",
    stopped_ms: float = 0.0,
) -> dict:
    """One scenario; returns its counts and errors."""
    replicas = [start_replica(tmp) for _ in range(3)]
    victim, victim_url = replicas[0]
    router = start_router(
        tmp,
        args=("--workers", str(workers)),
        env={
            "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": url, "model": MODEL} for _, url in replicas]),
            "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
            "PROMPTEDGE_ROUTER_UPSTREAM_TRANSPORT": transport,
        },
    )
    answers: list[tuple[float, float, int, str]] = []  # (sent, answered, status, body)
    marks: dict[str, float] = {}
    todo = iter(range(total))
    running = asyncio.Event()  # cleared: the load holds its next requests
    running.set()
    open_requests = 0
    try:
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
                        answer = await client.post(router.url + "/v1/chat/completions", json=body)
                    finally:
                        open_requests -= 1
                    answers.append((sent, time.monotonic(), answer.status_code, answer.text[:300]))

            async def kill_when_idle() -> None:
                while len(answers) < kill_after:
                    await asyncio.sleep(0.01)
                if idle == "quiesce":
                    running.clear()
                    while open_requests:
                        await asyncio.sleep(0.001)
                else:
                    async with httpx.AsyncClient(timeout=5) as probe:
                        while True:
                            signals = parse_metrics((await probe.get(victim_url + "/metrics")).content)
                            if not (signals.running or 0) + (signals.waiting or 0):
                                break
                if stopped_ms:
                    os.kill(victim.pid, signal.SIGSTOP)
                    marks["stopped"] = time.monotonic()
                    running.set()
                    await asyncio.sleep(stopped_ms / 1000)
                os.kill(victim.pid, signal.SIGKILL)
                marks["killed"] = time.monotonic()
                running.set()
                marks["closed"] = await _closed_at(int(victim_url.rsplit(":", 1)[1]))

            await asyncio.gather(kill_when_idle(), *(load() for _ in range(concurrency)))
            retries = _retries((await client.get(router.url + "/metrics")).text)
    finally:
        router.stop()
        for proc, _ in replicas:
            proc.kill()
            proc.wait(timeout=10)
    killed, closed = marks["killed"], marks["closed"]
    unread_from = marks.get("stopped", killed)
    errors = [
        {
            "sent_ms": round((sent - killed) * 1000, 1),
            "answered_ms": round((done - killed) * 1000, 1),
            "sent_before_close": sent < closed,
            "status": status,
            "body": body,
        }
        for sent, done, status, body in answers
        if status != 200
    ]
    return {
        "answers": len(answers),
        "errors": len(errors),
        "teardown_ms": round((closed - killed) * 1000, 1),
        "sent_unread_window": sum(unread_from <= a[0] < closed for a in answers),
        "retries": retries,
        "errors_sent_after_close": sum(not e["sent_before_close"] for e in errors),
        "detail": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--transport", default="aiohttp", choices=["aiohttp", "httpx"])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kill-after", type=int, default=60)
    parser.add_argument("--idle", default="quiesce", choices=["quiesce", "replica-metrics"])
    parser.add_argument("--stopped-ms", type=float, default=0.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="idle_kill-"))
    totals = {"errors": 0, "errors_sent_after_close": 0}
    for run in range(args.runs):
        result = asyncio.run(
            one_run(
                tmp,
                args.workers,
                args.transport,
                args.requests,
                args.concurrency,
                args.kill_after,
                args.idle,
                args.stopped_ms,
            )
        )
        print(json.dumps({"run": run, **result}), flush=True)
        for key in totals:
            totals[key] += result[key]
    print(
        json.dumps(
            {
                "runs": args.runs,
                "workers": args.workers,
                "transport": args.transport,
                "idle": args.idle,
                "stopped_ms": args.stopped_ms,
                **totals,
            }
        )
    )


if __name__ == "__main__":
    main()
