"""A Responses API id is its tenant's: another tenant that learns it (a log, a shared
screen, a guess) cannot continue that conversation on the replica holding it.

Found by an attack helper (Dec 2): the affinity key was the id alone, so tenant B's request
with tenant A's ``previous_response_id`` was pinned to A's replica, which answered it with A's
conversation as context (vLLM does not know tenants).
"""

from __future__ import annotations

import pytest

from router import ReplicaSpec, RouterSettings, create_app
from tests.router.conftest import MODEL, Served

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("exact_only")]
URL = "/v1/responses"
A, B, A2 = ({"authorization": f"Bearer {key}"} for key in ("sk-a", "sk-b", "sk-a2"))


def ask(text: str, previous: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "input": text, "max_output_tokens": 4}
    if previous is not None:
        body["previous_response_id"] = previous
    return body


async def test_another_tenant_cannot_continue_a_response(start_replica, servers, redis_url, client) -> None:
    replica = await start_replica()
    settings = RouterSettings(redis_url=redis_url, counters_flush_s=0.05, replicas=[ReplicaSpec(url=replica.url,
                              model=MODEL)], api_keys={"sk-a": "team-a", "sk-a2": "team-a", "sk-b": "team-b"})
    router = await Served(create_app(settings)).start()
    servers.append(router)
    first = await client.post(router.url + URL, json=ask("my secret is 42"), headers=A)
    assert first.status_code == 200, first.text
    previous = first.json()["id"]
    for who in (B, {}):  # another tenant, and no key at all
        stolen = await client.post(router.url + URL, json=ask("what was my secret?", previous), headers=who)
        assert stolen.status_code == 404, stolen.text
        assert stolen.json()["error"]["code"] == "previous_response_not_found"
    for who in (A, A2):  # the tenant's own keys go on
        own = await client.post(router.url + URL, json=ask("and then?", previous), headers=who)
        assert own.status_code == 200 and own.json()["previous_response_id"] == previous, own.text
