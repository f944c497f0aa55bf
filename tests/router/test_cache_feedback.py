"""POST /v1/cache/feedback over HTTP: a semantic hit carries X-PromptEdge-Cache-Hit-Id when the
per-entry error bound and feedback are on; the key that received it (and only that key) can
report it once; the entry then stops answering that paraphrase for its tenant."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from cache.verify.bound.model import BoundPrior
from tests.router.conftest import MODEL
from tests.router.test_cache_api import PARAPHRASE, QUESTION, chat, post_until_stored

pytestmark = pytest.mark.slow

CLEAN = BoundPrior("cosine", 0.70, (0.70, 0.80), (0.30, 0.97), (1e6, 1e6), offset_var=1.0, source="clean")


@pytest.fixture()
def feedback_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(CLEAN.to_json()))
    monkeypatch.setenv("PROMPTEDGE_CACHE_VERIFIER", "rules")  # the cosine prior judges the rules' choice
    monkeypatch.setenv("PROMPTEDGE_CACHE_ERROR_BOUND", "0.05")
    monkeypatch.setenv("PROMPTEDGE_CACHE_FEEDBACK", "true")
    monkeypatch.setenv("PROMPTEDGE_CACHE_BOUND_PRIOR_PATH", str(path))


async def test_the_key_that_received_a_hit_reports_it_once(
    feedback_on: None, start_replica, start_router, client: httpx.AsyncClient
) -> None:
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme", "key-b": "bravo"})
    url = router.url + "/v1/chat/completions"
    feedback = router.url + "/v1/cache/feedback"
    a, b = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}
    await post_until_stored(client, url, chat(QUESTION), a)
    hit = await client.post(url, json=chat(PARAPHRASE), headers=a)
    assert hit.headers["x-cache"] == "semantic"
    hit_id = hit.headers["x-promptedge-cache-hit-id"]
    report = {"hit_id": hit_id, "verdict": "wrong"}
    other = await client.post(feedback, json=report, headers=b)
    assert other.status_code == 404 and other.json()["error"]["code"] == "unknown_hit"
    for bad, code in (({"hit_id": "x"}, "invalid_hit_id"), ({"hit_id": hit_id, "verdict": "right"}, "invalid_verdict")):
        response = await client.post(feedback, json=bad, headers=a)
        assert response.status_code == 400 and response.json()["error"]["code"] == code
    done = await client.post(feedback, json=report, headers=a)
    assert done.status_code == 200 and done.json() == {"applied": True}
    assert (await client.post(feedback, json=report, headers=a)).status_code == 404  # once
    again = await client.post(url, json=chat(PARAPHRASE), headers={**a, "cache-control": "no-store"})
    assert again.headers["x-cache"] == "miss"
    exact = await client.post(url, json=chat(QUESTION), headers=a)
    assert exact.headers["x-cache"] == "exact" and "x-promptedge-cache-hit-id" not in exact.headers


async def test_feedback_is_off_by_default(start_replica, start_router, client: httpx.AsyncClient) -> None:
    router = await start_router([(await start_replica()).url], model=MODEL)
    url = router.url + "/v1/chat/completions"
    await post_until_stored(client, url, chat(QUESTION), {"authorization": "Bearer key-a"})
    hit = await client.post(url, json=chat(PARAPHRASE), headers={"authorization": "Bearer key-a"})
    assert hit.headers["x-cache"] == "semantic" and "x-promptedge-cache-hit-id" not in hit.headers
    off = await client.post(router.url + "/v1/cache/feedback", json={"hit_id": "0" * 32, "verdict": "wrong"})
    assert off.status_code == 403 and off.json()["error"]["code"] == "feedback_disabled"


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"hit_id": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"hit_id": "' + b"0" * 32 + b'", "verdict": "wrong", "pad": "' + b"x" * 5000 + b'"}',
    ],
)
def test_a_deep_or_large_report_is_a_400_not_a_500(body: bytes) -> None:
    # Regression (attack round, 3 December): 100,000 nested brackets raised RecursionError in
    # json.loads, answered 500 with a traceback logged twice, with no API key needed.
    from router.api.feedback import parse_report
    from router.errors import BadRequest

    with pytest.raises(BadRequest) as raised:
        parse_report(body)
    assert raised.value.status == 400


async def test_every_report_is_logged_with_its_tenant(
    feedback_on: None, start_replica, start_router, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # attack round, 3 December: reports change what the cache serves but left no log line
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"})
    with caplog.at_level("INFO", logger="router.feedback"):
        answer = await client.post(
            router.url + "/v1/cache/feedback",
            json={"hit_id": "0" * 32, "verdict": "wrong"},
            headers={"authorization": "Bearer key-a"},
        )
    assert answer.status_code == 404
    assert any("acme" in r.getMessage() and "unknown hit" in r.getMessage() for r in caplog.records)


async def test_a_long_report_is_refused_before_its_body_is_read(feedback_on: None, start_replica, start_router) -> None:
    # attack round, 4 December: the body was read whole (up to the 8 MiB request limit) before
    # its 1,024-byte bound was checked. A client sends 2 KB of a chunked body and waits: the 400
    # must come without the rest.
    import asyncio
    from urllib.parse import urlsplit

    router = await start_router([(await start_replica()).url])
    where = urlsplit(router.url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    chunk = b"x" * 2048
    writer.write(
        b"POST /v1/cache/feedback HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(chunk), chunk)
    )
    await writer.drain()
    try:
        status = await asyncio.wait_for(reader.readline(), timeout=5)
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 400"), status


async def test_reports_count_against_the_keys_rate_limit(
    feedback_on: None, start_replica, start_router, client: httpx.AsyncClient
) -> None:
    # attack round, 4 December: reports were not rate-limited, and each costs a Lua script in Redis
    router = await start_router(
        [(await start_replica()).url],
        api_keys={"key-a": "acme"},
        rate_limits={"*": {"requests_per_s": 0.1, "burst": 2}},
    )
    report = {"hit_id": "0" * 32, "verdict": "wrong"}
    answers = [
        await client.post(router.url + "/v1/cache/feedback", json=report, headers={"authorization": "Bearer key-a"})
        for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [404, 404, 429]
    assert answers[2].json()["error"]["code"] == "rate_limited" and "retry-after" in answers[2].headers
