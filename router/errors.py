"""The router's error tree and its OpenAI-style JSON form.

    RouterError                 the root: every error the router raises on purpose
    ├── APIError                answered to the client as OpenAI-style JSON (the tree below)
    ├── RedisUnavailable        a Redis call of the router's own failed (router/redis_errors.py)
    ├── StartupError            the process cannot start as configured (router/process/launch.py)
    ├── DiscoveryError          replicas cannot be discovered (router/discovery/base.py)
    │   └── ReplicasFileError   the replicas file is unreadable (router/discovery/file.py)
    ├── NoServedVersion         the API server serves no EndpointSlice version (also ValueError)
    ├── CredentialError         an upstream credential is unusable (router/forward/credentials.py)
    └── TracingError            OpenTelemetry tracing cannot be set up (also RuntimeError)

Each keeps the built-in base it had before the root existed, so a handler that catches
``ValueError`` or ``RuntimeError`` still catches it. Every error a client can see is an
:class:`APIError`; it renders as ``{"error": {"message", "type", "param", "code"}}`` with its
HTTP status. Third-party errors are translated into this tree at one boundary each: httpx's in
router/forward/upstream.py, redis-py's in router/redis_errors.py (the cache translates its own).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any


class RouterError(Exception):
    """The root of every error the router package raises on purpose."""


class RedisUnavailable(RouterError):
    """A Redis call of the router's own (rate limits, response affinity, warming, health) failed:
    a connection refused or lost, a timeout, a cluster without a node that answers, a command
    refused. Raised by ``router.redis_errors.redis_failures``; the message is the original
    error's, ``kind`` its class name (for logs), ``__cause__`` the original error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.kind = type(error).__name__


class APIError(RouterError):
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
    """408: the request's body did not arrive in time (router/process/limits.py ``body_timeout_s``)."""

    status = 408
    type = "invalid_request_error"


class PayloadTooLarge(APIError):
    """413: the request body is over ``max_body_bytes`` (router/process/limits.py)."""

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

    ``evidence``: what the failure says about the replica's health (router/fleet/health.py):
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


MAX_REPLICA_MESSAGE = 200  # characters of a replica's own error text that reach the client
_PARSED_ERROR_BYTES = 65_536  # a larger error body is not read for a message (no JSON parse of it)


def is_openai_error(body: Any) -> bool:
    """True for OpenAI's error shape: an object whose ``error`` is an object with a text ``message``."""
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str)


def replica_error_body(status: int, content: bytes, content_type: str) -> bytes | None:
    """The body to answer for a replica's own 4xx ``status`` with ``content``: None when it is
    already OpenAI error JSON (relayed as it came); else OpenAI error JSON with a message of at
    most MAX_REPLICA_MESSAGE printable characters: the text of a JSON ``detail`` / ``message``
    / ``error`` string (FastAPI, older vLLM, TGI) or the first line of a plain-text body, and
    for anything else (HTML, binary, a JSON shape without text) only the status (a page can
    name paths, hosts and versions of the replica's)."""
    text = None
    if len(content) <= _PARSED_ERROR_BYTES:
        try:
            body = json.loads(content)
        except (ValueError, RecursionError):
            body = None
        if is_openai_error(body):
            return None
        if isinstance(body, dict):
            text = next((body[k] for k in ("detail", "message", "error") if isinstance(body.get(k), str)), None)
        elif body is None and content_type.split(";")[0].strip().lower() == "text/plain":
            text = content.decode("utf-8", errors="replace").strip().split("\n", 1)[0]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    message = _printable(text) if text else ""
    if not message:
        message = f"the replica answered {status} {phrase}"
    code = phrase.lower().replace(" ", "_").replace("-", "_") if phrase != "Error" else "replica_error"
    error = APIError(message, code=code)
    error.type = "rate_limit_error" if status == 429 else "invalid_request_error"
    return json.dumps(error.body()).encode()


def _printable(text: str) -> str:
    """``text`` without control characters, whitespace runs made one space, cut to MAX_REPLICA_MESSAGE."""
    clean = " ".join("".join(c if c.isprintable() else " " for c in text[: 4 * MAX_REPLICA_MESSAGE]).split())
    return clean if len(clean) <= MAX_REPLICA_MESSAGE else clean[: MAX_REPLICA_MESSAGE - 3] + "..."
