"""ASGI middleware bounding request bodies: size (413) and, with router/process/server.py, arrival time (408).

A body announced larger than ``max_body_bytes`` (Content-Length) is refused before a byte of it
is read; a chunked body is counted as it arrives and refused when it passes the limit, so the
router never holds more than the limit (plus one read) of any body. A client that goes away
before its body is complete ends the request quietly (499, as nginx logs it), not with a
traceback from deep inside the framework.

The 413 goes with ``Connection: close``; the HTTP protocol (router/process/server.py) then lingers over
the body's unread rest (discarding it, within the ``lingering_*`` bounds of router/process/limits.py)
before it closes, so the client reads the 413 instead of a TCP reset.
"""

from __future__ import annotations

import json
from typing import Any

from router.errors import APIError, BadRequest, PayloadTooLarge, RequestTimeout

# Set in the ASGI scope by the server's protocol (router/process/server.py) when a body's deadline
# passes; the next receive() of that request then raises RequestTimeout.
BODY_DEADLINE_PASSED = "promptedge.body_deadline_passed"
# Set (to the 400 to answer) by the server's protocol when the request's body is not valid HTTP
# (an invalid chunk size, a transfer coding it cannot read) after its head was handed to the app.
BODY_INVALID = "promptedge.body_invalid"
_CLOSE = {"connection": "close"}


class ClientClosedRequest(APIError):
    """499: the client closed the connection before its request body was complete."""

    status = 499
    type = "invalid_request_error"


class BodyLimit:
    """Wrap an ASGI app so no request body over ``max_bytes`` bytes reaches it (413 JSON,
    ``code`` ``body_too_large``, ``Connection: close``)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value)  # the HTTP parser has checked it is digits
            elif name == b"transfer-encoding":
                chunked = True
        if length is not None and length > self.max_bytes:
            await _answer(send, self._too_large())
            return
        if not chunked and not length:
            await self.app(scope, receive, send)  # no body: nothing to bound
            return
        await self.app(scope, self._bounded(scope, receive), send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body is larger than {self.max_bytes} bytes", code="body_too_large", headers=_CLOSE
        )

    def _bounded(self, scope: dict[str, Any], receive: Any) -> Any:
        received = 0
        complete = False

        async def bounded_receive() -> dict[str, Any]:
            nonlocal received, complete
            message = await receive()
            if complete:
                return message  # after the body: disconnect notices pass through unchanged
            if scope.get(BODY_DEADLINE_PASSED):
                raise RequestTimeout("request body did not arrive in time", code="body_timeout", headers=_CLOSE)
            if (invalid := scope.get(BODY_INVALID)) is not None:
                raise BadRequest(invalid.message, code="invalid_http", headers=_CLOSE)
            if message["type"] == "http.disconnect":
                raise ClientClosedRequest("client closed the connection during the request body", code="client_closed")
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self._too_large()
            complete = not message.get("more_body", False)
            return message

        return bounded_receive


async def _answer(send: Any, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
