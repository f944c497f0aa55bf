"""How one simulated replica's HTTP server stops: graceful shutdown on SIGTERM, as vLLM does.

On the first SIGTERM the replica stops admitting (``/health`` answers 503 ``draining``, new
completions 503) while the requests already admitted run to their end; once its engine is idle
the server closes its socket, waits for the open responses to finish sending and exits with
code 0. A second SIGTERM, or SIGINT, stops at once (uvicorn's own handling). Whoever sent the
SIGTERM bounds the drain (the stand-in kubelet sends SIGKILL after the Pod's grace period).
"""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI


class DrainingServer(uvicorn.Server):
    """uvicorn server for ``create_app``'s app that drains on SIGTERM (see the module)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self.draining = False

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
