"""``OTHER_PATHS=forward`` forwards OpenAI API paths only: a client cannot reach a replica's
operator routes (``/metrics``, ``/sim/faults``, vLLM's ``/sleep`` or LoRA loading) with the
router's backend key, by name or by a dot segment, raw or percent-encoded, nor read a stored
response of ``/v1/responses/{id}`` (another tenant's).

Found by an attack helper (Dec 2): ``POST /sim/faults {"fail_rate": 1}`` through the router
made every replica answer 500 (one request per replica, no key needed), and
``GET /../metrics`` or ``/v1/../metrics`` answered the replica's vLLM metrics instead of
the router's.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.router.raw_replica import RawReplica

pytestmark = pytest.mark.usefixtures("exact_only")

PATHS = [
    "/sim/faults",
    "/../sim/faults",
    "/v1/../sim/faults",
    "/v1/%2e%2e/sim/faults",
    "/v1/%2E%2E/sim/faults",
    "//127.0.0.1/sim/faults",
    "/v1//sim/faults",
    "/v1/./../sim/faults",
    "/v1/load_lora_adapter",
    "/v1/responses/resp_abc",
    "/v1\\..\\sim/faults",
]


async def _raw(port: int, target: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` to ``target`` as it is written (no client normalises it); the router
    runs in this event loop, so the socket is asyncio's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    data = await reader.read()  # Connection: close
    writer.close()
    head, _, content = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, content


@pytest.mark.parametrize("target", PATHS)
async def test_forward_reaches_no_operator_route(target, start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], other_paths="forward")
    port = int(router.url.rsplit(":", 1)[1])
    status, headers, body = await _raw(port, target, b'{"fail_rate": 1.0}')  # as sent: no client normalises it
    assert status == 404, body
    assert b'"Invalid URL' in body and "x-promptedge-replica" not in headers
    faults = await client.post(replica.url + "/sim/faults", json={"fail_rate": 0})  # what the replica holds now
    assert faults.json()["fail_rate"] == 0.0


async def test_an_openai_path_is_still_forwarded(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], other_paths="forward")
    relayed = await client.get(router.url + "/v1/files?limit=1")
    assert relayed.status_code == 404 and relayed.headers["x-promptedge-replica"] == replica.url


async def test_a_body_nested_past_the_recursion_limit_is_forwarded_not_a_500(
    start_replica, start_router, client
) -> None:
    """Found the same day: ``json.loads`` of such a body (looking for its ``model``) raised
    RecursionError, a 500 ``internal_error`` with a traceback in the log."""
    replica = await start_replica()
    router = await start_router([replica.url], other_paths="forward")
    deep = await client.post(
        router.url + "/v1/files", content=b"[" * 100_000, headers={"content-type": "application/json"}
    )
    assert deep.status_code == 404 and deep.headers["x-promptedge-replica"] == replica.url, deep.text


# Attack review (Dec 2, F12): a replica's own error on a forwarded path was relayed as it came:
# FastAPI's {"detail": ...}, an HTML page, plain text, none of which an OpenAI client can read
# (the openai SDK looks for body["error"]), and whatever the page held reached the client.
def _openai_error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status and response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    return error


async def test_a_replicas_non_openai_error_is_wrapped_with_its_status(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], other_paths="forward")
    relayed = await client.get(router.url + "/v1/files?limit=1")  # the sim (FastAPI): {"detail": "Not Found"}
    error = _openai_error(relayed, 404)
    assert error["message"] == "Not Found" and error["type"] == "invalid_request_error"
    assert error["code"] == "not_found" and relayed.headers["x-promptedge-replica"] == replica.url


@pytest.fixture()
async def raw():  # type: ignore[no-untyped-def]
    started = await RawReplica().start()
    yield started
    await started.stop()


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [
        (b"404 Not Found", b"text/html", b"<html><body><h1>404</h1><p>/srv/app/secret.py line 12</p></body></html>"),
        (b"400 Bad Request", b"text/plain", b"bad thing\x1b[31m " + b"z" * 10_000),
        (
            b"422 Unprocessable Entity",
            b"application/json",
            b'{"detail": [{"loc": ["body", "x"], "msg": "field required"}]}',
        ),
        (b"409 Conflict", b"application/json", b"not json at all {"),
    ],
)
async def test_an_error_page_reaches_the_client_as_bounded_openai_json(
    status, content_type, body, raw, start_router, client
) -> None:
    raw.status, raw.content_type, raw.answer = status, content_type, body
    router = await start_router([raw.url], other_paths="forward")
    relayed = await client.post(router.url + "/v1/files", json={"purpose": "batch"})
    error = _openai_error(relayed, int(status.split()[0]))
    message = str(error["message"])
    assert len(message) <= 300 and message.isprintable()
    assert "/srv/app" not in message and "<" not in message


async def test_an_openai_shaped_replica_error_is_relayed_as_it_came(raw, start_router, client) -> None:
    raw.status = b"409 Conflict"
    raw.answer = (
        b'{"error": {"message": "file is busy", "type": "invalid_request_error", "param": null, "code": "busy"}}'
    )
    router = await start_router([raw.url], other_paths="forward")
    relayed = await client.post(router.url + "/v1/files", json={"purpose": "batch"})
    assert relayed.status_code == 409 and relayed.content == raw.answer
