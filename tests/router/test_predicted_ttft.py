"""The predicted-TTFT dispatch policy's pure core (router/dispatch/ttft.py, ``pick`` with
``predicted_ttft``): the prediction, the speeds it learns per replica, its priors before any
data, the degrade to today's scoring on stale signals, and the conversation owner that every
router worker computes alike."""

from __future__ import annotations

import anyio
import pytest

from router.dispatch import Context, ReplicaView, Weights, pick
from router.dispatch.prefix_index import conversation
from router.dispatch.signals import Signals
from router.dispatch.ttft import (
    TtftConfig,
    TtftSpeed,
    itl_sample,
    observe_itl,
    observe_ttft,
    predict,
    rendezvous,
    speeds,
    steps,
)
from sim import A100, T4, BatchModel

C = TtftConfig()
W = Weights()


def idle(key: str, ttft: TtftSpeed | None = None, running: float = 0.0, prefill: int = 0, **kw: object) -> ReplicaView:
    """A replica freshly scraped with ``running`` sequences decoding and nothing waiting."""
    sig = Signals(waiting=0.0, running=running, kv_usage=0.1)
    return ReplicaView(key, int(running), sig, int(running), 0.1, None, prefill, ttft, **kw)  # type: ignore[arg-type]


def measured(profile_prompt: int, profile: object) -> tuple[float, float]:
    """(TTFT s of a cold ``profile_prompt``-token prompt alone, ITL s) on a sim replica of ``profile``."""
    model = BatchModel(profile)  # type: ignore[arg-type]
    model.submit(0, profile_prompt, 20)
    t, first = 0.0, None
    while True:
        out = model.step()
        t += out.duration_s
        if out.first_token and first is None:
            first = t
        if out.finished:
            assert first is not None
            return first, (t - first) / 19


def taught(profile: object, n: int = 6) -> TtftSpeed:
    """A replica's speeds learned from ``n`` answers of the sim profile (cold prompts, idle)."""
    speed = None
    for _ in range(n):
        ttft, itl = measured(4000, profile)
        speed = observe_ttft(speed, ttft, 4000, 0.0)
        speed = observe_itl(speed, itl)
    assert speed is not None
    return speed


def test_prediction_counts_queued_prefill_own_uncached_part_and_steps() -> None:
    # 3,000 tokens ahead + 1,000 own at 0.1 ms each, 2 steps of 2,048 tokens (minus 48 decodes) at 10 ms
    assert steps(4000, 48) == 2
    assert predict(3000, 1000, 48, None) == pytest.approx(4000 * 1e-4 + 2 * 0.010)
    # a running batch takes its decode tokens out of each step's prefill budget
    assert steps(4000, 2000) == 84 and predict(0, 4000, 2000, None) > predict(0, 4000, 0, None) * 2.5


def test_priors_before_any_data_rank_replicas_by_queued_work_alone() -> None:
    views = [idle("a", prefill=3000), idle("b", prefill=0), idle("c", prefill=500)]
    assert speeds(None) == (C.prefill_s_per_token, C.step_s)
    chosen = pick(views, "predicted_ttft", Context(prompt_tokens=2000), W)
    assert chosen.key == "b"


def test_learned_speeds_score_a_mixed_a100_t4_pool_right() -> None:
    a100, t4 = taught(A100), taught(T4)
    p_a, s_a = speeds(a100)
    p_t, s_t = speeds(t4)
    assert s_t / s_a == pytest.approx(T4.decode_base_s / A100.decode_base_s, rel=0.2)
    assert p_t / p_a > 4.0  # the T4's prefill is ~6x slower; the ITL alone would say ~2.8x
    # an idle T4 loses to an A100 with 2,000 tokens queued for a 4,000-token prompt...
    views = [idle("t4", t4), idle("a100", a100, prefill=2000)]
    assert pick(views, "predicted_ttft", Context(prompt_tokens=4000), W).key == "a100"
    # ...and wins once the A100's queue is longer than the T4's whole prefill takes
    views = [idle("t4", t4), idle("a100", a100, prefill=40_000)]
    assert pick(views, "predicted_ttft", Context(prompt_tokens=4000), W).key == "t4"


