"""A replica *process* that fails a completion request in one of three ways, for the tests of
"retried only when provably never processed" (tests/router/test_reset_unread.py).

    python -m tests.router.unread_replica MODE

It listens on a free loopback port and prints ``listening PORT``. Every ``GET`` (the router's
``/health`` probe, a ``/metrics`` scrape) is read and answered 200. A ``POST`` is handled by
``MODE``:

- ``never_read``: the request is left in the kernel's receive buffer, never read; once the
  whole of it is there (seen with ``MSG_PEEK``, which reads nothing) it prints ``unread N``
  (N bytes) and holds the connection. The test then SIGKILLs the process: Linux closes a socket
  with unread data with a reset, and the listening socket goes with it.
- ``read_then_exit``: reads the whole request, prints ``read N`` and ends at once with
  ``os._exit`` (no answer): its sockets close with empty buffers (a FIN, a clean end of stream)
  and its port refuses connections from then on.
- ``reset_keep_listening``: once the whole request is in the buffer, prints ``reset N`` and
  closes that connection with ``SO_LINGER`` 0 (a reset), while the process and its listening
  socket live on: what a middlebox or another process of a multi-process server can do.
- ``partial_head_reset_exit``: reads the whole request, sends the start of a response head,
  prints ``answered N``, resets the connection (``SO_LINGER`` 0) and ends at once: a replica
  that had the request and began answering, then aborted.

Each line is flushed at once, so a test can act on it.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time

_OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{"status": "ok"}'


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _request_size(head: bytes) -> int | None:
    """Size in bytes of the request at the start of ``head`` (headers and Content-Length body),
    None while its headers are incomplete."""
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    length = 0
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return end + 4 + length


def _peek_whole(conn: socket.socket) -> int:
    """Wait (without reading anything) until the kernel holds a whole request; its size."""
    while True:
        data = conn.recv(1 << 20, socket.MSG_PEEK)
        if not data:
            raise ConnectionError("closed")
        size = _request_size(data)
        if size is not None and len(data) >= size:
            return size
        time.sleep(0.001)


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _serve(conn: socket.socket, mode: str) -> None:
    try:
        while True:
            size = _peek_whole(conn)
            if conn.recv(4, socket.MSG_PEEK) != b"POST":
                _read_exactly(conn, size)  # a probe or scrape: read and answered
                conn.sendall(_OK)
                continue
            if mode == "never_read":
                _say(f"unread {size}")
                time.sleep(3600)
            elif mode == "read_then_exit":
                _read_exactly(conn, size)
                _say(f"read {size}")
                os._exit(0)
            elif mode == "partial_head_reset_exit":
                _read_exactly(conn, size)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Ty")
                time.sleep(0.05)  # the bytes reach the router before the reset
                _say(f"answered {size}")
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                os._exit(0)
            else:  # reset_keep_listening
                _say(f"reset {size}")
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                return
    except ConnectionError:
        return


def main() -> None:
    mode = sys.argv[1]
    assert mode in ("never_read", "read_then_exit", "reset_keep_listening", "partial_head_reset_exit"), mode
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    _say(f"listening {listener.getsockname()[1]}")
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve, args=(conn, mode), daemon=True).start()


if __name__ == "__main__":
    main()
