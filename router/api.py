"""OpenAI-compatible completion routes (thin: the flow lives in ``router.service``)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from router import service
from router.deps import StateDep


def add_completion_routes(app: FastAPI) -> None:
    """Register the two completion routes on the app itself. Measured: through an included
    APIRouter, FastAPI (0.165) re-derives the included routes' version on every request,
    about 7 % of the router's CPU per proxied request."""
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])


async def chat_completions(request: Request, state: StateDep) -> Response:
    """OpenAI chat completions, stream or not, from the cache or a replica."""
    return await service.handle(state, request, "chat.completions")


async def completions(request: Request, state: StateDep) -> Response:
    """OpenAI (legacy) text completions, stream or not, from the cache or a replica."""
    return await service.handle(state, request, "completions")
