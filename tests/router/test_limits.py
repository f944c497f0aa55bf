"""Issue 13, finding 2: one client must not exhaust the router. Each test attacks the real router
process (``python -m router serve``: uvicorn + uvloop + httptools) over real sockets."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.router.router_process import MODEL, RouterProcess, closed_within, read_response, start_router

MB = 1024 * 1024
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
LIMITS = {"max_body_bytes": 1 * MB, "header_timeout_s": 2, "keepalive_timeout_s": 2, "body_timeout_s": 3}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    served = start_router(tmp_path_factory.mktemp("limits"), {"PROMPTEDGE_ROUTER_LIMITS": json.dumps(LIMITS)})
    yield served
    served.stop()


def _error(body: bytes) -> dict[str, object]:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def _send_forever(sock: socket.socket, total: int, chunked: bool) -> None:
    """Send ``total`` body bytes (in 1 MB writes; chunked framing if asked) until the peer closes."""
    block = b"x" * MB
    sent = 0
    try:
        while sent < total:
            sock.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            sent += len(block)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the router closed the connection: what a refused upload should see


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_200_mb_body_is_refused_with_413_without_being_buffered(router: RouterProcess, chunked: bool) -> None:
    # Regression: a 200 MB body was read, parsed and forwarded (+809 MB of router memory).
    router.reset_peak_rss()
    before = router.rss_bytes()
    sock = router.connect(timeout=60)
    framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % (200 * MB)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n%s\r\n\r\n" % framing
    )
    sender = threading.Thread(target=_send_forever, args=(sock, 200 * MB, chunked))
    sender.start()
    try:
        status, headers, body = read_response(sock, timeout=120)
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # stops the sender
        except OSError:
            pass  # already reset by the router
        sender.join(timeout=120)
        sock.close()
    grown = router.rss_bytes("VmHWM") - before  # the peak: a buffered body may be freed by now
    assert (status, grown < 32 * MB) == (413, True), f"{status}, router peak RSS grew by {grown / MB:.0f} MB"
    error = _error(body)
    assert error["code"] == "body_too_large" and error["type"] == "invalid_request_error"
    assert headers.get("connection") == "close"
    # the router still serves
    assert httpx.get(router.url + "/health", timeout=30).status_code == 200


def test_a_body_within_the_limit_is_still_served(router: RouterProcess) -> None:
    chat = {**CHAT, "messages": [{"role": "user", "content": "x" * (MB // 2)}]}
    answer = httpx.post(router.url + "/v1/chat/completions", json=chat, timeout=60)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "no_replica"  # parsed, then dispatched


@pytest.mark.parametrize("size", [1 * MB, 16 * MB], ids=["1MB", "16MB"])
def test_huge_headers_are_refused_with_431_and_not_buffered(router: RouterProcess, size: int) -> None:
    # Regression: 1 MB and 16 MB headers were accepted.
    router.reset_peak_rss()
    before = router.rss_bytes()
    sock = router.connect(timeout=60)
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * size + b"\r\n\r\n"
    sender = threading.Thread(target=lambda: _sendall_quietly(sock, head))
    sender.start()
    try:
        status, _, body = read_response(sock, timeout=60)
        assert status == 431
        assert _error(body)["code"] == "headers_too_large"
        assert closed_within(sock, 10)
    finally:
        sender.join(timeout=60)
        sock.close()
    assert router.rss_bytes("VmHWM") - before < 16 * MB


def _sendall_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_too_many_headers_get_431(router: RouterProcess) -> None:
    headers = {f"x-h{i}": "v" for i in range(300)}
    answer = httpx.get(router.url + "/health", headers=headers, timeout=30)
    assert answer.status_code == 431
    assert answer.json()["error"]["code"] == "too_many_headers"


def test_a_long_query_string_gets_414(router: RouterProcess) -> None:
    answer = httpx.get(router.url + "/health?q=" + "a" * 20_000, timeout=30)
    assert answer.status_code == 414
    assert answer.json()["error"]["code"] == "url_too_long"


def test_deeply_nested_json_is_a_400_with_at_most_one_log_line(router: RouterProcess) -> None:
    # Regression: 50,000 levels gave a 500 with a RecursionError traceback in the log.
    log_before = len(router.log_text().splitlines())
    nested = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    )
    answer = httpx.post(
        router.url + "/v1/chat/completions", content=nested, headers={"content-type": "application/json"}, timeout=30
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_json"
    time.sleep(0.5)
    new_lines = router.log_text().splitlines()[log_before:]
    assert len(new_lines) <= 1, new_lines
    assert not any("Traceback" in line or "RecursionError" in line for line in new_lines)


def test_nesting_just_over_the_depth_limit_is_a_400_and_under_it_is_served(router: RouterProcess) -> None:
    def body(depth: int) -> bytes:  # the body object is level 1, "x"'s value adds depth - 1 levels
        return (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": '
            + b"[" * (depth - 1)
            + b"]" * (depth - 1)
            + b"}"
        )

    over = httpx.post(router.url + "/v1/chat/completions", content=body(65), timeout=30)
    assert over.status_code == 400 and over.json()["error"]["code"] == "invalid_json"
    under = httpx.post(router.url + "/v1/chat/completions", content=body(64), timeout=30)
    assert under.status_code == 503  # parsed and dispatched (the test pool never answers)


def test_a_body_of_many_small_containers_is_a_400_without_being_parsed(router: RouterProcess) -> None:
    # Regression (A5): ~350,000 empty objects in 1 MB were parsed (8 MiB: +673 MB, 4.9 s on the loop).
    router.reset_peak_rss()
    before = router.rss_bytes()
    head = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ['
    raw = head + b"{}," * ((MB - len(head) - 10) // 3) + b"{}]}"
    answer = httpx.post(router.url + "/v1/chat/completions", content=raw, timeout=60)
    grown = router.rss_bytes("VmHWM") - before
    assert (answer.status_code, grown < 16 * MB) == (400, True), f"{answer.status_code}, peak grew {grown / MB:.0f} MB"
    error = answer.json()["error"]
    assert error["code"] == "invalid_json" and "containers" in error["message"]


def test_brackets_inside_strings_are_no_containers(router: RouterProcess) -> None:
    code = "{[" * 200_000  # text (a prompt full of braces) is not structure
    answer = httpx.post(
        router.url + "/v1/chat/completions",
        timeout=60,
        json={"model": "m", "messages": [{"role": "user", "content": code}], "stop": ['}\\"]']},
    )
    assert answer.status_code == 503, answer.text  # parsed and dispatched (the test pool never answers)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "ok \\udfff tail"}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "user": "\\udc00"}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "\\ud800": 1}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["\\ud800"]}',
    ],
    ids=["content", "trailing", "part", "user", "key", "stop"],
)
def test_a_lone_surrogate_anywhere_in_the_body_is_a_400(router: RouterProcess, raw: bytes) -> None:
    # Regression: "\ud800" in content gave a 500 from the cache key's digest.
    answer = httpx.post(router.url + "/v1/chat/completions", content=raw, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_unicode"


def test_a_surrogate_pair_is_valid_text(router: RouterProcess) -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert httpx.post(router.url + "/v1/chat/completions", content=raw, timeout=30).status_code == 503


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_numbers_are_a_400(router: RouterProcess, value: bytes) -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": ' + value + b"}"
    answer = httpx.post(router.url + "/v1/chat/completions", content=raw, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"


def test_too_many_messages_and_a_huge_max_tokens_are_400(router: RouterProcess) -> None:
    many = {**CHAT, "messages": [{"role": "user", "content": "x"}] * 5000}
    answer = httpx.post(router.url + "/v1/chat/completions", json=many, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"
    huge = {**CHAT, "max_tokens": 10**30}
    answer = httpx.post(router.url + "/v1/chat/completions", json=huge, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "max_tokens"


def test_a_connection_that_sends_nothing_or_half_a_head_is_closed(router: RouterProcess) -> None:
    # Regression (slowloris): such connections stayed open for ever.
    silent = router.connect()
    partial = router.connect()
    partial.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: ")
    trickle = router.connect()
    trickle.sendall(b"GET /hea")
    try:
        for _ in range(4):  # a byte a second resets no timer: the head has a deadline
            time.sleep(1)
            try:
                trickle.sendall(b"l")
            except OSError:
                break
        assert closed_within(silent, 15)
        assert closed_within(partial, 15)
        assert closed_within(trickle, 15)
    finally:
        for sock in (silent, partial, trickle):
            sock.close()


def test_an_idle_keep_alive_connection_is_closed(router: RouterProcess) -> None:
    sock = router.connect()
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        status, _, _ = read_response(sock)
        assert status == 200
        assert closed_within(sock, 15)
    finally:
        sock.close()


def test_a_body_that_stops_arriving_is_refused(router: RouterProcess) -> None:
    sock = router.connect()
    try:
        sock.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"model"')
        status, _, body = read_response(sock, timeout=30)
        assert status == 408 and _error(body)["code"] == "body_timeout"
        assert closed_within(sock, 10)
    finally:
        sock.close()


def test_bad_http_gets_openai_error_json(router: RouterProcess) -> None:
    sock = router.connect()
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nbad header\r\n\r\n")
        status, _, body = read_response(sock)
        assert status == 400 and _error(body)["code"] == "invalid_http"
    finally:
        sock.close()


def test_more_idle_connections_than_open_files_do_not_stop_the_router(tmp_path: Path) -> None:
    # Regression: 1,100 idle connections against a 1,024 open-files limit silently stopped every
    # request and /health until they closed. Here: 400 against 256, head deadline far away.
    router = start_router(tmp_path, {"PROMPTEDGE_ROUTER_LIMITS": json.dumps({"header_timeout_s": 120})}, nofile=256)
    idle: list[socket.socket] = []
    try:
        for _ in range(400):
            try:
                idle.append(router.connect(timeout=5))
            except OSError:
                break
        time.sleep(1)
        health = httpx.get(router.url + "/health", timeout=10)
        assert health.status_code == 200
        chat = httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "no_replica"
        log = router.log_text()
        assert "connection cap" in log and "RLIMIT_NOFILE 256" in log
    finally:
        for sock in idle:
            sock.close()
        router.stop()


def test_a_client_that_leaves_mid_body_leaves_no_traceback(router: RouterProcess) -> None:
    log_before = len(router.log_text().splitlines())
    sock = router.connect()
    sock.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"model"')
    time.sleep(0.5)
    sock.close()
    time.sleep(1)
    assert httpx.get(router.url + "/health", timeout=30).status_code == 200
    new_lines = router.log_text().splitlines()[log_before:]
    assert not any("Traceback" in line or "unhandled error" in line for line in new_lines), new_lines


def test_at_the_cap_with_every_connection_busy_health_still_answers(tmp_path: Path) -> None:
    # Every connection under the cap has a request in flight (a body that is slow to arrive):
    # /health is served on the reserve, anything else gets 503 server_busy.
    limits = {"max_client_connections": 20, "health_reserve": 4, "body_timeout_s": 120, "body_stall_s": 120}
    router = start_router(tmp_path, {"PROMPTEDGE_ROUTER_LIMITS": json.dumps(limits)})
    busy: list[socket.socket] = []
    try:
        for _ in range(20):
            sock = router.connect()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{")
            busy.append(sock)
        time.sleep(1)
        health = httpx.get(router.url + "/health", timeout=10)
        assert health.status_code == 200 and "pools" in health.json()
        chat = httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=10)
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "server_busy"
        assert "connection cap 20 reached" in router.log_text()
        for sock in busy:  # the busy connections were not closed to make room
            sock.settimeout(0.01)
            with pytest.raises(TimeoutError):
                sock.recv(1)
    finally:
        for sock in busy:
            sock.close()
        router.stop()


def test_at_the_cap_a_connection_stalled_in_its_body_makes_room(tmp_path: Path) -> None:
    # Regression (issue 13, A6): one client filled the cap with bodies that never arrive (head,
    # Content-Length 100000, one byte) and everyone else got 503 server_busy for body_timeout_s.
    limits = {"max_client_connections": 8, "health_reserve": 2, "body_timeout_s": 120, "body_stall_s": 1}
    router = start_router(tmp_path, {"PROMPTEDGE_ROUTER_LIMITS": json.dumps(limits)})
    stalled: list[socket.socket] = []
    try:
        for _ in range(8):
            sock = router.connect()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{")
            stalled.append(sock)
        time.sleep(2)  # > body_stall_s: no body byte since
        answer = httpx.get(router.url + "/no-such-path", timeout=10)
        assert answer.status_code == 404, answer.text  # served normally, not 503 server_busy
        status, headers, body = read_response(stalled[0], timeout=10)  # the oldest made room
        assert (status, _error(body)["code"], headers.get("connection")) == (408, "body_timeout", "close")
        assert closed_within(stalled[0], 5)
    finally:
        for sock in stalled:
            sock.close()
        router.stop()


def test_a_long_or_odd_request_id_is_replaced_not_logged_and_echoed(router: RouterProcess) -> None:
    # Found while looking for the rest of the class: a 5,000-character X-Request-ID was written
    # whole into the access log line, forwarded to the replica and echoed back.
    for given in ("x" * 5000, "café", "a b"):
        answer = httpx.post(
            router.url + "/v1/chat/completions",
            json=CHAT,
            timeout=30,
            headers={"x-request-id": given.encode("latin-1")},
        )
        assert answer.headers["x-request-id"] != given
        assert len(answer.headers["x-request-id"]) == 32
    assert "x" * 200 not in router.log_text()
    fine = "req-2026.12.02:abc_DEF-1"
    answer = httpx.post(router.url + "/v1/chat/completions", json=CHAT, timeout=30, headers={"x-request-id": fine})
    assert answer.headers["x-request-id"] == fine


def test_ctrl_c_twice_with_a_request_in_flight_leaves_no_traceback(tmp_path: Path) -> None:
    # Regression (issue 13, M3): the second SIGINT (uvicorn's force quit) printed CancelledError
    # tracebacks of the request still reading its body and of the lifespan.
    router = start_router(tmp_path)
    stalled = router.connect()
    stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\nx")
    try:
        time.sleep(1)  # the request has reached the route and waits for its body
        router.proc.send_signal(signal.SIGINT)
        time.sleep(1)
        router.proc.send_signal(signal.SIGINT)
        router.proc.wait(timeout=60)
    finally:
        stalled.close()
        router.stop()
    log = router.log_text()
    assert "Shutting down" in log
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]


def _chat_head(length: int | None, chunked: bool = False) -> bytes:
    framing = b"transfer-encoding: chunked\r\n" if chunked else b"content-length: %d\r\n" % length
    return b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + framing + b"\r\n"


def test_garbage_after_a_whole_request_still_gets_that_requests_answer(router: RouterProcess) -> None:
    """A valid request followed by bytes that are no request (a pipelined garbage head, or a
    Content-Length smaller than what was sent): the request already read is answered, then the
    connection closes. The attack round saw the connection closed with no answer at all, the
    request logged 499 while a replica had served it."""
    body = json.dumps(CHAT).encode()
    for tail in (b"X\r\n\r\n", b"\x00\x01 not http at all\r\n\r\n"):
        sock = router.connect()
        try:
            sock.sendall(_chat_head(len(body)) + body + tail)
            status, _, answer = read_response(sock, timeout=30)
            # this router's pool has no replica: the request was parsed and dispatched, its answer read
            assert status == 503 and _error(answer)["code"] == "no_replica", (tail, status, answer[:300])
            assert closed_within(sock, 10)
        finally:
            sock.close()


@pytest.mark.parametrize("chunk", [b"zz\r\n", b"ffffffffffffffffffff\r\n"])
def test_a_broken_chunked_body_gets_a_400_the_client_reads(router: RouterProcess, chunk: bytes) -> None:
    """An invalid chunk size after the head was accepted: 400 ``invalid_http`` JSON, not a close
    without an answer."""
    sock = router.connect()
    try:
        sock.sendall(_chat_head(None, chunked=True) + b'5\r\n{"mod\r\n' + chunk)
        status, _, answer = read_response(sock, timeout=30)
        assert status == 400 and _error(answer)["code"] == "invalid_http", (status, answer[:300])
        assert closed_within(sock, 10)
    finally:
        sock.close()
