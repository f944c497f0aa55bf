"""Pooled keep-alive connections are checked before reuse: one the peer has closed is never used.

Why: when a replica dies (or closes an idle connection), the kernel holds the end of each of its
connections at once, but the router's event loop takes a pooled connection out of its pool only
when it runs the close callback. A request that takes the connection in between is written into
a dead socket; it never reached a replica, yet the router cannot prove that afterwards (the
request was sent), so it is never retried and becomes a client's 502 (issue 31, item 1). Asking
the kernel right before reuse closes that gap: then the request goes to a new connection, and
if the replica is gone, the connect is refused, which is provably never-sent and retried.

httpcore (the ``httpx`` transport) already does this check on reuse; aiohttp does not, so
:class:`CheckedConnector` adds it to aiohttp's connector.

The check cannot close the gap entirely: the replica's kernel can close the connection between
the check and the write. Then the request crosses the replica's FIN and is reset at the far end,
unread, while the router reads the FIN first. :class:`CheckedHandler` reports such an end of
stream as the reset it was (router/forward/unread.py ``reset_after_end``), so the proof that the
request was never processed applies to it as it does to any reset.
"""

from __future__ import annotations

import errno
import functools
import inspect
import logging
import select
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

from router.forward.unread import reset_after_end

log = logging.getLogger("router.upstream")

_READABLE = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL


def peer_open(fd: int) -> bool:
    """Whether the idle connected socket ``fd`` can carry a new request: True when it has
    nothing to read and no error (one ``poll`` with a zero timeout; nothing is read).

    An idle HTTP/1.1 connection has nothing to read, so any readable state means it cannot:
    end of stream (the peer closed), a reset or error, or stray bytes (a 408 before a close);
    False also for a descriptor that is not open (``fd`` < 0 or closed).
    """
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, _READABLE)
    return not poller.poll(0)


def _transport_open(protocol: Any) -> bool:
    """Whether an aiohttp protocol's connection is open as far as the kernel knows (False when
    its transport is closing or gone; True when its socket cannot be asked: nothing to go on)."""
    transport = getattr(protocol, "transport", None)
    if transport is None or transport.is_closing():
        return False
    sock = transport.get_extra_info("socket")
    if sock is None:
        return True
    return peer_open(sock.fileno())


def _hook_fits() -> bool:
    """Whether aiohttp's connector still has the private hook CheckedConnector overrides:
    ``async TCPConnector._get(self, key, traces)`` (aiohttp 3.11 on). tests/router/
    test_pooled_liveness.py fails when it does not; in production the check is then left out
    (a warning says so) rather than breaking every request."""
    base = getattr(aiohttp.TCPConnector, "_get", None)
    return (
        base is not None
        and inspect.iscoroutinefunction(base)
        and list(inspect.signature(base).parameters) == ["self", "key", "traces"]
    )


class CheckedHandler(ResponseHandler):
    """aiohttp's protocol for one upstream connection, whose end of stream is reported as a reset
    (``ConnectionResetError``, errno ECONNRESET) when the peer reset the connection after its FIN
    (:func:`router.forward.unread.reset_after_end`): the bytes the router wrote after the
    replica's close (a request that crossed it) reached a closed socket, unread. Once any byte
    of the answer to the current request arrived, a reset is reported as ``ConnectionAbortedError``
    (ECONNABORTED) instead, which proves nothing and is never retried. Any other loss of the
    connection is reported as aiohttp reports it."""

    _answer_bytes = 0  # bytes received since the current request was sent

    def set_response_params(self, **kwargs: Any) -> None:
        # aiohttp calls this once per request, before writing it (ClientSession._request)
        self._answer_bytes = 0
        super().set_response_params(**kwargs)

    def data_received(self, data: bytes) -> None:
        self._answer_bytes += len(data)
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._answer_bytes:
            # Bytes of an answer prove the replica had the request: a reset after them is not
            # evidence of anything unread (found by the attack round: a replica that sent part
            # of a head, then reset and exited, had its request retried elsewhere).
            if isinstance(exc, OSError) and exc.errno == errno.ECONNRESET:
                exc = ConnectionAbortedError(
                    errno.ECONNABORTED, f"connection reset after {self._answer_bytes} bytes of the answer"
                )
        elif exc is None:
            # asyncio closes the socket only after this returns: its state can still be read
            sock = self.transport.get_extra_info("socket") if self.transport is not None else None
            if sock is not None and reset_after_end(sock):
                exc = ConnectionResetError(errno.ECONNRESET, "connection reset by peer after its end of stream")
        super().connection_lost(exc)


def request_unwritten(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it was raised from (``__cause__``, else ``__context__``) is
    aiohttp's failure to hand the request's body to the connection ("Can not write request body",
    ``ClientOSError``): the connection was closing when aiohttp came to write it (aiohttp sends
    the headers with the body, and refuses to write into a closing transport), so at least the
    request's last bytes never left the router and the replica cannot have had the whole request.
    aiohttp raises it only from its body writer (``ClientRequest.write_bytes``);
    tests/router/test_crossed_close.py fails if that changes. Pure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, aiohttp.ClientOSError) and "Can not write request body" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _factory_fits(connector: aiohttp.TCPConnector) -> bool:
    """Whether aiohttp's connector still makes its protocols with ``self._factory`` (a partial of
    ``ResponseHandler`` taking ``loop``), the private hook :class:`CheckedConnector` replaces."""
    factory = getattr(connector, "_factory", None)
    return isinstance(factory, functools.partial) and factory.func is ResponseHandler


class CheckedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector whose pooled connections are checked with :func:`peer_open`
    before reuse: a dead one is closed and dropped, and the next one (or a new connection) is
    taken. Costs one ``poll`` system call per reused connection (about 2 us on the 2-core
    development machine).

    ``hooked`` says whether the check is in place (see :func:`_hook_fits`).
    """

    hooked = _hook_fits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if _factory_fits(self):
            self._factory = functools.partial(CheckedHandler, loop=self._loop)
        else:  # pragma: no cover - an aiohttp whose connector changed; tests/router/test_crossed_close.py fails
            log.warning(
                "aiohttp %s: its connector makes no ResponseHandler through _factory; a request that "
                "crosses a dead replica's close is not told apart (a replica's crash may cost a client a 502)",
                aiohttp.__version__,
            )

    if hooked:

        async def _get(self, key: Any, traces: Any) -> Any:
            # aiohttp takes pooled connections from the left of the key's deque of
            # (protocol, released at); the dead ones at its front are dropped first, and the
            # first live one stops the scan, so a reuse costs one poll.
            conns = getattr(self, "_conns", {}).get(key)
            while conns and not _transport_open(conns[0][0]):
                protocol, _ = conns.popleft()
                protocol.close()
            return await super()._get(key, traces)
    else:  # pragma: no cover - an aiohttp whose connector changed; the test above fails
        log.warning(
            "aiohttp %s: its connector has no async _get(key, traces); pooled connections "
            "are not checked before reuse (a replica's crash may cost a client a 502)",
            aiohttp.__version__,
        )
