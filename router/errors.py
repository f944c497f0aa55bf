"""The router's error tree and its OpenAI-style JSON form.

Every error a client can see is an :class:`APIError`; it renders as
``{"error": {"message", "type", "param", "code"}}`` with its HTTP status. Errors from httpx
and redis are translated into this tree at one boundary each (``upstream.py`` and the cache).
"""

from __future__ import annotations

import json


class APIError(Exception):
    """An error answered to the client as OpenAI-style JSON.

    status: HTTP status; type: OpenAI error type (``invalid_request_error``, ...);
    param: the offending request field (dotted path) or None; code: short machine code.
    """

    status = 500
    type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        """The OpenAI error JSON object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def sse_event(self) -> bytes:
        """The error as one SSE ``data:`` event (for failures after a stream has started)."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


class BadRequest(APIError):
    """400: the request body is not valid JSON or not a valid OpenAI request."""

    status = 400
    type = "invalid_request_error"


class RequestTimeout(APIError):
    """408: the request's body did not arrive in time (router/limits.py ``body_timeout_s``)."""

    status = 408
    type = "invalid_request_error"


class PayloadTooLarge(APIError):
    """413: the request body is over ``max_body_bytes`` (router/limits.py)."""

    status = 413
    type = "invalid_request_error"


class URITooLong(APIError):
    """414: the request target (path and query string) is over ``max_url_bytes``."""

    status = 414
    type = "invalid_request_error"


class HeadersTooLarge(APIError):
    """431: the request's headers are over ``max_header_bytes`` or ``max_headers``."""

    status = 431
    type = "invalid_request_error"


class Unauthorized(APIError):
    """401: a key is required and the one given is missing or wrong."""

    status = 401
    type = "invalid_request_error"


class Forbidden(APIError):
    """403: the operation is switched off on this router."""

    status = 403
    type = "invalid_request_error"


class ModelNotFound(APIError):
    """404: no pool serves the requested model."""

    status = 404
    type = "invalid_request_error"


class RateLimited(APIError):
    """429: admission refused the request (token bucket or load shedding)."""

    status = 429
    type = "rate_limit_error"


class UpstreamError(APIError):
    """502: the replica failed (error status, unreachable, broke off, timed out).

    ``evidence``: what the failure says about the replica's health (router/health.py):
    ``server_error`` (it answered 5xx or broke its answer off), ``connect_failure`` (no
    connection could be made), or None (no evidence: a deadline or a busy answer).
    """

    status = 502
    type = "upstream_error"
    evidence: str | None = "server_error"


class UpstreamTimeout(UpstreamError):
    """504: the replica did not answer in time (TTFB or stream idle timeout). The deadline is
    the request's priority class, which the client chose, so it is no evidence of ill health."""

    status = 504
    type = "timeout"
    evidence = None


class NoReplica(APIError):
    """503: every replica of the pool is down, warming up or ejected."""

    status = 503
    type = "service_unavailable"


class InvalidURL(APIError):
    """404: no route for this path (OpenAI's ``Invalid URL (METHOD /path)``)."""

    status = 404
    type = "invalid_request_error"
