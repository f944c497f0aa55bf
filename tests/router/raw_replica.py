"""A replica that fails at a chosen stage of an HTTP exchange, on real loopback sockets.

``RawReplica`` answers ``GET /health`` and ``GET /metrics`` like a healthy replica (so the
router's probes mark it up) and fails completion requests (``POST``) at the stage set in
``mode``, which a test may change at any time:

- ``ok``: reads the request and answers a small chat completion;
- ``close_on_accept``: accepts the connection and closes it before reading a byte;
- ``close_after_request``: reads the whole request (headers and body), then closes;
- ``partial_headers``: reads the request, sends part of a status line and headers, closes;
- ``partial_body``: reads the request, sends complete headers and part of the body (for a
  ``stream: true`` request, one SSE event of a chunked stream), closes;
- ``trickle``: reads the request, sends headers and then the non-stream answer one byte every
  0.5 s (each byte well inside any read timeout, the whole far past one);
- ``flood``: reads the request, answers ``status`` with a chunked JSON body that does not end
  (64 KiB chunks, up to ``FLOOD_BYTES``); ``flood_sent`` counts the body bytes written before
  the peer stopped reading or closed.

In ``ok`` mode ``answer`` (a non-stream body) and ``events`` (SSE ``data:`` payloads, sent for
a ``stream: true`` request with ``[DONE]`` after them, each ended by ``event_end``) can be set
to what a misbehaving replica would send, ``headers`` (raw header lines) added to either, and
``status`` / ``content_type`` of the non-stream answer changed (an error page). With
``idle_close_s`` it closes a keep-alive connection that carried no request for that long, as
servers do (uvicorn after 5 s). ``connections`` counts accepted connections that carried (or could have carried) a completion
request; ``requests`` counts completion requests read whole. Every socket is closed by
:meth:`stop`.
"""

from __future__ import annotations

import asyncio
import json

_ANSWER = json.dumps(
    {
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "created": 0,
        "model": "sim-llama-8b",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()

_EVENT = (
    b'data: {"id":"chatcmpl-raw","object":"chat.completion.chunk","created":0,"model":"sim-llama-8b",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"o"},"finish_reason":null}]}\n\n'
)


FLOOD_BYTES = 256 * 1024 * 1024  # what a flooding replica sends at most


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class RawReplica:
    """One loopback HTTP/1.1 server with a settable failure ``mode`` (see module docstring)."""

    def __init__(self, mode: str = "ok", idle_close_s: float | None = None) -> None:
        self.mode = mode
        self.answer = _ANSWER
        self.headers = b""  # more header lines of an ``ok`` answer, each ending in \r\n
        self.events: list[bytes] | None = None
        self.event_end = b"\n\n"  # what ends each SSE event: LF LF, CRLF CRLF or CR CR are all valid
        self.status = b"200 OK"  # status line of an ``ok`` non-stream answer
        self.flood_sent = 0
        self.content_type = b"application/json"
        self.idle_close_s = idle_close_s  # close a keep-alive connection idle this long (None: never)
        self.connections = 0
        self.requests = 0
        self.idle_closes = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> RawReplica:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        """Stop listening (later connects are refused) and close every open connection."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                if self.mode == "close_on_accept":
                    # Only meaningful for a fresh connection: a probe never uses this server's
                    # completion connections, so count it as a completion connection.
                    self.connections += 1
                    return
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_close_s)
                except TimeoutError:
                    self.idle_closes += 1
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length) if length else b""
                if method == "GET":
                    payload = b'{"status": "ok"}' if path == "/health" else b""
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                        + str(len(payload)).encode()
                        + b"\r\n\r\n"
                        + payload
                    )
                    await writer.drain()
                    continue
                self.connections += 1
                self.requests += 1
                if self.mode == "close_after_request":
                    return
                if self.mode == "partial_headers":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Ty")
                    await writer.drain()
                    return
                if self.mode == "partial_body" and b'"stream":true' in body.replace(b" ", b""):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(_EVENT)
                    )
                    await writer.drain()
                    return
                if self.mode == "partial_body":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                        + str(len(_ANSWER)).encode()
                        + b"\r\n\r\n"
                        + _ANSWER[:20]
                    )
                    await writer.drain()
                    return
                if self.mode == "flood":
                    writer.write(
                        b"HTTP/1.1 " + self.status + b"\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(b'{"pad": "')
                    )
                    block = _chunk(b"a" * 65536)
                    while self.flood_sent < FLOOD_BYTES:
                        writer.write(block)
                        await asyncio.wait_for(writer.drain(), 5.0)  # a peer that stopped reading
                        self.flood_sent += 65536
                    return
                if self.mode == "trickle":  # a whole answer, one byte every half second
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                        + str(len(self.answer)).encode()
                        + b"\r\n\r\n"
                    )
                    for i in range(len(self.answer)):
                        writer.write(self.answer[i : i + 1])
                        await writer.drain()
                        await asyncio.sleep(0.5)
                    continue
                if self.events is not None and b'"stream":true' in body.replace(b" ", b""):
                    sse = b"".join(_chunk(b"data: " + e + self.event_end) for e in [*self.events, b"[DONE]"])
                    writer.write(
                        b"HTTP/1.1 200 OK\r\n" + self.headers + b"Content-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + sse + b"0\r\n\r\n"
                    )
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 "
                    + self.status
                    + b"\r\n"
                    + self.headers
                    + b"Content-Type: "
                    + self.content_type
                    + b"\r\nContent-Length: "
                    + str(len(self.answer)).encode()
                    + b"\r\n\r\n"
                    + self.answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()
