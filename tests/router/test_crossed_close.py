"""A request that crosses a dead replica's close on a pooled connection is retried as never
processed (issue 31, item 1: the two races left in tests/router/test_dead_replica_idle.py).

The race: the router checks a pooled connection (router/forward/liveconn.py), and between that
check and the write the replica's kernel closes it, with an empty buffer: a FIN. The request then
either reaches a socket that is already closed (the replica's kernel answers it with a reset
after its FIN) or is never written at all (aiohttp sees the connection closing first: "Can not
write request body"). Either way the replica never had the whole request.

To make the race happen every run, the test stands in the event loop's place: it kills a real
sim replica *process* with SIGKILL and waits for it to be reaped without giving the loop a turn,
so the loop has not seen the FIN when the next request takes the pooled connection; and the
check before reuse is told the connection looked open (it did, a moment earlier). The converse
(a replica that read the whole request, then died: a clean end of stream, never retried) is
tests/router/test_reset_unread.py::test_a_replica_that_read_the_request_and_died_is_not_retried.

The pure part, whether a socket whose end of stream was read has been reset since, is tested on
real loopback sockets.
"""

from __future__ import annotations

import json
import select
import socket
import time

import aiohttp
import httpx
import pytest

from router.forward import liveconn
from router.forward.unread import reset_after_end
from router.forward.upstream import NotProcessed, Upstream, read_body
from tests.router.conftest import CHAT
from tests.router.sim_process import free_port, start_sim, wait_healthy

HEADERS = {"content-type": "application/json"}


@pytest.mark.parametrize("when", ["crossed", "closing_first"])
async def test_a_request_crossing_a_dead_replicas_close_is_retried_as_never_processed(when, monkeypatch) -> None:
    """``crossed``: the request is written after the FIN arrived, before the loop read it: it is
    reset at the far end. ``closing_first``: the loop reads the FIN (and closes the transport,
    as asyncio does at an end of stream) after aiohttp took the connection but before it wrote
    the request: no byte of it is written ("Can not write request body")."""
    port = free_port()
    proc = start_sim(port)
    url = f"http://127.0.0.1:{port}"
    upstream = Upstream("aiohttp", max_connections=4)
    try:
        async with httpx.AsyncClient(timeout=10) as probe:
            await wait_healthy(probe, url)
        body = json.dumps({**CHAT, "max_tokens": 2}).encode()
        first = await upstream.open(url + "/v1/chat/completions", body, HEADERS, 5.0, 30.0)
        assert first.status_code == 200
        await read_body(first, url)  # the connection goes back to the pool, idle
        # the check before reuse ran a moment before the replica's kernel closed the connection
        monkeypatch.setattr(liveconn, "peer_open", lambda fd: True)
        if when == "closing_first":
            write_bytes = aiohttp.ClientRequest.write_bytes

            async def late_write(self, writer, conn, content_length):  # type: ignore[no-untyped-def]
                transport = conn.protocol.transport
                fd = transport.get_extra_info("socket").fileno()
                assert select.select([fd], [], [], 5)[0]  # the FIN is there
                transport.close()  # what asyncio's reader does on reading it
                return await write_bytes(self, writer, conn, content_length)

            monkeypatch.setattr(aiohttp.ClientRequest, "write_bytes", late_write)
        proc.kill()
        proc.wait(timeout=10)  # reaped: its sockets are closed (FIN sent); the loop has not run since
        with pytest.raises(NotProcessed) as failure:
            await upstream.open(url + "/v1/chat/completions", body, HEADERS, 5.0, 30.0)
        assert failure.value.code == "replica_unreachable", failure.value
    finally:
        await upstream.aclose()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    return listener, ours, theirs


def _until_eof(sock: socket.socket) -> None:
    sock.settimeout(5)
    assert sock.recv(1024) == b""  # the peer's end of stream


def test_data_that_reached_a_closed_socket_is_seen_as_a_reset_after_the_end_of_stream() -> None:
    listener, ours, theirs = _pair()
    with listener, ours:
        theirs.close()  # an empty buffer: a FIN
        time.sleep(0.05)
        ours.sendall(b"POST / HTTP/1.1\r\n\r\n")  # reaches a closed socket: reset there
        _until_eof(ours)
        deadline = time.monotonic() + 5
        while not reset_after_end(ours) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reset_after_end(ours)


def test_a_peer_that_read_everything_and_closed_is_a_clean_end_of_stream() -> None:
    listener, ours, theirs = _pair()
    with listener, ours:
        request = b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        ours.sendall(request)
        theirs.settimeout(5)
        assert theirs.recv(1024) == request  # read it all
        theirs.close()
        _until_eof(ours)
        time.sleep(0.05)  # time for a reset, were one to come
        assert not reset_after_end(ours)


def test_a_socket_that_cannot_be_asked_gives_no_verdict() -> None:
    sock = socket.socket()
    sock.close()
    assert not reset_after_end(sock)
