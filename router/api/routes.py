"""The completion routes, declared once: ``ROUTES`` (POST path -> what serves it) is read both by
the fast path (router/api/fastpath.py), which answers those POSTs ahead of the middleware stack,
and by :func:`add_completion_routes`, which registers the same paths on the app so that another
method gets Starlette's 405 with ``Allow: POST``. Thin: the flow lives in
router/forward/service.py (completions, embeddings, tokenizer) and router/api/responses.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.api import responses
from router.api.schemas import Endpoint
from router.forward import service
from router.state import RouterState

Serve = Callable[[RouterState, Request], Awaitable[Response]]


def _completion(endpoint: Endpoint) -> Serve:
    async def serve(state: RouterState, request: Request) -> Response:
        # service.handle looked up per call: tests replace it to see how its failures are answered
        return await service.handle(state, request, endpoint)

    return serve


# POST path -> what serves it: OpenAI chat and (legacy) text completions, stream or not, from
# the cache or a replica; embeddings (exact cache only); vLLM's /tokenize and /detokenize (never
# cached); OpenAI's Responses API (relayed, with replica affinity, never cached).
ROUTES: dict[str, Serve] = {
    "/v1/chat/completions": _completion("chat.completions"),
    "/v1/completions": _completion("completions"),
    "/v1/embeddings": _completion("embeddings"),
    "/tokenize": _completion("tokenize"),
    "/detokenize": _completion("detokenize"),
    responses.PATH: responses.respond,
}


def add_completion_routes(app: FastAPI) -> None:
    """Register ``ROUTES`` on the app itself, as plain Starlette routes (POST only).

    A :class:`~router.api.fastpath.RouterApp` answers those POSTs before they reach these
    routes; they still give every other method of those paths its 405, and serve the POSTs of
    a plain FastAPI app. Plain Starlette routes, not FastAPI's: its per-route machinery
    (dependency solving, endpoint context, exit stacks, telemetry hooks) does nothing these
    routes use: they read the raw body and validate it themselves (router/api/schemas.py), and
    errors go through the app's exception handlers either way. Not in the OpenAPI schema (the
    app serves no docs).
    """
    for path, serve in ROUTES.items():
        app.add_route(path, _starlette(serve), methods=["POST"], include_in_schema=False)


def _starlette(serve: Serve) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        return await serve(request.app.state.router, request)

    return route
