"""FastAPI dependencies: the router's state, created by the lifespan, handed to routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from router.state import RouterState


async def get_state(request: Request) -> RouterState:
    """The app's :class:`RouterState` (set by the lifespan before any request). Async on purpose:
    FastAPI runs a sync dependency in a worker thread, which costs a thread hand-off per request."""
    return request.app.state.router


StateDep = Annotated[RouterState, Depends(get_state)]
