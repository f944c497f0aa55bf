"""Replicas reserved for long prompts: the pure lane decision, and end to end through sim replicas."""

from __future__ import annotations

import asyncio

import pytest

from router import ReplicaSpec
from router.discovery.file import load_replicas_file
from router.discovery.slices import SliceRules, replicas_of
from router.dispatch.lanes import LONG, NORMAL, Lane, choose, own_lane, readiness
from tests.router.conftest import CHAT, MODEL
from tests.router.fake_kube_api import endpoint, endpoint_slice
from tests.router.test_admission import load_behind_the_routers_back


def test_own_lane_is_long_only_for_long_prompts() -> None:
    assert [own_lane(s) for s in ("short", "medium", "long")] == [NORMAL, NORMAL, LONG]


def test_each_class_keeps_to_its_lane_while_that_has_room() -> None:
    both = {NORMAL: [0, 1], LONG: [0]}
    assert choose(NORMAL, both) == Lane(NORMAL, 0)
    assert choose(LONG, both) == Lane(LONG, 0)


def test_long_prompts_wait_in_their_lane_even_when_it_is_saturated() -> None:
    # The reservation protects the normal lane: a full long lane queues (or sheds) its own
    # requests and the pressure says so, instead of pushing long prefills onto short requests.
    assert choose(LONG, {NORMAL: [0, 0], LONG: [2]}) == Lane(LONG, 2)


def test_long_prompts_use_the_normal_lane_when_no_long_replica_is_eligible() -> None:
    assert choose(LONG, {NORMAL: [1], LONG: []}) == Lane(NORMAL, 1)
    assert choose(LONG, {NORMAL: [0]}) == Lane(NORMAL, 0)


@pytest.mark.parametrize(
    ("pressures", "expected"),
    [
        ({NORMAL: [1, 1], LONG: [0]}, Lane(LONG, 0)),  # every normal replica saturated, long has room
        ({NORMAL: [2], LONG: [1]}, Lane(LONG, 1)),  # overloaded vs saturated: the lesser evil
        ({NORMAL: [], LONG: [2]}, Lane(LONG, 2)),  # normal lane down
        ({NORMAL: [1], LONG: [1]}, Lane(NORMAL, 1)),  # equally full: stay home
        ({NORMAL: [0, 2], LONG: [0]}, Lane(NORMAL, 0)),  # one normal replica has room
    ],
)
def test_short_prompts_borrow_the_long_lane_only_when_the_normal_lane_is_worse(
    pressures: dict[str, list[int]], expected: Lane
) -> None:
    assert choose(NORMAL, pressures) == expected


def test_no_eligible_replica_no_lane() -> None:
    assert choose(NORMAL, {}) is None
    assert choose(LONG, {NORMAL: [], LONG: []}) is None


def test_readiness_counts_replicas_and_ready_ones_per_lane() -> None:
    members = [(NORMAL, True), (LONG, False), (NORMAL, False), (LONG, False)]
    assert readiness(members) == {NORMAL: {"replicas": 2, "ready": 1}, LONG: {"replicas": 2, "ready": 0}}
    assert readiness([(NORMAL, True)]) == {NORMAL: {"replicas": 1, "ready": 1}}


def test_role_from_a_slice_label_and_from_the_replica_file(tmp_path) -> None:
    rules = SliceRules(model="llama", role_label="promptedge.io/role")
    (long_one,), _ = replicas_of(
        endpoint_slice("l", [endpoint("10.0.0.1")], 8000, {"promptedge.io/role": "long"}), rules
    )
    (plain,), _ = replicas_of(endpoint_slice("p", [endpoint("10.0.0.2")], 8000, {}), rules)
    assert (long_one.spec.role, plain.spec.role) == (LONG, NORMAL)
    replicas, problem = replicas_of(
        endpoint_slice("t", [endpoint("10.0.0.3")], 8000, {"promptedge.io/role": "lnog"}), rules
    )
    assert replicas == [] and problem is not None and "promptedge.io/role='lnog'" in problem
    path = tmp_path / "replicas.yaml"
    path.write_text("replicas:\n  - {url: 'http://a:1', model: m}\n  - {url: 'http://b:1', model: m, role: long}\n")
    assert [r.role for r in load_replicas_file(path)] == [NORMAL, LONG]


# --- end to end: a router in front of one normal and one reserved sim replica ------------------

SHORT = CHAT
LONG_BODY = {**CHAT, "messages": [{"role": "user", "content": "tell me about this log: " + "x" * 400}]}
THRESHOLDS = (20, 100)  # prompt tokens; the FAST sim profile's context is 1000 tokens