def test_prefix_hit_wins_unless_its_replica_is_over_the_load_bound() -> None:
    match = {"b": 0.9}
    views = [idle("a"), idle("b", prefill=1000)]
    assert pick(views, "predicted_ttft", Context(prompt_tokens=6000, prefix_match=match), W).key == "b"
    crowded = [idle("a"), idle("c"), idle("d"), idle("b", running=30.0)]  # far above the mean
    assert pick(crowded, "predicted_ttft", Context(prompt_tokens=6000, prefix_match=match), W).key != "b"


def test_samples_on_guesses_teach_nothing_and_clean_ones_can_only_slow_a_replica() -> None:
    assert observe_ttft(None, 5.0, 1000, 0.0, ahead_tokens=500) == TtftSpeed()  # others' queue: a guess
    assert observe_ttft(None, 5.0, 1000, 0.0, cached_tokens=500) == TtftSpeed()  # cache: a guess
    assert observe_ttft(None, 5.0, 100, 0.0) == TtftSpeed()  # too little prefill to say anything
    fast = observe_ttft(None, 0.01, 4000, 0.0)  # looks 10x faster than the prior: cached after all
    assert speeds(fast)[0] == pytest.approx(C.prefill_s_per_token)
    slow = observe_ttft(None, 10.0, 4000, 0.0)  # an absurd stall is clipped
    assert speeds(observe_ttft(slow, 10.0, 4000, 0.0))[0] <= C.prefill_s_per_token * C.max_ratio
    assert itl_sample(1.0, 2.0, 11) == pytest.approx(0.1) and itl_sample(1.0, 2.0, 1) is None


def test_stale_signals_degrade_to_prefix_aware() -> None:
    # one replica's scrape is older than stale_after_s: the running batch is unknown, so the
    # choice is exactly today's prefix_aware one
    fresh_view = idle("a", prefill=100)
    stale = ReplicaView("b", 3, Signals(waiting=0.0, running=0.0), 3, 5.0, None, 0)
    for prefill in (0, 5000):
        views = [idle("a", prefill=prefill), stale]
        for match in ({}, {"a": 0.8}, {"b": 0.8}):
            ctx = Context(prompt_tokens=3000, prefix_match=match)
            assert pick(views, "predicted_ttft", ctx, W) == pick(views, "prefix_aware", ctx, W)
    assert pick([fresh_view, stale], "predicted_ttft", Context(prompt_tokens=3000), W).key == "a"


def test_every_worker_sends_a_conversation_to_its_rendezvous_owner() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "s" * 4000},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "second question"},
        ]
    }
    key, carried, head = conversation(body)
    first_turn_key, first_carried, _ = conversation({"messages": body["messages"][:2]})
    assert key == first_turn_key and first_carried == 0.0
    assert 0.9 < carried < 1.0  # all but the last answer and question
    assert head == pytest.approx(len("system\x1f" + "s" * 4000 + "\x1e") / 4000, rel=0.05)
    assert conversation({"prompt": "plain"}) == (None, 0.0, 0.0)
    keys = [f"http://r{i}:8000" for i in range(4)]
    owner = rendezvous(key or "", keys)
    assert owner == rendezvous(key or "", list(reversed(keys)))  # order-free: every worker agrees
    assert rendezvous(key or "", [k for k in keys if k != owner]) != owner
    # a worker that never saw this conversation (empty index) still picks the owner...
    views = [idle(k) for k in keys]
    ctx = Context(prompt_tokens=3000, conversation=key, carried_tokens=int(3000 * carried))
    assert pick(views, "predicted_ttft", ctx, W).key == owner
    # ...unless the owner is far slower right now (a long prefill queued there)
    views = [idle(k, prefill=50_000 if k == owner else 0) for k in keys]
    assert pick(views, "predicted_ttft", ctx, W).key != owner


