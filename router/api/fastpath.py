"""The completion routes served ahead of FastAPI's middleware stack.

Every request through FastAPI passes eight ASGI layers before its endpoint (Starlette's
ServerErrorMiddleware, FastAPI's body-limit and telemetry middlewares, the router's BodyLimit,
ExceptionMiddleware, FastAPI's exit-stack middleware, the router, the route), each a coroutine
frame, most a ``send`` wrapper of their own. The completion routes use none of them: they read
the raw body, validate it themselves (router/api/schemas.py) and turn every failure into an
APIError (router/forward/forwarder.py ``Forwarder.accounted``). :class:`RouterApp` answers a POST to one of those
paths itself, with only the router's :class:`~router.api.bodylimit.BodyLimit` around it, and hands
every other request (admin routes, other methods, unknown paths, lifespan) to FastAPI as before.

Measured (bench/router_overhead.py, CPU per proxied miss): docs/benchmarks.md, router overhead.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.api.bodylimit import BodyLimit
from router.api.routes import ROUTES
from router.errors import APIError


class RouterApp(FastAPI):
    """FastAPI whose completion routes (router/api/routes.py ``ROUTES``, POST: the one table of
    them) skip its middleware stack.

    ``fast_body_limit``: the bound (bytes) those requests' bodies get, as the app's BodyLimit
    middleware gives every other request (413). Errors are answered by the app's own exception
    handlers (router/app.py): an APIError as OpenAI error JSON with its status and headers; an
    exception escaping a route's handler (a bug: it turns its own into a 500 APIError) by the
    handler registered for ``Exception``, which logs it and answers 500 ``internal_error``.
    """

    def __init__(self, *args: Any, fast_body_limit: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast = BodyLimit(self._serve, fast_body_limit)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ROUTES:
            scope["app"] = self
            await self._fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        try:
            response: Response = await ROUTES[scope["path"]](self.state.router, request)
        except Exception as exc:
            handler = self.exception_handlers[APIError if isinstance(exc, APIError) else Exception]
            response = await handler(request, exc)
        await response(scope, receive, send)
