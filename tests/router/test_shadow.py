"""Shadow verification's pure decisions (router/caching/shadow.py) and its task budget
(router/caching/shadowing.py) without services: the replica call and the label are injected."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry, Counter

from cache.verify.bound.label import compared_label, judgeable
from router.caching.shadow import decide, shadow_body
from router.caching.shadowing import ShadowVerifier
from router.errors import NoReplica


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0, "n": 1}, True),
        ({}, False),
        ({"temperature": None}, False),
        ({"temperature": 0.7}, False),
        ({"temperature": 0, "n": 2}, False),
        ({"temperature": False}, False),
        ({"temperature": "0"}, False),
    ],
)
def test_judgeable_is_compared_labels_own_rule(body: dict, expected: bool) -> None:
    answer = {"choices": [{"index": 0, "message": {"content": "x"}}]}
    assert judgeable(body) is expected
    assert (compared_label(body, answer, answer) is not None) is expected


@pytest.mark.parametrize(
    "rate, draw, judged, inflight, expected",
    [
        (0.0, 0.0, True, 0, None),  # off: never drawn
        (0.1, 0.1, True, 0, None),  # not drawn: nothing to count
        (0.1, 0.0999, False, 0, "ineligible"),
        (1.0, 0.9999, True, 2, "skipped_budget"),
        (1.0, 0.5, False, 2, "ineligible"),  # a sampled request is never a budget question
        (1.0, 0.0, True, 1, "run"),
    ],
)
def test_decide(rate: float, draw: float, judged: bool, inflight: int, expected: str | None) -> None:
    assert decide(rate, draw, judged, inflight, max_inflight=2) == expected


def test_shadow_body_asks_for_the_whole_answer_and_keeps_the_rest() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = json.loads(shadow_body(body))
    assert sent == {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0, "max_tokens": 8}
    assert "stream" in body  # the client's body is left as it was


def _counter() -> Counter:
    return Counter("shadow", "test", ["pool", "outcome"], registry=CollectorRegistry())


def _counts(counter: Counter) -> dict[str, float]:
    return {s.labels["outcome"]: s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")}


GREEDY = {"temperature": 0}


async def test_a_full_budget_skips_without_calling_and_the_call_is_counted_once() -> None:
    counter = _counter()
    verifier = ShadowVerifier(rate=1.0, max_inflight=1, counter=counter)
    release = asyncio.Event()
    calls = 0

    async def fetch() -> dict:
        nonlocal calls
        calls += 1
        await release.wait()
        return {"choices": []}

    async def label(fresh: dict) -> bool | None:
        return True

    assert verifier.offer("p", GREEDY, fetch, label, lambda: True) == "run"
    assert verifier.offer("p", GREEDY, fetch, label, lambda: True) == "skipped_budget"
    await asyncio.sleep(0)
    assert calls == 1 and verifier.inflight == 1
    release.set()
    await verifier.drain()
    assert verifier.inflight == 0
    assert _counts(counter) == {"skipped_budget": 1.0, "right": 1.0}


async def test_a_saturated_pool_is_skipped_and_errors_give_no_label() -> None:
    counter = _counter()
    verifier = ShadowVerifier(rate=1.0, max_inflight=4, counter=counter)
    labelled: list[dict] = []

    async def fetch() -> dict:
        raise NoReplica("no replica", code="no_replica")

    async def label(fresh: dict) -> bool | None:
        labelled.append(fresh)
        return True

    assert verifier.offer("p", GREEDY, fetch, label, lambda: False) == "skipped_load"
    assert verifier.offer("p", GREEDY, fetch, label, lambda: True) == "run"
    await verifier.drain()
    assert labelled == [] and _counts(counter) == {"skipped_load": 1.0, "error": 1.0}


async def test_close_cancels_calls_in_flight() -> None:
    verifier = ShadowVerifier(rate=1.0, max_inflight=2, counter=_counter())
    cancelled = asyncio.Event()

    async def fetch() -> dict:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    async def label(fresh: dict) -> bool | None:
        return None

    verifier.offer("p", GREEDY, fetch, label, lambda: True)
    await asyncio.sleep(0)
    await verifier.aclose()
    assert cancelled.is_set() and verifier.inflight == 0