def test_a_conversation_keeps_its_owner_while_the_scrapes_are_stale() -> None:
    """Stale scrapes (a loaded router, a slow /metrics) used to hand the choice to prefix_aware
    and its per-worker index, so turns of one conversation taken by different workers split
    across replicas (tests/router/test_workers_dispatch.py failed so in a CI run). The owner
    needs no scrape: every worker still sends the conversation there, within the load bound."""
    keys = [f"http://r{i}:8000" for i in range(4)]
    key = "conversation-key"
    owner = rendezvous(key, keys)
    other = next(k for k in keys if k != owner)

    def stale(k: str, inflight: int = 0) -> ReplicaView:
        return ReplicaView(k, inflight, Signals(waiting=0.0, running=0.0), inflight, 5.0, None, 0)

    views = [stale(k) for k in keys]
    # this worker's index knows the prompt only on another replica (a turn another worker
    # routed there, or none): the owner still wins, as on every other worker
    for match in ({}, {other: 0.9}):
        ctx = Context(prompt_tokens=3000, conversation=key, carried_tokens=2000, prefix_match=match)
        assert pick(views, "predicted_ttft", ctx, W).key == owner
    # past the load bound the owner is skipped, as with fresh scrapes
    crowded = [stale(k, inflight=40 if k == owner else 0) for k in keys]
    ctx = Context(prompt_tokens=3000, conversation=key, carried_tokens=2000)
    assert pick(crowded, "predicted_ttft", ctx, W).key != owner


def test_a_replica_learns_from_its_streams_first_token_and_inter_token_latency() -> None:
    from router.dispatch.affinity import PrefixMap
    from router.dispatch.prefix_index import PrefixIndexes
    from router.fleet.health import HealthConfig
    from router.fleet.replicas import Replica
    from router.forward.chooser import Chooser
    from router.settings import ReplicaSpec

    slow, fast = (Replica(ReplicaSpec(url=u, model="m"), HealthConfig()) for u in ("http://t4", "http://a100"))
    for replica in (slow, fast):
        replica.observe(Signals(waiting=0.0, running=0.0, kv_usage=0.0), 0.0)
    for _ in range(6):  # cold 4,000-token prompts on the idle T4: 0.6 ms a token, 25 ms a step
        lease = slow.lease(4000, streamed=True)
        lease.first_token(4000 * 0.0006 + 2 * 0.025)
        lease.release()
        slow.observe_itl(10.0, 10.0 + 19 * 0.025, 20)
    lease = slow.lease(4000, streamed=False)  # no stream: its first byte says nothing of prefill
    lease.first_token(99.0)
    lease.release()
    # the first two TTFTs are 6x the prior before the ITL showed a slow GPU: dropped as outliers
    # (a wait for KV space looks the same), the later ones learned
    assert slow.ttft is not None and slow.ttft.prefill_samples == 4
    assert speeds(slow.ttft)[0] == pytest.approx(0.0006, rel=0.05)
    assert speeds(slow.ttft)[1] == pytest.approx(0.025, rel=0.05)
    chooser = Chooser("predicted_ttft", W, PrefixMap(120.0), PrefixIndexes(256, 400_000))
    fast.prefill_tokens = 8000  # the A100 has 8,000 tokens queued, still faster than the idle T4
    chosen, to_prefill = chooser.choose([slow, fast], 0.5, prompt_tokens=4000)
    assert chosen is fast and to_prefill == 4000


@pytest.mark.usefixtures("exact_only")  # dispatch only: no embedding model to load
async def test_live_router_keeps_a_conversation_on_its_owner(start_replica, start_router, client) -> None:  # type: ignore[no-untyped-def]
    # the default policy, live: each conversation's turns reach one replica (its rendezvous
    # owner, the same in every worker), and different conversations spread over the pool
    from router.settings import RouterSettings
    from tests.router.conftest import CHAT, MODEL

    assert RouterSettings().policy == "predicted_ttft"
    replicas = [await start_replica() for _ in range(3)]
    router = await start_router([r.url for r in replicas], policy="predicted_ttft")
    url = router.url + "/v1/chat/completions"
    pool = router.app.state.router.pools.by_model[MODEL]
    for _ in range(200):  # until every replica has been scraped (before, prefix_aware decides)
        if all(r.signals is not None for r in pool):
            break
        await anyio.sleep(0.05)
    owners = set()
    for c in range(6):
        messages = [{"role": "system", "content": "You help. " * 100}, {"role": "user", "content": f"conversation {c}"}]
        served = []
        for turn in range(3):
            answer = await client.post(url, json={**CHAT, "messages": messages, "max_tokens": 4})
            assert answer.status_code == 200
            served.append(answer.headers["x-promptedge-replica"])
            messages = [
                *messages,
                {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"turn {turn + 1}"},
            ]
        assert len(set(served)) == 1, served
        owners.add(served[0])
    assert len(owners) >= 2


