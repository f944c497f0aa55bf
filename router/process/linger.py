"""Closing a connection whose request was refused before all of it was read (nginx's lingering close).

Closing a TCP socket with unread bytes in its receive buffer makes the kernel send a reset, not
a FIN; a client still sending its oversized headers or body then sees a connection error
instead of the 431 / 413 already written to it (an asyncio client drops the transport on its
first failed write, so the answer in its socket is never read). So after such an answer the
router half-closes its side (FIN after the answer), keeps reading and *discards* what still
arrives, and closes once the client closes its side, or when a bound is reached:

- ``lingering_max_bytes``: bytes discarded after the answer (CPU spent on a client that keeps
  sending; nothing is kept, so memory does not grow with it);
- ``lingering_timeout_s``: no byte arrived for this long;
- ``lingering_time_s``: this long after the answer, however the bytes trickle in.

At a bound the connection is closed (a reset when bytes are still arriving: a client sending
that much more, or that slowly, after its answer gets what it got before). Memory is flat throughout: each read is
dropped as it arrives.
"""

from __future__ import annotations

import asyncio


class Lingering:
    """The lingering close of one connection, started with :meth:`start` once the answer is written.

    ``max_bytes``: bytes discarded at most; ``idle_s``: seconds without a byte before the
    close; ``total_s``: seconds after :meth:`start` before the close, whatever arrives.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        max_bytes: int,
        idle_s: float,
        total_s: float,
    ) -> None:
        self.transport = transport
        self.loop = loop
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self.total_s = total_s
        self.discarded = 0
        self._last_at = 0.0
        self._ends_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Half-close (the FIN follows the answer still in the write buffer); the caller keeps
        reading (resumed if paused) and hands each read's size to :meth:`discard`."""
        now = self.loop.time()
        self._last_at = now
        self._ends_at = now + self.total_s
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(min(self.idle_s, self.total_s), self._check)

    def discard(self, size: int) -> None:
        """``size`` bytes arrived and were dropped; abort past ``max_bytes``."""
        self.discarded += size
        self._last_at = self.loop.time()
        if self.discarded > self.max_bytes:
            self.end()

    def end(self) -> None:
        """Stop lingering now: close, or abort when bytes are still unsent or unread."""
        self.cancel()
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size():
            # an answer the client does not read would hold the connection open without bound
            self.transport.abort()
        else:
            self.transport.close()  # a reset only if bytes arrived since the last read

    def cancel(self) -> None:
        """Forget the timer (the connection is gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        # one timer, re-armed for whichever bound comes first: no timer churn per read
        self._timer = None
        now = self.loop.time()
        due = min(self._last_at + self.idle_s, self._ends_at)
        if now >= due:
            self.end()
        else:
            self._timer = self.loop.call_later(due - now, self._check)
