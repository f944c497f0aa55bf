"""A Responses API id is its tenant's: another tenant that learns it (a log, a shared
screen, a guess) cannot continue that conversation on the replica holding it.

Found by an attack helper (Dec 2): the affinity key was the id alone, so tenant B's request
with tenant A's ``previous_response_id`` was pinned to A's replica, which answered it with A's
conversation as context (vLLM does not know tenants).
"""

from __future__ import annotations

import logging

import pytest

from router import ReplicaSpec, RouterSettings, create_app
from sim.stack import RedisServer
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
    settings = RouterSettings(
        redis_url=redis_url,
        counters_flush_s=0.05,
        replicas=[ReplicaSpec(url=replica.url, model=MODEL)],
        api_keys={"sk-a": "team-a", "sk-a2": "team-a", "sk-b": "team-b"},
    )
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


async def test_with_redis_down_a_follow_up_is_refused_not_sent_unchecked(
    start_replica, servers, client, caplog
) -> None:
    # Attack review (Dec 2, F8): with the store of id -> (tenant, replica) down, a follow-up was
    # dispatched to any replica without checking whose response it continues (fail open).
    replica = await start_replica()
    with RedisServer() as redis_server:
        settings = RouterSettings(
            redis_url=redis_server.url,
            counters_flush_s=0.05,
            replicas=[ReplicaSpec(url=replica.url, model=MODEL)],
            api_keys={"sk-a": "team-a", "sk-b": "team-b"},
        )
        router = await Served(create_app(settings)).start()
        servers.append(router)
        first = await client.post(router.url + URL, json=ask("my secret is 42"), headers=A)
        assert first.status_code == 200, first.text
        previous = first.json()["id"]
        redis_server.kill()  # a real Redis process dies (SIGKILL)
        with caplog.at_level(logging.WARNING):
            for who in (B, A):  # checked for nobody: not another tenant, not the owner either
                refused = await client.post(router.url + URL, json=ask("what was my secret?", previous), headers=who)
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["type"] == "service_unavailable"
                assert refused.json()["error"]["code"] == "state_store_unavailable"
                assert refused.json()["error"]["param"] == "previous_response_id"
        assert not [r for r in caplog.records if r.exc_info]
        fresh = await client.post(router.url + URL, json=ask("a new conversation"), headers=B)
        assert fresh.status_code == 200, fresh.text  # no previous response: nothing to check
        metrics = (await client.get(router.url + "/metrics")).text
        assert f'promptedge_router_response_affinity_unavailable_total{{op="lookup",pool="{MODEL}"}} 2.0' in metrics
