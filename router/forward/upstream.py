"""HTTP to replicas: the client factory and the one place httpx errors are translated.

The transport is a setting (``upstream_transport``): ``aiohttp`` (the ``httpx-aiohttp``
transport) or ``httpx`` (httpx's own httpcore pool); ``bench/router_overhead.py`` measures
both, see router/README.md for the numbers behind the default.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpcore
import httpx
from httpx_aiohttp import AiohttpTransport

from router.errors import UpstreamError, UpstreamTimeout
from router.forward.liveconn import CheckedConnector, request_unwritten
from router.forward.unread import port_closed, reset_by_peer

RETRYABLE_STATUS = frozenset({429, 503})
# Idle pooled connections are closed after this many seconds, before the replica's own
# keep-alive timeout (uvicorn's --timeout-keep-alive defaults to 5 s; vLLM's OpenAI server and
# the sim run on uvicorn), so the router does not write a request into a connection the replica
# is closing at that moment: such a request might have been read, so it is never retried.
KEEPALIVE_EXPIRY_S = 2.0
# The most of a replica's non-stream answer the router reads (bytes). A 32k-token answer with
# top_logprobs is a few MB; a replica that sends more, or never ends, gets 502 and the read
# stops there. Error bodies: read_error_body.
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class NotProcessed(UpstreamError):
    """A failure that proves the replica never processed the request: the only failures the
    service retries on another replica (router/forward/service.py ``open_upstream``), and only
    before any byte of an answer reached the client. Evidence of a replica that cannot be
    reached (``connect_failure``) for its circuit breaker."""

    evidence = "connect_failure"


class ConnectFailed(NotProcessed):
    """No connection to the replica was ever established (refused, unreachable, connect
    timeout): nothing was sent, so the request is safe to retry elsewhere."""


class ResetUnread(NotProcessed):
    """The replica's kernel reset the connection before the response's headers, so part of the
    request was still unread when its socket closed (or arrived after it closed, or was never
    written: a request that crossed the replica's close), and right after that (within 200 ms) fresh
    connects to its port were refused: the process is gone and never had the whole request (a replica SIGKILLed
    while the request was on its way; the reasoning and its limits: router/forward/unread.py).
    Safe to retry elsewhere. A reset while the port still accepts, or a clean end of stream
    (the replica may have read the request, then died), stays an UpstreamError: never retried."""


class RetryableStatus(UpstreamError):
    """The replica answered 429 or 503 before any byte reached the client: retry elsewhere.
    ``retry_after_s``: its ``Retry-After`` in seconds (RFC 9110 section 10.2.3, delay-seconds
    form only; None when absent or an HTTP date), for the replica's back-off."""

    evidence = None  # busy or not ready: not a fault (the /health probes judge readiness)

    def __init__(self, message: str, retry_after_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


_DELAY_SECONDS = re.compile(r"[ \t]*([0-9]+)[ \t]*")  # RFC 9110's 1*DIGIT: ASCII digits only


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` as seconds when it is delay-seconds (a non-negative integer of ASCII
    digits), else None. Not ``str.isdigit``: it is true for "\u00b2" and other Unicode digits,
    which ``float`` refuses (a replica sending one made every request it got a 500)."""
    match = _DELAY_SECONDS.fullmatch(value) if value is not None else None
    return float(match.group(1)) if match is not None else None


class Progress:
    """How far one request got on the wire, recorded by the transports' trace hooks.

    traced: the transport reported on this request at all (without that, nothing is
    assumed and no failure is retryable); connected: a connection (new or pooled) carried it;
    sent: its request headers were written; answered: a byte of the answer arrived (httpcore's
    streams only; aiohttp's protocol reports it through the error, router/forward/liveconn.py).
    """

    __slots__ = ("traced", "connected", "sent", "answered")

    def __init__(self) -> None:
        self.traced = False
        self.connected = False
        self.sent = False
        self.answered = False

    async def httpcore_event(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension (``connection.connect_tcp.complete``,
        ``http11.send_request_headers.started``, ...)."""
        self.traced = True
        if name == "connection.connect_tcp.complete" or name.startswith(("http11.", "http2.")):
            self.connected = True
        if ".send_request_headers." in name:
            self.sent = True


class _AnsweredStream(httpcore.AsyncNetworkStream):
    """An httpcore network stream that marks the current request's Progress ``answered`` when a
    read returns bytes (httpcore reads in the task that sends the request, where the Progress
    context variable is set)."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._stream.read(max_bytes, timeout)
        if data and (progress := _PROGRESS.get()) is not None:
            progress.answered = True
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _AnsweredStream(await self._stream.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _AnsweredBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend whose TCP streams are :class:`_AnsweredStream`."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _AnsweredStream(await self._backend.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _AnsweredStream(await self._backend.connect_unix_socket(*args, **kwargs))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


# aiohttp's trace hooks have no per-request handle that survives httpx-aiohttp, so the
# request's Progress travels in a context variable (set in the task that sends the request;
# aiohttp runs the hooks in that task).
_PROGRESS: ContextVar[Progress | None] = ContextVar("promptedge_upstream_progress", default=None)


def _aiohttp_hook(attribute: str) -> Any:
    async def hook(session: aiohttp.ClientSession, context: SimpleNamespace, params: Any) -> None:
        progress = _PROGRESS.get()
        if progress is not None:
            progress.traced = True
            if attribute:
                setattr(progress, attribute, True)

    return hook


def _aiohttp_trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_aiohttp_hook(""))
    trace.on_connection_create_end.append(_aiohttp_hook("connected"))
    trace.on_connection_reuseconn.append(_aiohttp_hook("connected"))
    trace.on_request_headers_sent.append(_aiohttp_hook("sent"))
    return trace


def _timed_out(exc: httpx.HTTPError) -> bool:
    """Whether the transport gave up waiting, judged from the original error: httpx-aiohttp
    maps every dropped aiohttp connection ("Server disconnected") to ``httpx.ConnectTimeout``,
    so there httpx's class says nothing; httpx's own transport maps faithfully."""
    cause = exc.__cause__
    if isinstance(cause, aiohttp.ClientError):
        return isinstance(cause, asyncio.TimeoutError)  # ServerTimeoutError and its subclasses
    return isinstance(exc, httpx.TimeoutException)


class Upstream:
    """Sends requests to replicas through one pooled httpx transport.

    transport: ``aiohttp`` (httpx-aiohttp) or ``httpx`` (httpcore). Requests go straight to the
    transport as ``httpx.Request`` objects: the client layer (auth, redirects, cookies, event
    hooks) has nothing to do for a proxy and costs a measurable share of a request. Both
    transports trace each request's progress (connection, request headers written), which is
    what decides whether a failure may be retried (:meth:`open`). Both check a pooled
    connection before reusing it, so one the replica has already closed is never used
    (router/forward/liveconn.py).
    """

    def __init__(self, transport: str, max_connections: int) -> None:
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        self._httpcore = transport != "aiohttp"
        if self._httpcore:
            self.transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(limits=limits)
            # whether any byte of an answer arrived decides whether a reset proves anything; the
            # pool takes its backend when it makes a connection (tests/router/test_reset_unread.py
            # fails if httpx's transport stops keeping its pool in ``_pool``)
            pool = self.transport._pool
            pool._network_backend = _AnsweredBackend(pool._network_backend)
        else:

            def session() -> aiohttp.ClientSession:  # made on first use, inside the event loop
                # checked before reuse: a connection the replica has closed is never written into
                connector = CheckedConnector(limit=max_connections, keepalive_timeout=KEEPALIVE_EXPIRY_S)
                return aiohttp.ClientSession(connector=connector, trace_configs=[_aiohttp_trace()])

            self.transport = AiohttpTransport(limits=limits, client=session)
        self._urls: dict[str, httpx.URL] = {}

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self.transport.aclose()

    async def open(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        connect_timeout_s: float,
        ttfb_timeout_s: float,
        method: str = "POST",
    ) -> httpx.Response:
        """Send ``body`` to ``url`` (``method``, POST by default) and return the response with
        its body not yet read.

        Timeouts in seconds. Raises NotProcessed when the replica provably never processed
        the request (the only failures retried elsewhere): ConnectFailed (no connection was
        ever established) or ResetUnread (reset with the request unread by a replica whose
        port is closed now); RetryableStatus (429/503), UpstreamTimeout (no response headers
        within ``ttfb_timeout_s``; 504), UpstreamError (the connection broke after it carried
        the request, or any failure the transport did not trace; 502).
        The caller must close the returned response.
        """
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        timeout = {"connect": connect_timeout_s, "read": ttfb_timeout_s, "write": connect_timeout_s, "pool": None}
        progress = Progress()
        extensions: dict[str, Any] = {"timeout": timeout}
        if self._httpcore:
            extensions["trace"] = progress.httpcore_event
        request = httpx.Request(method, parsed, content=body, headers=headers, extensions=extensions)
        token = _PROGRESS.set(progress)
        try:
            response = await self.transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            failure = _failed(exc, progress, url, ttfb_timeout_s)
            # A reset before any response header, or a request whose body could not be written: the
            # replica never had the whole request; is it gone? (router/forward/unread.py,
            # liveconn.py; a few connects, at most PROBE_S)
            if (
                type(failure) is UpstreamError
                and not progress.answered
                and (reset_by_peer(exc) or request_unwritten(exc))
                and await port_closed(parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80))
            ):
                failure = ResetUnread(
                    f"replica {url} never had the whole request (reset unread or never written) and no "
                    f"longer listens: never processed ({exc!r})",
                    code="replica_unreachable",
                )
            raise failure from None
        finally:
            _PROGRESS.reset(token)
        response.request = request
        if response.status_code in RETRYABLE_STATUS:
            await response.aclose()
            raise RetryableStatus(
                f"replica {url} answered {response.status_code}",
                retry_after_s(response.headers.get("retry-after")),
                code="replica_busy",
            )
        return response


def _failed(exc: httpx.HTTPError, progress: Progress, url: str, ttfb_timeout_s: float) -> UpstreamError:
    """The error for a request that got no response, from how far it got (``progress``)."""
    if progress.traced and not progress.connected:
        return ConnectFailed(f"replica {url} unreachable: {exc!r}", code="replica_unreachable")
    if _timed_out(exc):
        return UpstreamTimeout(f"replica {url} sent no response within {ttfb_timeout_s} s", code="replica_timeout")
    stage = "after the request was sent" if progress.sent else "after connecting"
    return UpstreamError(f"replica {url} failed {stage}: {exc!r}", code="replica_error")


async def read_body(
    response: httpx.Response, url: str, total_s: float | None = None, max_bytes: int = MAX_ANSWER_BYTES
) -> bytes:
    """The whole body of an open response, within ``total_s`` seconds in all (None: no bound
    but the read timeout, which every chunk resets, so a replica sending a byte at a time could
    hold the request for ever) and ``max_bytes`` (decoded): past it UpstreamError 502
    ``replica_answer_too_large``; translates transport errors and the bounds (502/504)."""
    return await _read_bounded(response, url, total_s, max_bytes, "response")


# A replica's error answer is read only this far (its message is relayed cut to 200 characters,
# router/errors.py replica_error_body; a 5xx body is logged cut to 300 bytes), within this long.
ERROR_BODY_MAX_BYTES = 64 * 1024
ERROR_BODY_TIMEOUT_S = 10.0


async def read_error_body(
    response: httpx.Response, url: str, max_bytes: int = ERROR_BODY_MAX_BYTES, total_s: float = ERROR_BODY_TIMEOUT_S
) -> bytes:
    """At most ``max_bytes`` of an error answer's body, read within ``total_s`` seconds; the
    rest is never read (the response is closed, so its connection is dropped). Translates
    transport errors and the bound as :func:`read_body` does."""
    return await _read_bounded(response, url, total_s, max_bytes, "error")


async def _read_bounded(response: httpx.Response, url: str, total_s: float | None, max_bytes: int, what: str) -> bytes:
    """Read ``response`` within both bounds and close it. Past ``max_bytes``: a ``response``
    is an UpstreamError (it would be relayed or cached incomplete), an ``error`` is cut there
    (only its start is used)."""
    body = bytearray()
    try:
        async with asyncio.timeout(total_s):
            async for chunk in response.aiter_bytes():
                body += chunk
                if what == "error" and len(body) >= max_bytes:
                    break
                if len(body) > max_bytes:
                    raise UpstreamError(
                        f"replica {url} sent an answer over {max_bytes} bytes", code="replica_answer_too_large"
                    )
    except TimeoutError:
        raise UpstreamTimeout(
            f"replica {url} took over {total_s:g} s to send its {what}", code="replica_timeout"
        ) from None
    except httpx.HTTPError as exc:
        if _timed_out(exc):
            raise UpstreamTimeout(f"replica {url} timed out sending its {what}", code="replica_timeout") from None
        raise UpstreamError(f"replica {url} broke off its {what}: {exc!r}", code="replica_error") from None
    finally:
        await response.aclose()
    return bytes(body[:max_bytes])


async def iter_body(response: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The raw body chunks of an open response; translates transport errors (502/504)."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        if _timed_out(exc):
            raise UpstreamTimeout(f"replica {url} stream timed out", code="replica_timeout") from None
        raise UpstreamError(f"replica {url} broke off its stream: {exc!r}", code="replica_error") from None
