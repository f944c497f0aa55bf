"""A reset with the request still unread: the replica provably never processed it.

Why (issue 31, item 1): SIGKILL tears a process's memory down before its file descriptors, so
for 15-90 ms a dead replica's kernel still accepts connections and request bytes that nobody will
ever read. A request written then never reached the replica, yet the router saw it "sent"; the
never-twice rule kept it a client's 502, several per crash with several router workers.

The proof that such a request was never processed, from two facts:

1. **A reset means some of the request was unread.** Linux closes a TCP socket that still has
   unread bytes in its receive buffer with a reset (RST: ``ECONNRESET`` at the router) instead
   of a FIN (RFC 2525 2.17; ``tcp_close``), and so it does for the connections still in a
   listening socket's accept queue when that closes, and for data arriving at a socket that is
   gone. A replica that read the whole request and then died leaves an empty buffer: the router
   sees a clean end of stream ("Server disconnected"), never a reset. The router sends one request
   per connection and nothing after it, so whatever was unread includes the request's last
   byte: the replica never had the whole request (Content-Length framing), so it cannot have
   started it. A reset arriving before the response's headers is therefore such a close.
2. **The process is really gone.** A reset can also come from something else than the replica's
   own kernel closing its socket: a middlebox (proxy, sidecar, NAT or firewall dropping state),
   another process of a multi-process server, a server aborting a connection on purpose
   (``SO_LINGER`` 0) after reading a request. So a reset is only believed when, right after it,
   fresh TCP connects to the replica's host and port are refused or the host is unreachable
   (:func:`port_closed`, polled for at most ``PROBE_S``): nothing listens there any more. A
   port that still accepts (a sidecar, a sibling process, a replica restarted at once), a
   connect that times out (a partition, a full backlog: no verdict) or any other failure keeps
   the failure what it was: a 502, never sent twice.

Assumed, and true of uvicorn (vLLM's OpenAI server, the sim): the replica's server does not
abort a connection with a reset after reading a request and then exit within the probe's time
(nor after a FIN: ``shutdown(SHUT_WR)`` then ``SO_LINGER`` 0; Linux itself sends a FIN followed at
once by a reset when it closes a socket under memory pressure or past ``tcp_max_orphans``
(``tcp_check_oom`` in ``__tcp_close``), which a replica dying then would also look like);
nor does a proxy between router and replica (one that passed the whole request on, then reset
the router's connection and closed its own port within 200 ms). A proxy that dies itself is
covered: it can only have passed on what it read.

Once any byte of an answer arrived, no reset counts: the replica had the request.

A reset that follows the replica's FIN counts too (:func:`reset_after_end`): a request written
into a pooled connection at the moment the dead replica's kernel closes it with an empty buffer.
The FIN crosses the request, which then reaches a socket that is already closed and is reset
there, unread. The router reads the FIN first, a clean end of stream, but its own socket knows
better: a reset came after it, and the only bytes the router sent after the replica's close are
this request's. A replica that read the whole request and then died closes with a FIN and no
reset follows (nothing more arrives). On loopback the reset is there before the router reads the
FIN; to a replica one network round trip away it may come after, and then the request stays a
502 (the converse error, a retry of a processed request, cannot happen that way).

Only ``errno`` ``ECONNRESET`` from the kernel counts. aiohttp raises a ``ConnectionResetError``
without an errno ("Cannot write to closing transport") when it saw the connection close before
writing: why it closed (a reset or a clean end) is not known there, so it does not count; nor
does ``EPIPE`` as an error of a call (the router cannot tell which bytes it concerned); the
socket's state after the FIN is what :func:`reset_after_end` reads.
"""

from __future__ import annotations

import asyncio
import errno
import socket

# How long the port is polled (seconds): a closed port on a live host refuses within one round
# trip, so a dead replica's reset is retried within a few ms; a reset from something whose port
# still listens costs this long before its 502. Only on this rare failure, on the request's path.
PROBE_S = 0.2
# Connect failures that say nothing listens on the replica's port any more
_GONE = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})


def reset_by_peer(exc: BaseException) -> bool:
    """Whether ``exc`` or one of the errors it was raised from (``__cause__``, else
    ``__context__``) is an OSError with ``errno`` ECONNRESET: the peer's kernel reset the
    connection. Pure: nothing is sent or read."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ECONNRESET:
            return True
        current = current.__cause__ or current.__context__
    return False


async def port_closed(host: str, port: int, timeout_s: float = PROBE_S) -> bool:
    """Whether new TCP connections to ``port`` at every address ``host`` resolves to are refused
    (or that address's host or network is unreachable) within ``timeout_s`` seconds. Every
    address, not the first: a name with several (``localhost`` as ::1 and 127.0.0.1, DNS round
    robin) may have sent the router's connection to another address than the first, where the
    replica still lives. A connect that succeeds is closed at once (nothing sent) and that
    address is tried again after a pause (2 ms, doubling up to 50 ms): a dying process's kernel
    closes its descriptors one by one, in descriptor order, so its listening socket can outlive
    the reset connection by a few ms (a connection on a lower descriptor; a single connect after
    the reset was not refused in 1 of 5 runs of tests/router/test_dead_replica_idle.py). A
    connect reset by a listening socket closing at that moment (it was queued there) is tried
    again too.
    False when some address still accepted at ``timeout_s`` (something listens: a sidecar, a
    sibling process, a replica restarted at once), a connect timed out, or one failed otherwise
    (a name that does not resolve, ...)."""
    loop = asyncio.get_running_loop()
    pause = 0.002
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            open_ = {(family, kind, proto, address) for family, kind, proto, _, address in infos}
            while open_:
                for target in list(open_):
                    family, kind, proto, address = target
                    sock = socket.socket(family, kind, proto)
                    sock.setblocking(False)
                    try:
                        await loop.sock_connect(sock, address)
                    except OSError as exc:
                        if exc.errno in _GONE:
                            open_.discard(target)
                        elif exc.errno != errno.ECONNRESET:
                            return False
                    finally:
                        sock.close()
                if open_:
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 0.05)
            return True
    except TimeoutError:
        return False
    except OSError:  # the name did not resolve
        return False


# Linux's TCP states (include/net/tcp_states.h): the first byte of ``struct tcp_info``
_TCP_CLOSE = 7


def reset_after_end(sock: socket.socket) -> bool:
    """Whether the connected TCP socket ``sock``, whose peer's end of stream (FIN) the router has
    just read, was reset by the peer since: its state is ``TCP_CLOSE`` (a reset tears a
    connection down; after the FIN alone it stays ``CLOSE_WAIT`` until the router closes it).
    Linux only (``TCP_INFO``); False wherever the socket cannot be asked (closed, another OS):
    no verdict. Reads one ``getsockopt``; nothing is sent or read."""
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    except (OSError, AttributeError):  # a closed socket; TCP_INFO missing on this platform
        return False
    return bool(state) and state[0] == _TCP_CLOSE