def loaded(key: str, ttft: TtftSpeed | None, running: float = 64.0, waiting: float = 4.0) -> ReplicaView:
    """A replica freshly scraped with ``running`` decoding and ``waiting`` queued requests that
    other router workers sent (none of this router's own)."""
    sig = Signals(waiting=waiting, running=running, kv_usage=0.5)
    return ReplicaView(key, 0, sig, 0, 0.1, None, 0, ttft)


def test_a_stalled_replica_left_idle_drifts_back_to_the_priors_and_wins_picks_again() -> None:
    # attack A1: three streams with a 2 s ITL (a warm-up hiccup) made a replica look 50x slower
    # for good: it got no traffic, so nothing corrected it (0 of 1000 picks)
    healthy = taught(A100)
    stalled = None
    for t in (100.0, 101.0, 102.0):
        stalled = observe_itl(stalled, 2.0, now=t)
    assert stalled is not None
    views = [loaded("a", healthy), loaded("b", healthy), loaded("c", healthy), idle("s", stalled)]
    soon = [pick(views, "predicted_ttft", Context(ticket=i, prompt_tokens=2000, now=103.0), W).key for i in range(50)]
    assert "s" not in soon  # right after the stall the estimate is trusted: avoided
    # idle for a few half-lives, its estimate has lost its trust: it is scored near the priors,
    # so with the others busy it wins again (and a request there measures it afresh)
    later = 102.0 + 6 * C.half_life_s
    p_s, s_s = speeds(stalled, C, now=later)
    assert s_s < 2 * C.step_s and p_s < 2 * C.prefill_s_per_token
    picks = [pick(views, "predicted_ttft", Context(ticket=i, prompt_tokens=2000, now=later), W).key for i in range(50)]
    assert picks.count("s") == 50
    # its next healthy answer all but replaces the stale estimate rather than nudging it (a
    # fresh estimate is trusted fully again: 0.5 s nudged by alpha would stay > 0.3 s)
    fresh = observe_itl(stalled, C.step_s, now=later)
    assert speeds(fresh, C, now=later)[1] < 2 * C.step_s


def test_a_replica_whose_ttft_turns_10x_worse_loses_the_pick_after_a_few_samples() -> None:
    # attack A2: every sample > outlier_ratio x the estimate was dropped, so a real 10x slowdown
    # was never learned and the replica kept winning
    ttft, _ = measured(4000, A100)
    a = b = taught(A100)
    views = [idle("a", a), idle("b", b, prefill=2000)]
    assert pick(views, "predicted_ttft", Context(prompt_tokens=4000), W).key == "a"
    dropped = observe_ttft(a, 10 * ttft, 4000, 0.0)  # one outlier alone is still dropped...
    assert speeds(dropped) == speeds(a)
    assert speeds(observe_ttft(observe_ttft(dropped, ttft, 4000, 0.0), 10 * ttft, 4000, 0.0)) == speeds(
        observe_ttft(dropped, ttft, 4000, 0.0)
    )  # ...and a normal sample in between resets the run
    for _ in range(C.outlier_run + 2):
        a = observe_ttft(a, 10 * ttft, 4000, 0.0)
    assert speeds(a)[0] > 3 * speeds(b)[0]
    views = [idle("a", a), idle("b", b, prefill=2000)]
    assert pick(views, "predicted_ttft", Context(prompt_tokens=4000), W).key == "b"