async def reserved_pool(start_replica, start_router, **settings):
    normal, reserved = await start_replica(), await start_replica()
    specs = [ReplicaSpec(url=normal.url, model=MODEL), ReplicaSpec(url=reserved.url, model=MODEL, role="long")]
    router = await start_router([], specs=specs, size_thresholds=THRESHOLDS, **settings)
    return normal, reserved, router


async def test_long_prompts_go_to_the_reserved_replica_and_short_ones_do_not(
    start_replica, start_router, client
) -> None:
    normal, reserved, router = await reserved_pool(start_replica, start_router)
    url = router.url + "/v1/chat/completions"
    for i in range(4):
        short = await client.post(url, json={**SHORT, "temperature": 0.1 * i})
        long = await client.post(url, json={**LONG_BODY, "temperature": 0.1 * i})
        assert short.status_code == long.status_code == 200
        assert (short.headers["x-promptedge-replica"], short.headers["x-promptedge-lane"]) == (normal.url, NORMAL)
        assert (long.headers["x-promptedge-replica"], long.headers["x-promptedge-lane"]) == (reserved.url, LONG)
        assert "x-promptedge-spilled-from" not in short.headers and "x-promptedge-spilled-from" not in long.headers


async def test_short_prompts_borrow_the_reserved_replica_when_the_normal_one_is_saturated(
    start_replica, start_router, client
) -> None:
    normal, reserved, router = await reserved_pool(start_replica, start_router, queue_limit=2, scrape_interval_s=0.05)
    tasks = await load_behind_the_routers_back(client, normal, 5)  # 3 waiting: saturated (>= 2)
    await asyncio.sleep(0.15)
    url = router.url + "/v1/chat/completions"
    short = await client.post(url, json=SHORT, headers={"x-priority": "P2"})  # would be shed without the lane
    assert short.status_code == 200
    assert short.headers["x-promptedge-replica"] == reserved.url
    assert (short.headers["x-promptedge-lane"], short.headers["x-promptedge-spilled-from"]) == (LONG, NORMAL)
    await asyncio.gather(*tasks)


async def test_long_prompts_use_the_normal_replica_when_the_reserved_one_is_down(
    start_replica, start_router, client, servers
) -> None:
    normal, reserved, router = await reserved_pool(start_replica, start_router, health_interval_s=0.05)
    await reserved.stop()
    servers.remove(reserved)
    state = router.app.state.router
    replica = next(r for r in state.pools.all() if r.url == reserved.url)
    for _ in range(100):  # the active probes take it out (fall = 2)
        if not replica.health.up:
            break
        await asyncio.sleep(0.02)
    long = await client.post(router.url + "/v1/chat/completions", json=LONG_BODY)
    assert long.status_code == 200
    assert long.headers["x-promptedge-replica"] == normal.url
    assert (long.headers["x-promptedge-lane"], long.headers["x-promptedge-spilled-from"]) == (NORMAL, LONG)


async def test_health_is_degraded_naming_pool_and_lane_when_every_long_replica_is_down(
    start_replica, start_router, client, servers
) -> None:
    # Regression: /health stayed "ok" with the long lane down (long prompts then spill onto the
    # normal lane), as only a pool without any ready replica counted.
    normal, reserved, router = await reserved_pool(start_replica, start_router, health_interval_s=0.05)
    both = await client.get(router.url + "/health")
    assert both.status_code == 200 and both.json()["status"] == "ok"
    assert both.json()["pools"][MODEL] == {
        "replicas": 2,
        "ready": 2,
        "lanes": {NORMAL: {"replicas": 1, "ready": 1}, LONG: {"replicas": 1, "ready": 1}},
    }
    await reserved.stop()
    servers.remove(reserved)
    replica = next(r for r in router.app.state.router.pools.all() if r.url == reserved.url)
    for _ in range(100):  # the active probes take it out (fall = 2)
        if not replica.health.up:
            break
        await asyncio.sleep(0.02)
    health = await client.get(router.url + "/health")
    assert health.status_code == 200  # as for a pool without a ready replica: the body says degraded
    assert health.json()["status"] == "degraded"
    assert health.json()["pools"][MODEL] == {
        "replicas": 2,
        "ready": 1,
        "lanes": {NORMAL: {"replicas": 1, "ready": 1}, LONG: {"replicas": 1, "ready": 0}},
    }


async def test_a_pool_without_reserved_replicas_has_no_lane_headers(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url], size_thresholds=THRESHOLDS)
    response = await client.post(router.url + "/v1/chat/completions", json=LONG_BODY)
    assert response.status_code == 200 and "x-promptedge-lane" not in response.headers
