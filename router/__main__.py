"""``python -m router serve [--host H] [--port P] [--workers N]``: run the router with uvicorn
(router/process/server.py; N worker processes: router/process/launch.py)."""

from __future__ import annotations

import typer

from opskit import settings_table
from router.app import create_app
from router.process.launch import (
    StartupError,
    WorkerConfig,
    configure_process_logging,
    prepare,
    report_startup_error,
    serve_workers,
)
from router.process.server import serve as serve_app
from router.settings import WORKERS_MAX, RouterSettings

cli = typer.Typer(
    help="PromptEdge edge router: OpenAI-compatible, cache first, GPU-load-aware dispatch.",
    no_args_is_help=True,
    add_completion=False,
)


@cli.callback()
def main() -> None:
    """PromptEdge router. Settings come from PROMPTEDGE_* environment variables (router/README.md)."""


@cli.command(
    help="Serve the OpenAI API on HOST:PORT (uvicorn with uvloop and httptools), in one process or in "
    f"--workers N (1-{WORKERS_MAX}) processes on the same port. Settings come from "
    "PROMPTEDGE_* environment variables and the YAML file named by PROMPTEDGE_SETTINGS_FILE; every "
    "setting with its env name and default: python -m router settings."
)
def serve(
    host: str = typer.Option(None, help="Bind address (default PROMPTEDGE_ROUTER_HOST or 127.0.0.1)."),
    port: int = typer.Option(None, help="Port (default PROMPTEDGE_ROUTER_PORT or 8000)."),
    workers: int = typer.Option(
        None,
        min=1,
        max=WORKERS_MAX,
        help=f"Worker processes on the port, 1-{WORKERS_MAX} (default "
        "PROMPTEDGE_ROUTER_WORKERS or 1); router/README.md, Workers.",
    ),
    log_level: str = typer.Option("info", help="uvicorn and router log level."),
) -> None:
    """Serve the OpenAI API on HOST:PORT (uvicorn with uvloop and httptools)."""
    try:
        launch = prepare()
    except StartupError as exc:  # before the port is bound: exit 2, said as the router's log lines
        report_startup_error(exc, log_level)
        raise typer.Exit(2) from None
    settings = launch.settings
    configure_process_logging(settings.log_format, log_level)
    host = settings.host if host is None else host
    port = settings.port if port is None else port
    workers = settings.workers if workers is None else workers
    if workers == 1:
        serve_app(
            create_app(settings, launch.source),
            settings.limits,
            launch.budget,
            host=host,
            port=port,
            log_level=log_level,
        )
        return
    # every worker repeats prepare() and builds its own app (router/process/launch.py); this process
    # only binds the port and supervises
    serve_workers(
        WorkerConfig(
            host=host,
            port=port,
            workers=workers,
            log_format=settings.log_format,
            log_level=log_level,
            keepalive_s=settings.limits.keepalive_timeout_s,
        )
    )


@cli.command(
    "settings",
    help="List every setting of the router, its Kubernetes discovery and its cache: "
    "environment variable, default, and its key in the YAML settings file.",
)
def settings_command() -> None:
    """Print the router's, discovery's and cache's settings (opskit.settings_table)."""
    from cache import CacheSettings
    from router.discovery.kube import KubeDiscoverySettings

    typer.echo(settings_table((RouterSettings, KubeDiscoverySettings, CacheSettings)))


def run() -> None:
    """Entry point of the ``promptedge-router`` console script (the same CLI as ``python -m router``)."""
    cli(prog_name="promptedge-router")


if __name__ == "__main__":
    cli()
