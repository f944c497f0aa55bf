"""Typer CLI of the sim package: serve, replay, demo, sample."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

app = typer.Typer(
    help="Simulated vLLM replicas, trace replay and the local demo stack.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """Simulated vLLM replicas, trace replay and the local demo stack."""


@app.command()
def serve(
    port: Annotated[Optional[int], typer.Option(help="TCP port (env PROMPTEDGE_SIM_PORT).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Served model name.")] = None,
    profile: Annotated[Optional[str], typer.Option(help="GPU profile: a100 or t4.")] = None,
    warmup_s: Annotated[Optional[float], typer.Option("--warmup-s", help="Seconds of 503 on /health after start.")] = None,
    host: Annotated[Optional[str], typer.Option(help="Bind address.")] = None,
    fail_rate: Annotated[Optional[float], typer.Option(help="Fraction of completions answered 500.")] = None,
    hang: Annotated[bool, typer.Option("--hang", help="Completions never answer (fault test).")] = False,
) -> None:
    """Run one simulated vLLM replica (OpenAI API, /health, vLLM /metrics)."""
    import uvicorn

    from sim.api import create_app
    from sim.profiles import PROFILES
    from sim.settings import SimSettings

    overrides = {
        k: v
        for k, v in dict(port=port, model=model, profile=profile, warmup_s=warmup_s, host=host, fail_rate=fail_rate).items()
        if v is not None
    }
    if hang:
        overrides["hang"] = True
    settings = SimSettings(**overrides)
    if settings.profile not in PROFILES:
        raise typer.BadParameter(f"unknown profile {settings.profile!r}; known: {', '.join(sorted(PROFILES))}",
                                 param_hint="--profile")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning", access_log=False)
