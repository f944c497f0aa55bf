"""bench/prefix_dispatch.py: the exact-state policy, the no-queueing floor and the bound on
requests any dispatch leaves past the TTFT target."""

from __future__ import annotations

import pytest

from router.dispatch import Weights
from sim import A100
from tests.bench_script import load_bench

pd = load_bench("prefix_dispatch")


def _req(at: float, prompt: int, first_block: int = 1) -> pd.Req:
    """A request whose prompt is ``prompt // 16`` full blocks numbered from ``first_block``."""
    return pd.Req(at, prompt, 4, tuple(range(first_block, first_block + prompt // 16)), (), None)


def _chunked_prefill_ms(prompt: int) -> float:
    """One prompt alone on an idle a100, from the sim's step formula (sim/replica/latency/batch.py)."""
    t, done = 0.0, 0
    while done < prompt:
        chunk = min(prompt - done, A100.max_num_batched_tokens)
        t += (
            A100.decode_base_s
            + A100.decode_per_seq_s
            + A100.kv_read_s_per_token * done
            + A100.prefill_s_per_token * chunk
        )
        done += chunk
    return t * 1000


def test_the_oracle_finds_a_repeated_prompt_cached_but_for_its_last_block() -> None:
    reqs = [_req(0.0, 20_000), _req(5.0, 20_000), _req(9.0, 20_000, first_block=10**6)]
    cached = [c for _, c in pd.oracle_cached(reqs)]
    assert cached == [0, 20_000 - 16, 0]  # vLLM leaves at least one token to compute
    assert pd.hit_rate(pd.oracle_cached(reqs)) == pytest.approx((20_000 - 16) / 60_000)
    assert [c for _, c in pd.oracle_cached(reqs, 0)] == [0, 0, 0]


def test_the_floor_is_the_prompts_own_chunked_prefill_and_the_oracles_cache_lowers_it() -> None:
    reqs = [_req(5.0 * i, 20_000) for i in range(100)]
    assert pd.idle_ttft_p99_ms(pd.oracle_cached(reqs, 0)) == pytest.approx(_chunked_prefill_ms(20_000), abs=0.1)
    # 99 of the 100 find all but the last block cached: one block's prefill and a step
    assert pd.idle_ttft_p99_ms(pd.oracle_cached(reqs)) < 0.1 * pd.idle_ttft_p99_ms(pd.oracle_cached(reqs, 0))


def test_prefix_exact_sends_a_repeated_prompt_where_its_prefix_is_cached() -> None:
    reqs = [_req(0.0, 8_000), _req(10.0, 8_000)]
    exact = pd.run(reqs, "prefix_exact", Weights(stale_after_s=1.0))
    load_only = pd.run(reqs, "gpu_load", Weights(stale_after_s=1.0))
    # hits / queries over both prompts: all of the second but its last block
    assert exact["hit_rate"] == pytest.approx((8_000 - 16) / 16_000, abs=1e-3)
    assert load_only["hit_rate"] == 0.0  # an idle fleet spreads them: the exact state is what moved it


def test_a_burst_of_long_prompts_that_no_packing_fits_leaves_the_excess_late() -> None:
    deadline = 4.0
    capacity = pd.prefill_capacity_tokens(deadline)
    assert 30_000 < capacity < 60_000  # one 30k prompt per replica by the deadline, never two
    burst = [_req(0.0, 30_000, first_block=i * 10**5) for i in range(5)]
    # 5 x 30k is below 4 replicas' capacity in sum, but only one fits each replica
    assert 5 * 30_000 < len(pd.FLEET) * capacity
    assert pd.late_lower_bound(pd.oracle_cached(burst, 0), deadline) == 1
    spread = [_req(10.0 * i, 30_000, first_block=i * 10**5) for i in range(5)]
    assert pd.late_lower_bound(pd.oracle_cached(spread, 0), deadline) == 0


def test_the_bound_counts_the_prefix_hits_the_oracle_would_get() -> None:
    same = [_req(0.0, 30_000) for _ in range(5)]  # one prompt five times: four find it cached
    assert pd.late_lower_bound(pd.oracle_cached(same, 0), 4.0) == 1
    assert pd.late_lower_bound(pd.oracle_cached(same), 4.0) == 0


def test_predicted_ttft_keeps_its_hit_rate_when_four_workers_share_nothing() -> None:
    # each turn of a conversation reaches a random one of 4 router workers, each with its own
    # prefix index: the conversation's rendezvous owner is the same for all of them, so its
    # turns still meet its prefix cache; prefix_aware's per-worker index loses hits
    reqs = pd.chat_sessions(40, 1.0)
    weights = Weights(stale_after_s=1.0)
    mine = {n: pd.run(reqs, "predicted_ttft", weights, workers=n)["hit_rate"] for n in (1, 4)}
    theirs = {n: pd.run(reqs, "prefix_aware", weights, workers=n)["hit_rate"] for n in (1, 4)}
    assert mine[4] >= 0.98 * mine[1]
    assert theirs[4] < 0.98 * theirs[1]
