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
"""

from __future__ import annotations

import inspect
import logging
import select
from typing import Any

import aiohttp

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


class CheckedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector whose pooled connections are checked with :func:`peer_open`
    before reuse: a dead one is closed and dropped, and the next one (or a new connection) is
    taken. Costs one ``poll`` system call per reused connection (about 2 us on the 2-core
    development machine).

    ``hooked`` says whether the check is in place (see :func:`_hook_fits`).
    """

    hooked = _hook_fits()

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
