"""Issue 31, item 4: an oversized request gets an answer its client reads, not a TCP reset.

The real router process (uvicorn + uvloop + httptools) in front of a real sim replica; real
clients (the official ``openai`` SDK and httpx) send a 16 MB header, a 20 MB body and a 200 MB
body (streamed from a generator, so this process never holds it) and must read the 431 / 413
OpenAI error that names the limit, while the router's peak RSS stays flat and it serves a normal
request afterwards. The second half checks that the discarding after an answer is bounded in
bytes, idle time and total time."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.router.router_process import RouterProcess, closed_within, read_response, start_router
from tests.router.sim_process import free_port, start_sim

MB = 1024 * 1024
MODEL = "sim-llama-8b"
MAX_BODY = 8 * MB
MAX_HEAD = 32 * 1024
LIMITS = {"max_body_bytes": MAX_BODY, "max_header_bytes": MAX_HEAD}
PEAK_RSS_GROWTH = 32 * MB  # what a refused request may make the router's peak RSS grow by
CHAT_PATH, RESPONSES_PATH = "/v1/chat/completions", "/v1/responses"  # the fast path, the app's stack


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    port = free_port()
    proc = start_sim(port)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the sim replica did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, sim_url: str) -> Iterator[RouterProcess]:
    replicas = json.dumps([{"url": sim_url, "model": MODEL, "metrics_path": None}])
    served = start_router(
        tmp_path_factory.mktemp("oversize"),
        {"PROMPTEDGE_ROUTER_LIMITS": json.dumps(LIMITS), "PROMPTEDGE_ROUTER_REPLICAS": replicas},
    )
    yield served
    served.stop()


def _sdk(router: RouterProcess) -> openai.OpenAI:
    # no retries: a connection error must show as one, not be hidden by a retried attempt
    return openai.OpenAI(base_url=router.url + "/v1", api_key="test", max_retries=0, timeout=60)


def _call(router: RouterProcess, client: str, make: Callable[[Any], Awaitable[object] | object]) -> None:
    """``make(client)`` with the sync or the async (asyncio) OpenAI client; async clients are the
    ones a reset hurts most: asyncio drops a transport on its first failed write, so the answer
    already in the socket is never read (APIConnectionError)."""
    if client == "sync":
        make(_sdk(router))
        return

    async def run() -> None:
        async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="test", max_retries=0, timeout=60) as sdk:
            await make(sdk)  # type: ignore[misc]

    asyncio.run(run())


def _assert_still_serves(router: RouterProcess) -> None:
    answer = _sdk(router).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=4
    )
    assert answer.choices[0].message.content


def _assert_openai_error(
    caught: pytest.ExceptionInfo[openai.APIStatusError], status: int, code: str, limit: int
) -> None:
    error = caught.value
    assert (error.status_code, error.code) == (status, code), error
    assert f"{limit} bytes" in error.message, error.message  # the limit is named
    assert error.response.headers.get("connection") == "close"


def _assert_httpx_error(answer: httpx.Response, status: int, code: str, limit: int) -> None:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["type"]) == (code, "invalid_request_error")
    assert f"{limit} bytes" in error["message"], error["message"]


class _PeakRss:
    """The router's peak RSS growth across a ``with`` block (Linux VmHWM, reset on entry)."""

    def __init__(self, router: RouterProcess) -> None:
        self.router = router
        self.grown = 0

    def __enter__(self) -> _PeakRss:
        self.router.reset_peak_rss()
        self.before = self.router.rss_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        self.grown = self.router.rss_bytes("VmHWM") - self.before

    def check(self) -> None:
        assert self.grown < PEAK_RSS_GROWTH, f"router peak RSS grew by {self.grown / MB:.0f} MB"


CLIENTS = ["sync", "async"]


@pytest.mark.parametrize("client", CLIENTS)
def test_16_mb_of_headers_get_a_431_the_openai_sdk_reads(router: RouterProcess, client: str) -> None:
    # Regression (issue 31, 4): the router answered 431 and closed with the rest of the head
    # unread, so the kernel reset the connection: the async SDK showed APIConnectionError
    with _PeakRss(router) as peak, pytest.raises(openai.APIStatusError) as caught:
        _call(
            router,
            client,
            lambda sdk: sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers={"x-big": "a" * (16 * MB)}
            ),
        )
    _assert_openai_error(caught, 431, "headers_too_large", MAX_HEAD)
    peak.check()
    _assert_still_serves(router)


def test_16_mb_of_headers_get_a_431_httpx_reads(router: RouterProcess) -> None:
    async def send() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as http:
            return await http.get(router.url + "/health", headers={"x-big": "a" * (16 * MB)})

    with _PeakRss(router) as peak:
        answer = asyncio.run(send())
    _assert_httpx_error(answer, 431, "headers_too_large", MAX_HEAD)
    peak.check()
    _assert_still_serves(router)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_20_mb_chat_gets_a_413_the_openai_sdk_reads(router: RouterProcess, client: str) -> None:
    # Regression (issue 31, 4): 413 answered before the body was read, then a reset
    with _PeakRss(router) as peak, pytest.raises(openai.APIStatusError) as caught:
        _call(
            router,
            client,
            lambda sdk: sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x" * (20 * MB)}]
            ),
        )
    _assert_openai_error(caught, 413, "body_too_large", MAX_BODY)
    peak.check()
    _assert_still_serves(router)


def test_a_20_mb_responses_request_gets_a_413_the_openai_sdk_reads(router: RouterProcess) -> None:
    # /v1/responses goes through the app's middleware stack (router/app.py BodyLimit), not the fast path
    with _PeakRss(router) as peak, pytest.raises(openai.APIStatusError) as caught:
        _call(router, "async", lambda sdk: sdk.responses.create(model=MODEL, input="x" * (20 * MB)))
    _assert_openai_error(caught, 413, "body_too_large", MAX_BODY)
    peak.check()
    _assert_still_serves(router)


