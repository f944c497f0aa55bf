"""How the router is served: uvicorn (uvloop + httptools) with the connection limits of
router/process/limits.py enforced where only the HTTP server can see them.

- request line + headers: at most ``max_header_bytes`` (431, counted as bytes arrive, before
  httptools buffers a header), ``max_headers`` headers (431), a target of ``max_url_bytes`` (414);
- time: the head must be complete ``header_timeout_s`` after the connection opens or the
  request's first byte (slowloris: trickling bytes resets nothing), the body
  ``body_timeout_s`` after the head (408), and an idle keep-alive connection is closed after
  ``keepalive_timeout_s``;
- connections: at most ``clients`` open (:func:`router.process.limits.connection_budget` below the
  open-files limit, which is first raised to its hard limit); at the cap the oldest connection
  without a request in flight is closed to make room, else the oldest whose body has not
  advanced for ``body_stall_s`` (answered 408) (a WARNING, at most every 10 s); when every
  one has a request in flight, ``reserve`` more connections are served only for ``/health`` and
  ``/metrics`` (503 ``server_busy`` otherwise), and past those a connection is answered 503 and
  closed, so ``accept()`` never fails for want of a file descriptor.

Refusals are OpenAI error JSON with ``Connection: close``; malformed HTTP too (400 ``invalid_http``).
A refusal that leaves part of the request unread (headers over the limit, a body refused by
router/api/bodylimit.py before or while it arrives) is followed by a lingering close
(router/process/linger.py): half-close, discard what still arrives up to ``lingering_max_bytes``,
``lingering_timeout_s`` idle and ``lingering_time_s`` in all, then close, so that the client
reads its 431 / 413 instead of a TCP reset. Connections refused at the connection cap (503)
and connections evicted to make room are closed at once: they are what the cap is for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
import time
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from router.api.bodylimit import BODY_DEADLINE_PASSED, BODY_INVALID
from router.errors import APIError, BadRequest, HeadersTooLarge, NoReplica, RequestTimeout, URITooLong
from router.process.heap import frozen_after_startup
from router.process.limits import ConnectionBudget, Limits
from router.process.linger import Lingering

log = logging.getLogger("router.server")
WARN_EVERY_S = 10.0
RESERVED_PATHS = frozenset({"/health", "/metrics"})


class ServerBusy(NoReplica):
    """503: the router is at its connection cap and this connection cannot be served."""


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as Go's runtime does); returns the soft
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    # Linux never reports infinity for open files (fs.nr_open bounds it); other systems might
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


class ConnectionGuard:
    """The open client connections of one server, oldest first, against a :class:`ConnectionBudget`."""

    def __init__(self, budget: ConnectionBudget) -> None:
        self.budget = budget
        self.normal: dict[LimitedHttpProtocol, None] = {}  # insertion-ordered: oldest first
        self.reserved: set[LimitedHttpProtocol] = set()
        self._warned_at = -WARN_EVERY_S
        self._since_warning = {"closed idle": 0, "closed stalled body": 0, "health only": 0, "refused": 0}

    def admit(self, conn: LimitedHttpProtocol) -> str:
        """``"normal"``, ``"reserve"`` (serve /health and /metrics only) or ``"refuse"``."""
        if len(self.normal) < self.budget.clients:
            self.normal[conn] = None
            return "normal"
        victim = next((c for c in self.normal if not c.busy), None)
        if victim is not None:
            del self.normal[victim]
            victim.transport.close()
            self.normal[conn] = None
            self._warn("closed idle")
            return "normal"
        # then the oldest whose body has stopped arriving: one client's stalled uploads must not
        # hold every slot until body_timeout_s (issue 13, A6); it is answered 408
        now = conn.loop.time()
        victim = next((c for c in self.normal if c.stalled_in_body(now)), None)
        if victim is not None:
            del self.normal[victim]
            victim.evict_stalled()
            self.normal[conn] = None
            self._warn("closed stalled body")
            return "normal"
        if len(self.reserved) < self.budget.reserve:
            self.reserved.add(conn)
            self._warn("health only")
            return "reserve"
        self._warn("refused")
        return "refuse"

    def remove(self, conn: LimitedHttpProtocol) -> None:
        self.normal.pop(conn, None)
        self.reserved.discard(conn)

    def _warn(self, what: str) -> None:
        self._since_warning[what] += 1
        now = time.monotonic()
        if now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        counts = ", ".join(f"{n} {w}" for w, n in self._since_warning.items() if n)
        log.warning(
            "connection cap %d reached (RLIMIT_NOFILE %d, %d reserved for /health): %s",
            self.budget.clients,
            self.budget.nofile,
            self.budget.reserve,
            counts,
        )
        self._since_warning = dict.fromkeys(self._since_warning, 0)


class _Refusal(Exception):
    """Raised from a parser callback to stop parsing; carries the error to answer."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of this module; ``limits`` and ``guard`` are
    set on the subclass :func:`protocol_class` makes."""

    limits: Limits
    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._timer: asyncio.TimerHandle | None = None
        self._refusal: APIError | None = None
        self._refused = False
        self._body_at: float | None = None  # loop time of the last body byte (or of the head's end)
        self._mid_message = False  # a request has begun and its last byte has not been parsed
        self._linger: Lingering | None = None  # set once the answer is written and the rest is discarded
        self._unread_after = False  # bytes after (or inside) the request in flight broke the parser

    @property
    def busy(self) -> bool:
        """A request on this connection is being answered (so it must not be closed to make room)."""
        return self.cycle is not None and not self.cycle.response_complete

    def stalled_in_body(self, now: float) -> bool:
        """The request's body has stopped arriving: no byte for ``limits.body_stall_s`` seconds
        (``now``: loop time) and nothing answered yet, so it may be closed to make room."""
        cycle = self.cycle
        return (
            self._body_at is not None
            and not self._in_head
            and cycle is not None
            and not cycle.response_started
            and now - self._body_at >= self.limits.body_stall_s
        )

    def evict_stalled(self) -> None:
        """Answer 408 ``body_timeout`` (Connection: close) and close: the connection's slot is needed."""
        self._refused = True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(
                _error_bytes(
                    RequestTimeout(
                        f"request body stalled for {self.limits.body_stall_s:g} s while the router is at its "
                        "connection limit",
                        code="body_timeout",
                    )
                )
            )
        self.transport.close()

    # connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        role = self.guard.admit(self)
        if role == "refuse":
            # closed at once: lingering would hold the descriptor the cap is protecting
            self._refuse(ServerBusy("the router is at its connection limit", code="server_busy"), linger=False)
            return
        if role == "reserve":
            self.app = _reserved_only(self.app)
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
        self.guard.remove(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # the answer is written: what still comes is dropped unread
            self._linger.discard(len(data))
            return
        while data and not self._refused:
            if self._in_head:
                room = self.limits.max_header_bytes - self._head_bytes
                if room <= 0:
                    self._refuse(
                        HeadersTooLarge(
                            f"request headers are larger than {self.limits.max_header_bytes} bytes",
                            code="headers_too_large",
                        )
                    )
                    return
                if len(data) > room:
                    piece, data = data[:room], data[room:]
                else:
                    piece, data = data, b""
                self._head_bytes += len(piece)
            else:
                piece, data = data, b""
                self._body_at = self.loop.time()
            super().data_received(piece)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a parse error (ours from a callback included) as OpenAI JSON
        self._refuse(self._refusal or BadRequest(f"invalid HTTP request: {msg}", code="invalid_http"))

    # parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        self._mid_message = True
        if self._timer is None:  # a new request on a kept-alive connection: its head's deadline
            self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_url_bytes:
            self._stop(
                URITooLong(f"request target is longer than {self.limits.max_url_bytes} bytes", code="url_too_long")
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._stop(HeadersTooLarge(f"more than {self.limits.max_headers} request headers", code="too_many_headers"))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.transport is self.transport:
            # the app's answer with Connection: close (a 413 from router/api/bodylimit.py before or
            # during the body) closes through this, so it can linger over the unread rest
            self.cycle.transport = _AnswerThenLinger(self.transport, self._close_after_answer)
        self._body_at = self.loop.time()
        self._arm(self.limits.body_timeout_s, self._body_timed_out)

    def on_message_complete(self) -> None:
        self._disarm()
        self._body_at = None
        self._in_head = True
        self._head_bytes = 0
        self._mid_message = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._linger is not None:  # no keep-alive timer, no pipelined request: it is closing
            self.server_state.total_requests += 1
            return
        super().on_response_complete()

    # limits
    def _stop(self, error: APIError) -> None:
        self._refusal = error
        raise _Refusal(error.message)

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if not self.busy:  # a pipelined head behind a request in flight waits for it
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._timer = None
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.response_started:
            self.transport.close()
            return
        self.scope[BODY_DEADLINE_PASSED] = True  # type: ignore[literal-required]
        cycle.message_event.set()  # the app's receive() returns and raises 408 (router/api/bodylimit.py)

    def _refuse(self, error: APIError, linger: bool = True) -> None:
        """Answer ``error`` (unless a response is under way) and close the connection, lingering
        (the rest of the request discarded within the limits' bounds) when ``linger``."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self.busy and cycle is not None:
            # a request was already handed to the app: it is answered first, then the connection
            # closes (lingering over what was not read). If its own body is what broke, the
            # app's next receive() raises ``error`` (400 JSON, router/api/bodylimit.py);
            # bytes after a whole request wait unread. Nothing more is parsed (``_refused``).
            self._unread_after = True
            cycle.keep_alive = False
            if cycle.more_body and not cycle.response_started:
                self.scope[BODY_INVALID] = error  # type: ignore[literal-required]
                cycle.message_event.set()
            return
        self.transport.write(_error_bytes(error))
        if linger:
            self._start_lingering()
        else:
            self.transport.close()

    def _close_after_answer(self) -> None:
        """The app has answered with ``Connection: close``: linger over the rest of a request
        not yet read whole, else close."""
        if (self._mid_message or self._unread_after) and self._linger is None and not self.transport.is_closing():
            self._disarm()  # the body's deadline no longer applies: the lingering bounds do
            self._start_lingering()
        elif self._linger is None:
            self.transport.close()

    def _start_lingering(self) -> None:
        limits = self.limits
        self._linger = Lingering(
            self.transport, self.loop, limits.lingering_max_bytes, limits.lingering_timeout_s, limits.lingering_time_s
        )
        self.flow.resume_reading()  # uvicorn pauses reading while a body waits for the app
        self._linger.start()


class _AnswerThenLinger:
    """The transport as a request's uvicorn cycle sees it: ``close()`` (after an answer with
    ``Connection: close``) calls ``on_close`` instead, which may linger; the rest is the transport's."""

    def __init__(self, transport: asyncio.Transport, on_close: Any) -> None:
        self._transport = transport
        self._on_close = on_close

    def close(self) -> None:
        self._on_close()

    def __getattr__(self, name: str) -> Any:  # write, is_closing, get_extra_info...
        return getattr(self._transport, name)


def _error_bytes(error: APIError) -> bytes:
    body = json.dumps(error.body()).encode()
    return b"".join(
        [
            STATUS_LINE[error.status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def _reserved_only(app: Any) -> Any:
    """``app`` for /health and /metrics only; anything else is 503 ``server_busy``, then closed."""
    busy = ServerBusy("the router is at its connection limit; only /health and /metrics are served", code="server_busy")
    body = json.dumps(busy.body()).encode()

    async def reserved(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in RESERVED_PATHS:
            await app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": busy.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body)),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return reserved


def protocol_class(limits: Limits, budget: ConnectionBudget) -> type[LimitedHttpProtocol]:
    """A protocol class for uvicorn's ``http=`` with ``limits`` and one guard over ``budget``."""
    return type("RouterHttpProtocol", (LimitedHttpProtocol,), {"limits": limits, "guard": ConnectionGuard(budget)})


def serve(app: Any, limits: Limits, budget: ConnectionBudget, host: str, port: int, log_level: str) -> None:
    """Run ``app`` with uvicorn (uvloop, the limited httptools protocol) until stopped."""
    if budget.note:
        log.warning("RLIMIT_NOFILE %d: %s to fit (router/README.md, Limits)", budget.nofile, budget.note)
    # the heap as start-up left it is frozen: the collector stops walking it (router/process/heap.py)
    config = uvicorn.Config(
        frozen_after_startup(app),
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_class(limits, budget),
        log_level=log_level,
        access_log=False,
        log_config=None,
        timeout_keep_alive=limits.keepalive_timeout_s,
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # the second Ctrl-C: uvicorn re-raises it once it has stopped
        pass
    if not server.started:  # as uvicorn.run: a failed start-up (port taken, lifespan error) exits 3
        sys.exit(STARTUP_FAILURE)


def not_cancelled(record: logging.LogRecord) -> bool:
    """Logging filter: drop a record whose exception is CancelledError. A second Ctrl-C (uvicorn's
    force quit) cancels the requests still in flight and the lifespan; uvicorn logs each as an
    error with its traceback (the lifespan's as the text Starlette sends in
    ``lifespan.shutdown.failed``), although a cancelled task at shutdown is what was asked for."""
    if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
        return False
    text = record.getMessage()
    return not (text.startswith("Traceback") and text.rstrip().endswith("asyncio.exceptions.CancelledError"))
