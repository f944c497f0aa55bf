"""``python -m router serve [--host H] [--port P]``: run the router with uvicorn (router/server.py)."""

from __future__ import annotations

import logging
import os

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from opskit import configure as configure_logging, settings_table
from opskit.redis_client import RedisURLError, check_redis_url

from router.app import create_app
from router.credentials import CredentialError, Credentials
from router.discovery import DiscoveryError, StaticSource
from router.discovery_config import build_source
from router.limits import connection_budget
from router.server import raise_open_files_limit, serve as serve_app
from router.settings import RouterSettings, error_location
from router.tracing import TracingError, check_exporter

cli = typer.Typer(help="PromptEdge edge router: OpenAI-compatible, cache first, GPU-load-aware dispatch.",
                  no_args_is_help=True, add_completion=False)


@cli.callback()
def main() -> None:
    """PromptEdge router. Settings come from PROMPTEDGE_* environment variables (router/README.md)."""


@cli.command(help="Serve the OpenAI API on HOST:PORT (uvicorn with uvloop and httptools). Settings come from "
                  "PROMPTEDGE_* environment variables and the YAML file named by PROMPTEDGE_SETTINGS_FILE; every "
                  "setting with its env name and default: python -m router settings.")
def serve(
    host: str = typer.Option(None, help="Bind address (default PROMPTEDGE_ROUTER_HOST or 127.0.0.1)."),
    port: int = typer.Option(None, help="Port (default PROMPTEDGE_ROUTER_PORT or 8000)."),
    log_level: str = typer.Option("info", help="uvicorn and router log level."),
) -> None:
    """Serve the OpenAI API on HOST:PORT (uvicorn with uvloop and httptools)."""
    try:
        settings = RouterSettings()
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            field = error_location(error["loc"])  # API keys in a location are secrets
            top = field.split(".")[0]  # a field, or an env name given as its alias (PROMPTEDGE_REDIS_URL)
            name = top if top.startswith("PROMPTEDGE_") else f"PROMPTEDGE_ROUTER_{top.upper()}"
            typer.echo(f"error: setting {name} ({field}): {error['msg']}", err=True)
        raise typer.Exit(2) from None
    except SettingsError as exc:  # a list/dict setting that is not valid JSON
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        check_exporter(settings.otel_exporter)
        check_redis_url(settings.redis_url)
        source = build_source(settings)
        # read every backend key now: a missing one is a start-up error, not a 401 per request
        Credentials(settings.backend_keys).check(source.specs if isinstance(source, StaticSource) else ())
    except RedisURLError as exc:
        typer.echo(f"error: setting PROMPTEDGE_REDIS_URL: {exc}", err=True)
        raise typer.Exit(2) from None
    except (DiscoveryError, TracingError, CredentialError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:  # client and upstream connections share the open-files limit (router/limits.py)
        budget = connection_budget(raise_open_files_limit(), settings.limits, settings.max_connections)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    settings = settings.model_copy(update={"max_connections": budget.upstream})
    configure_logging(settings.log_format, log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape otherwise
    # A service log has no progress bars: loading the embedding model drew one (transformers'
    # "Loading weights", through tqdm, which reads TQDM_DISABLE from 4.66 on).
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    serve_app(create_app(settings, source), settings.limits, budget, host=settings.host if host is None else host,
              port=settings.port if port is None else port, log_level=log_level)


@cli.command("settings", help="List every setting of the router, its Kubernetes discovery and its cache: "
                              "environment variable, default, and its key in the YAML settings file.")
def settings_command() -> None:
    """Print the router's, discovery's and cache's settings (opskit.settings_table)."""
    from cache.settings import CacheSettings
    from router.discovery_kube import KubeDiscoverySettings

    typer.echo(settings_table((RouterSettings, KubeDiscoverySettings, CacheSettings)))


def run() -> None:
    """Entry point of the ``promptedge-router`` console script (the same CLI as ``python -m router``)."""
    cli(prog_name="promptedge-router")


if __name__ == "__main__":
    cli()
