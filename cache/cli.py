"""Command line of the cache package (typer)."""

from __future__ import annotations

import asyncio
import json
import os

import redis.asyncio as aioredis
import typer

from cache.service import CacheUnavailable, ResponseCache
from cache.settings import CacheSettings

app = typer.Typer(help="PromptEdge response cache.", no_args_is_help=True, add_completion=False)


def _redis_url() -> str:
    return os.environ.get("PROMPTEDGE_REDIS_URL", "redis://127.0.0.1:6379/0")


@app.callback()
def main() -> None:
    """PromptEdge response cache (Redis: PROMPTEDGE_REDIS_URL)."""


@app.command()
def stats() -> None:
    """Print the cache statistics (the router's /cache/stats) as JSON."""

    async def run() -> dict:
        client = aioredis.Redis.from_url(_redis_url(), socket_connect_timeout=2)
        try:
            settings = CacheSettings(redis_timeout_s=5)
            return await ResponseCache(client, settings).stats()
        finally:
            await client.aclose()

    try:
        typer.echo(json.dumps(asyncio.run(run()), indent=2))
    except CacheUnavailable as exc:
        typer.echo(f"error: Redis at {_redis_url()} unavailable: {exc}", err=True)
        raise typer.Exit(1) from None
