"""Paths the router has no route for, with ``PROMPTEDGE_ROUTER_OTHER_PATHS=forward``: sent as
they are (method, path, query, body, content type) to a replica of a pool, answered as the
replica answered. With ``refuse`` (the default) they are OpenAI 404s (``Invalid URL``).

The pool is ``X-Model``, else the ``model`` of a JSON object body, else the only pool when the
router has one (400 ``missing_field`` otherwise; 404 ``model_not_found`` for an unknown one).
Only an OpenAI API path is forwarded (:func:`forwardable`): under ``/v1/``, without dot or
empty segments (raw or percent-encoded), and not a replica's operator route
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) nor a stored response of
``/v1/responses/{id}`` (vLLM answers it to anyone, the router's tenants are not its); anything
else is the same OpenAI 404 as with ``refuse``. The router's backend key goes with a forwarded
request, so without this a client reached the replica's ``/metrics``, ``/sim/faults`` (vLLM's
``/sleep``, ``/reset_prefix_cache``, ``/collective_rpc``) through ``/../metrics``.

Same admission (priority, rate limit: a request, no tokens), dispatch, retries, health, metrics
and log line as completions; never cached, not counted as demand for the forecaster.
"""

from __future__ import annotations

import json
import time
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response

from router.api.disconnect import CancelOnDisconnect
from router.errors import BadRequest, InvalidURL
from router.forward.forwarder import miss_headers
from router.observe.record import Record
from router.state import RouterState

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_OPERATOR = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})


def forwardable(raw_path: str) -> bool:
    """True when ``raw_path`` (the request target's path as sent, not yet decoded) may be
    forwarded to a replica: under ``/v1/``; no ``.``, ``..`` or empty segment, no backslash or
    control character, as sent or once percent-decoded; not an operator route of the replica
    nor ``/v1/responses/...``."""
    for path in (raw_path, unquote(raw_path)):
        if not path.startswith("/v1/") or "\\" in path or any(ord(c) < 0x21 or c == "\x7f" for c in path):
            return False
        segments = path.split("/")[1:]
        if any(seg in ("", ".", "..") for seg in segments):
            return False
        if path.rstrip("/") in _OPERATOR or path.startswith("/v1/responses/"):
            return False
    return True


async def forward(request: Request) -> Response:
    """Forward a request for a path the router does not serve itself (see the module docstring)."""
    state: RouterState = request.app.state.router
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    if not forwardable(raw_path.decode("latin-1")):
        raise InvalidURL(f"Invalid URL ({request.method} {request.url.path})")
    return await state.forwarder.accounted(request, lambda rec: _forward(state, request, rec))


def pool_of(headers_model: str | None, raw: bytes, pools: list[str]) -> str:
    """The pool a forwarded request goes to: ``X-Model``, else the ``model`` of a JSON object
    body, else the only pool; raises BadRequest when none of them says."""
    if headers_model:
        return headers_model
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested past the recursion limit
        body = None
    if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]:
        return body["model"]
    if len(pools) == 1:
        return pools[0]
    raise BadRequest(
        "this path is forwarded to a pool: name it with X-Model or the body's 'model'",
        param="model",
        code="missing_field",
    )


async def _forward(state: RouterState, request: Request, rec: Record) -> Response:
    raw = await request.body()
    headers = request.headers
    pool = pool_of(headers.get("x-model"), raw, list(state.pools.by_model))
    forwarder = state.forwarder
    await forwarder.admit(rec, headers, {}, pool, inference=False)
    rec.cache, rec.demand = "miss", False
    forwarder.shed_or_fall_back(rec, fallback_allowed=False)
    raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    path = raw_path + (f"?{request.url.query}" if request.url.query else "")  # as checked, not re-encoded
    async with CancelOnDisconnect(request.receive):
        upstream, lease = await forwarder.open(
            rec,
            path,
            {},
            raw,
            headers,
            method=request.method,
            content_type=headers.get("content-type", "application/json"),
        )
        if upstream.status_code >= 400:
            return await forwarder.failed(rec, upstream, lease)
        content = await forwarder.read_answer(rec, upstream, lease)
    lease.replica.health.on_success(time.monotonic())
    return Response(
        content,
        status_code=upstream.status_code,
        media_type=upstream.headers.get("content-type", "application/json"),
        headers=miss_headers(rec, lease),
    )
