"""How one simulated replica's HTTP server stops: graceful shutdown on SIGTERM, as vLLM does.

On the first SIGTERM the replica stops admitting (``/health`` answers 503 ``draining``, new
completions 503) while the requests already admitted run to their end; once its engine is idle
the server closes its socket, waits for the open responses to finish sending and exits with
code 0. A second SIGTERM, or SIGINT, stops at once (uvicorn's own handling). Whoever sent the
SIGTERM bounds the drain (the stand-in kubelet sends SIGKILL after the Pod's grace period).
"""

from __future__ import annotations

import logging
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from opskit import configure as configure_logging
from sim.replica.api.app import create_app
from sim.replica.latency.profiles import PROFILES
from sim.replica.settings import SimSettings

log = logging.getLogger("sim.serve")


class ReplicaConfigError(ValueError):
    """Replica settings that cannot run; ``param``: the CLI flag to blame, when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def build_replica(overrides: dict[str, Any]) -> tuple[FastAPI, SimSettings]:
    """The app and settings of one replica from setting overrides (env ``PROMPTEDGE_SIM_*``
    fills the rest). Raises ReplicaConfigError for invalid settings, an unknown profile, or a
    ``max_model_len`` beyond the profile's KV cache."""
    try:
        settings = SimSettings(**overrides)
    except ValidationError as exc:  # e.g. --time-scale 0 or a bad PROMPTEDGE_SIM_* value
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ReplicaConfigError(f"invalid replica settings: {problems}") from None
    if settings.profile not in PROFILES:
        raise ReplicaConfigError(
            f"unknown profile {settings.profile!r}; known: {', '.join(sorted(PROFILES))}", "--profile"
        )
    try:
        return create_app(settings), settings
    except ValueError as exc:  # a max_model_len beyond the profile's KV cache
        raise ReplicaConfigError(str(exc), "--max-model-len") from None


def serve_replica(app: FastAPI, settings: SimSettings) -> None:
    """Serve ``app`` on ``settings.host:port`` until SIGTERM drains it (or SIGINT stops it).
    Logs go to stderr in ``settings.log_format``: one INFO line saying where the replica
    listens once its socket is bound, then uvicorn's warnings and errors only."""
    configure_logging(settings.log_format)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", access_log=False, log_config=None
    )
    DrainingServer(config, app, settings).run()


class DrainingServer(uvicorn.Server):
    """uvicorn server for ``create_app``'s app that drains on SIGTERM (see the module)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, settings: SimSettings | None = None) -> None:
        super().__init__(config)
        self._app = app
        self._settings = settings
        self.draining = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._settings is not None and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            s = self._settings
            log.info(
                "replica %s (profile %s, time scale %g) listening on http://%s:%d",
                s.model,
                s.profile,
                s.time_scale,
                host,
                port,
            )

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.draining and not self.should_exit:
            self.draining = True
            replica = getattr(self._app.state, "replica", None)
            if replica is not None:
                replica.draining = True
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.draining and not self.should_exit:
            replica = getattr(self._app.state, "replica", None)
            if replica is None or replica.engine.idle:
                self.should_exit = True
        return await super().on_tick(counter)
