"""What a hostile request costs the router in memory (issue 13, finding 2).

Starts the real router (``python -m router serve``, the test helper's pool with no live
replica), sends a 200 MB body (Content-Length, then chunked) and a 16 MB header over raw
sockets, then two 8 MiB JSON bodies (2.8M empty objects; brackets and escapes inside one string),
and reports each answer's status and the router's peak RSS during it (VmHWM after
``clear_refs``), as a table and as JSON (``--json``). Needs Redis (``PROMPTEDGE_TEST_REDIS_URL``,
the database is flushed). Run from the repository root:

    PROMPTEDGE_TEST_REDIS_URL=redis://127.0.0.1:6379/15 python bench/limits_rss.py --json out/limits_rss.json
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.router.router_process import read_response, start_router  # noqa: E402

MB = 1024 * 1024


def _cases() -> list[tuple[str, bytes, Iterator[bytes]]]:
    post = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    return [
        (
            "200 MB body, Content-Length",
            post + b"content-length: %d\r\n\r\n" % (200 * MB),
            (b"x" * MB for _ in range(200)),
        ),
        (
            "200 MB body, chunked",
            post + b"transfer-encoding: chunked\r\n\r\n",
            (b"100000\r\n" + b"x" * MB + b"\r\n" for _ in range(200)),
        ),
        ("16 MB header", b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ", iter([b"a" * (16 * MB), b"\r\n\r\n"])),
        _json_case("8 MiB of {}, (2.8M objects)", b'"x": [' + b"{}," * (EIGHT_MIB // 3 - 100) + b"{}]}"),
        _json_case('8 MiB of {[\\" in a string', b'"x": "' + b'{[\\\\\\"' * (EIGHT_MIB // 6 - 100) + b'"}'),
    ]


EIGHT_MIB = 8 * MB


def _json_case(name: str, tail: bytes) -> tuple[str, bytes, Iterator[bytes]]:
    """A chat body of ``messages`` plus ``tail`` (the rest of the object), sent in one piece."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], ' + tail
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
    return name, head, iter([body])


def _send(sock: socket.socket, chunks: Iterator[bytes]) -> None:
    try:
        for chunk in chunks:
            sock.sendall(chunk)
    except OSError:
        pass  # the router closed the connection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    router = start_router(Path(tempfile.mkdtemp()))
    rows = []
    try:
        for name, head, body in _cases():
            router.reset_peak_rss()
            before = router.rss_bytes()
            sock = router.connect(timeout=60)
            sock.sendall(head)
            sender = threading.Thread(target=_send, args=(sock, body))
            sender.start()
            started = time.monotonic()
            try:
                status: int | str = read_response(sock, 120)[0]
                seconds = round(time.monotonic() - started, 2)
            except OSError as exc:
                status, seconds = type(exc).__name__, round(time.monotonic() - started, 2)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sender.join()
            sock.close()
            time.sleep(0.5)
            rows.append(
                {
                    "case": name,
                    "status": status,
                    "rss_mb": round(before / MB),
                    "peak_growth_mb": round((router.rss_bytes("VmHWM") - before) / MB),
                    "seconds": seconds,
                }
            )
    finally:
        router.stop()
    print("| case | status | RSS before (MB) | peak growth (MB) | s to the answer |\n|---|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['case']} | {row['status']} | {row['rss_mb']} | {row['peak_growth_mb']} | {row['seconds']} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
