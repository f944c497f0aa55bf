"""What tracing each upstream request costs (issue 13, finding 1: retry only when no connection
was ever established, known from the transports' trace hooks).

    python bench/upstream_trace_cost.py [--requests N] [--rounds R] [--json PATH]

One process, one event loop: a minimal aiohttp backend on loopback answers a small chat
completion; the same keep-alive POSTs go through, in alternating rounds,

- ``plain``: the transport as before (httpx-aiohttp's own session, or httpx's transport),
  ``handle_async_request`` and read the body;
- ``traced``: ``router.forward.upstream.Upstream.open`` (trace hooks, progress, error translation)
  and read the body;

for both transports. Reported per transport and variant: the median over rounds of CPU
microseconds per request (``time.process_time``, this process: client and backend) and of the
wall-clock p50 per request; and traced minus plain. Both variants run in the same rounds, so
the machine's load moves them alike; compare within one run.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import typer
from aiohttp import web
from httpx_aiohttp import AiohttpTransport

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from router.forward.upstream import Upstream, read_body  # noqa: E402

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
ANSWER = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
).encode()


async def _backend() -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1/chat/completions"


async def _round(send, n: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(CPU us per request, wall p50 us) of ``n`` sequential requests."""
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await send()
        walls.append(time.perf_counter() - t0)
    return (time.process_time() - cpu0) / n * 1e6, statistics.median(walls) * 1e6


async def _run(requests: int, rounds: int) -> dict[str, dict[str, float]]:
    runner, url = await _backend()
    headers = {"content-type": "application/json"}
    results: dict[str, dict[str, float]] = {}
    try:
        for name in ("aiohttp", "httpx"):
            plain_transport: httpx.AsyncBaseTransport = (
                AiohttpTransport() if name == "aiohttp" else httpx.AsyncHTTPTransport()
            )
            upstream = Upstream(name, 100)
            timeout = {"connect": 2.0, "read": 10.0, "write": 2.0, "pool": None}

            # both closures run inside this loop pass (_round awaits them here), never after it
            async def plain() -> None:
                request = httpx.Request("POST", url, content=BODY, headers=headers, extensions={"timeout": timeout})  # noqa: B023
                response = await plain_transport.handle_async_request(request)  # noqa: B023
                await read_body(response, url)

            async def traced() -> None:
                response = await upstream.open(url, BODY, headers, 2.0, 10.0)  # noqa: B023
                await read_body(response, url)

            samples: dict[str, list[tuple[float, float]]] = {"plain": [], "traced": []}
            await _round(plain, 50)
            await _round(traced, 50)  # warm-up: connections, first-use sessions
            for _ in range(rounds):
                samples["plain"].append(await _round(plain, requests))
                samples["traced"].append(await _round(traced, requests))
            for variant, rows in samples.items():
                results[f"{name}/{variant}"] = {
                    "cpu_us_per_request": round(statistics.median(r[0] for r in rows), 1),
                    "wall_p50_us": round(statistics.median(r[1] for r in rows), 1),
                }
            await plain_transport.aclose()
            await upstream.aclose()
    finally:
        await runner.cleanup()
    return results


def main(
    requests: int = typer.Option(2000, help="Sequential requests per round and variant."),
    rounds: int = typer.Option(5, min=1, help="Alternating rounds; the table shows medians."),
    json_path: Path = typer.Option(None, "--json", help="Write the results here."),
) -> None:
    """Print the table (and write JSON): plain vs traced upstream requests, both transports."""
    results = asyncio.run(_run(requests, rounds))
    print("| transport | variant | CPU us/request | wall p50 us |")
    print("|---|---|---:|---:|")
    for key, row in results.items():
        transport, variant = key.split("/")
        print(f"| {transport} | {variant} | {row['cpu_us_per_request']} | {row['wall_p50_us']} |")
    for transport in ("aiohttp", "httpx"):
        plain, traced = results[f"{transport}/plain"], results[f"{transport}/traced"]
        print(
            f"{transport}: traced - plain = {traced['cpu_us_per_request'] - plain['cpu_us_per_request']:+.1f} us CPU, "
            f"{traced['wall_p50_us'] - plain['wall_p50_us']:+.1f} us wall p50 per request"
        )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"requests": requests, "rounds": rounds, "results": results}, indent=2))


if __name__ == "__main__":
    typer.run(main)