async def _chat_body(total: int) -> AsyncIterator[bytes]:
    """A chat request of exactly ``total`` bytes, made 1 MB at a time (never held whole)."""
    head = b'{"model":"%s","messages":[{"role":"user","content":"' % MODEL.encode()
    tail = b'"}]}'
    left = total - len(head) - len(tail)
    yield head
    block = b"x" * MB
    while left > 0:
        piece = min(left, MB)
        yield block[:piece]
        left -= piece
    yield tail


@pytest.mark.parametrize("path", [CHAT_PATH, RESPONSES_PATH], ids=["fastpath", "app"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_200_mb_streamed_body_gets_a_413_httpx_reads(router: RouterProcess, framing: str, path: str) -> None:
    # Regression (issue 31, 4): with Content-Length the 413 came before the body was read, with
    # chunked framing mid-body (BodyLimit counting); either way the close reset the connection
    total = 200 * MB
    headers = {"content-type": "application/json"}
    if framing == "content-length":
        headers["content-length"] = str(total)

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as http:
            return await http.post(router.url + path, content=_chat_body(total), headers=headers)

    with _PeakRss(router) as peak:
        answer = asyncio.run(send())
    _assert_httpx_error(answer, 413, "body_too_large", MAX_BODY)
    peak.check()
    _assert_still_serves(router)


# The bounds of the discarding, on a router configured with small ones.
LINGER = {"lingering_max_bytes": 4 * MB, "lingering_timeout_s": 1, "lingering_time_s": 3}


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    served = start_router(
        tmp_path_factory.mktemp("linger"), {"PROMPTEDGE_ROUTER_LIMITS": json.dumps({**LIMITS, **LINGER})}
    )
    yield served
    served.stop()


def _refused_upload(router: RouterProcess) -> socket.socket:
    """A connection whose request the router has refused (413, read here) while its body is still due."""
    sock = router.connect(timeout=30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (1024 * MB)
    )
    status, _, _ = read_response(sock, timeout=30)
    assert status == 413
    return sock


def test_a_client_that_keeps_sending_after_its_answer_is_cut_at_the_byte_bound(tight: RouterProcess) -> None:
    sock = _refused_upload(tight)
    sent = 0
    block = b"x" * (256 * 1024)
    with _PeakRss(tight) as peak:
        try:
            while sent < 256 * MB:  # far past the bound: the router must end it long before
                sock.sendall(block)
                sent += len(block)
        except OSError:
            pass
        finally:
            sock.close()
    # what the router discarded is at most the bound; the rest sat in the two kernels' buffers
    assert sent < 64 * MB, f"sent {sent / MB:.0f} MB before the router closed the connection"
    peak.check()
    assert httpx.get(tight.url + "/health", timeout=30).status_code == 200


def _router_lets_go(router: RouterProcess, sock: socket.socket, seconds: float) -> bool:
    """True once the router holds no descriptor for ``sock``'s connection (within ``seconds``).
    The client cannot tell: lingering half-closes at once, so it reads EOF either way."""
    port = sock.getsockname()[1]
    process = psutil.Process(router.proc.pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(c.raddr and c.raddr.port == port for c in process.net_connections(kind="tcp")):
            return True
        time.sleep(0.1)
    return False


def test_a_client_that_goes_quiet_after_its_answer_is_closed_after_the_idle_bound(tight: RouterProcess) -> None:
    sock = _refused_upload(tight)
    try:
        assert closed_within(sock, 20)  # the half-close: EOF after the answer
        assert _router_lets_go(tight, sock, 20)  # lingering_timeout_s (1 s) after the last byte
    finally:
        sock.close()


def test_a_client_that_trickles_after_its_answer_is_closed_after_the_total_bound(tight: RouterProcess) -> None:
    sock = _refused_upload(tight)
    stop = threading.Event()

    def trickle() -> None:  # a byte every 0.3 s: never idle for lingering_timeout_s
        try:
            while not stop.wait(0.3):
                sock.send(b"x")
        except OSError:
            pass

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        assert _router_lets_go(tight, sock, 20)  # lingering_time_s (3 s) after the answer
    finally:
        stop.set()
        sender.join(timeout=10)
        sock.close()
    assert httpx.get(tight.url + "/health", timeout=30).status_code == 200


def test_a_refused_head_is_answered_even_when_the_rest_never_comes(tight: RouterProcess) -> None:
    # a head over the limit whose client stops sending and waits for the answer
    sock = tight.connect(timeout=30)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (2 * MAX_HEAD))
        status, headers, body = read_response(sock, timeout=30)
        assert (status, json.loads(body)["error"]["code"], headers.get("connection")) == (
            431,
            "headers_too_large",
            "close",
        )
        assert closed_within(sock, 20)
        assert _router_lets_go(tight, sock, 20)
    finally:
        sock.close()


def test_garbage_after_a_whole_request_gets_the_replicas_answer_first(router: RouterProcess) -> None:
    """A valid chat request followed on the same connection by bytes that are no request: the
    replica's 200 answer to the request reaches the client, then the connection closes (before,
    the router closed it unanswered and logged 499 while the replica had served it)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    head = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (
        CHAT_PATH.encode(),
        len(body),
    )
    sock = router.connect()
    try:
        sock.sendall(head + body + b"X\r\n\r\n")
        status, _, answer = read_response(sock, timeout=30)
        assert status == 200 and json.loads(answer)["choices"], (status, answer[:300])
        assert closed_within(sock, 10)
    finally:
        sock.close()
