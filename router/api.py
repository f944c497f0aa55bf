"""OpenAI-compatible completion routes (thin: the flow lives in ``router.service``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from router import service
from router.deps import StateDep

api = APIRouter()


@api.post("/v1/chat/completions")
async def chat_completions(request: Request, state: StateDep) -> Response:
    """OpenAI chat completions, stream or not, from the cache or a replica."""
    return await service.handle(state, request, "chat.completions")


@api.post("/v1/completions")
async def completions(request: Request, state: StateDep) -> Response:
    """OpenAI (legacy) text completions, stream or not, from the cache or a replica."""
    return await service.handle(state, request, "completions")
