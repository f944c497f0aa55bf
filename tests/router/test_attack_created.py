"""A replica's ``created`` that is no time (``-Infinity``, ``NaN``) or in the future: the answer
is relayed, its cached hit is served (no 500 from the ``Age`` header's arithmetic) and a
``Cache-Control: max-age`` client never gets it as fresh (its age is unknown).

Found by an attack helper (Dec 2): ``created: -Infinity`` was cached and every hit of the
entry was a 500 ``internal_error`` (``int(inf)`` for ``Age``) until its TTL; ``created`` far in
the future made an entry "0 s old" for every ``max-age`` forever.
"""

from __future__ import annotations

import json

import pytest

from tests.router.conftest import CHAT
from tests.router.raw_replica import RawReplica

URL = "/v1/chat/completions"


def _answer(created: str) -> bytes:
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": "CREATED",
            "model": CHAT["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    )
    return body.replace('"CREATED"', created).encode()


@pytest.fixture()
async def replica():  # type: ignore[no-untyped-def]
    started = await RawReplica().start()
    yield started
    await started.stop()


@pytest.mark.parametrize("created", ["-Infinity", "Infinity", "NaN", "99999999999"])
async def test_a_bogus_created_is_never_a_500_nor_fresh_for_max_age(created, replica, start_router, client) -> None:
    replica.answer = _answer(created)
    router = await start_router([replica.url])
    body = {**CHAT, "messages": [{"role": "user", "content": f"created {created}"}]}
    first = await client.post(router.url + URL, json=body)
    assert first.status_code == 200 and first.headers["x-cache"] == "miss", first.text
    for _ in range(50):  # stored after the answer went out
        hit = await client.post(router.url + URL, json=body)
        assert hit.status_code == 200, hit.text
        if hit.headers["x-cache"] == "exact":
            break
    assert hit.headers["x-cache"] == "exact"
    assert "age" not in hit.headers  # no age to tell
    bounded = await client.post(router.url + URL, json=body, headers={"cache-control": "max-age=60"})
    assert bounded.status_code == 200 and bounded.headers["x-cache"] == "miss", bounded.text
