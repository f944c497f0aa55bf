"""A replica's front process: ``/health`` answered by itself, everything else relayed to the engine.

vLLM's ``/health`` and ``/metrics`` are served by its API server process, while generation runs
in a separate engine process: an engine that hangs (a stuck kernel, a deadlock) leaves
``/health`` answering 200 and ``/metrics`` showing counters that no longer move. This front
reproduces that split around a ``python -m sim serve`` process, so the engine can be really
stopped (SIGSTOP) while the replica still looks healthy:

- ``GET /health``: 200 at once, whatever the engine does;
- ``GET /metrics``: relayed; when the engine does not answer within ``metrics_wait_s``, the last
  page it gave (its counters frozen, as a hung engine's are), or 503 before any;
- anything else: relayed as it comes, streamed bodies chunk by chunk.

Run it as ``python -m sim.front --port 8101 --upstream http://127.0.0.1:8001``.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


def create_front(upstream: str, metrics_wait_s: float = 0.5) -> web.Application:
    """An aiohttp app fronting the engine at ``upstream`` (base URL, no trailing slash)."""
    app = web.Application()
    last_metrics: list[bytes] = []

    async def client_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        # no total timeout: a relayed generation may last as long as the engine takes. A
        # connection per request: an engine resumed after SIGSTOP finds its keep-alive timers
        # expired and resets the idle connections the front had meanwhile sent requests on
        app["client"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None), connector=aiohttp.TCPConnector(force_close=True)
        )
        yield
        await app["client"].close()

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(metrics_wait_s):
                async with request.app["client"].get(upstream + "/metrics") as answer:
                    page = await answer.read()
            last_metrics[:] = [page]
        except (TimeoutError, aiohttp.ClientError):
            if not last_metrics:
                return web.Response(status=503, text="engine not answering")
        return web.Response(body=last_metrics[0], content_type="text/plain")

    async def relay(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with request.app["client"].request(
            request.method, upstream + request.rel_url.path_qs, data=await request.read(), headers=headers
        ) as answer:
            response = web.StreamResponse(
                status=answer.status, headers={k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.cleanup_ctx.append(client_ctx)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main() -> None:
    """Command line: ``--port``, ``--upstream``, ``--host`` (default 127.0.0.1)."""
    parser = argparse.ArgumentParser(prog="python -m sim.front", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8001")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    web.run_app(create_front(args.upstream.rstrip("/")), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
