"""Unit tests of the pure latency model (no clock, no I/O)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim import A100, T4, BatchModel, ModelLimitError, Profile, simulate

TINY = Profile(
    name="tiny",
    max_num_seqs=4,
    max_num_batched_tokens=64,
    kv_capacity_tokens=1000,
    max_model_len=200,
    prefill_s_per_token=0.001,
    decode_base_s=0.01,
    decode_per_seq_s=0.002,
    kv_read_s_per_token=0.0001,
)


def run_to_completion(model: BatchModel) -> dict[int, int]:
    """Step until idle; returns req_id -> tokens generated, counted from the step outcomes."""
    tokens: dict[int, int] = {}
    while not model.idle:
        running_before = {i: s.generated for i, s in model.running.items()}
        out = model.step()
        for i in out.first_token:
            tokens[i] = tokens.get(i, 0) + 1
        for i, before in running_before.items():
            if before > 0:
                tokens[i] = tokens.get(i, 0) + 1
    return tokens


def test_batch_is_capped_at_max_num_seqs() -> None:
    model = BatchModel(TINY)
    for i in range(10):
        model.submit(i, 10, 5)
    model.step()
    assert len(model.running) == 4
    assert len(model.waiting) == 6


def test_kv_capacity_sends_requests_to_the_waiting_queue() -> None:
    profile = replace(TINY, kv_capacity_tokens=100, max_model_len=100, max_num_seqs=8)
    model = BatchModel(profile)
    for i in range(3):
        model.submit(i, 20, 20)  # footprint 40 tokens each: only two fit in 100
    model.step()
    assert sorted(model.running) == [0, 1]
    assert [s.req_id for s in model.waiting] == [2]
    assert 0 < model.kv_usage <= 1
    while 0 in model.running or 1 in model.running:
        model.step()
    model.step()
    assert 2 in model.running


def test_decode_slows_as_the_batch_grows() -> None:
    alone = simulate(TINY, [(0.0, 10, 50)])[0]
    crowded = simulate(replace(TINY, max_num_seqs=32), [(0.0, 10, 50)] * 16)[0]
    assert crowded.e2e_s > alone.e2e_s
    # Same for the real profiles: a full batch decodes slower per step than a single sequence.
    for profile in (A100, T4):
        one = simulate(profile, [(0.0, 100, 200)])[0]
        many = simulate(profile, [(0.0, 100, 200)] * profile.max_num_seqs)[0]
        assert many.e2e_s > one.e2e_s


def test_waiting_requests_queue_behind_a_full_batch() -> None:
    results = simulate(TINY, [(0.0, 10, 30)] * 8)
    queued = sorted(r.queued_s for r in results.values())
    assert queued[:4] == [0.0] * 4
    assert all(q > 0 for q in queued[4:])


@pytest.mark.parametrize("max_tokens", [1, 2, 17, 150])
def test_max_tokens_is_honoured_exactly(max_tokens: int) -> None:
    model = BatchModel(TINY)
    model.submit(0, 30, max_tokens)
    model.submit(1, 5, 3)
    assert run_to_completion(model) == {0: max_tokens, 1: 3}


def test_long_prompt_is_prefilled_in_chunks_before_its_first_token() -> None:
    model = BatchModel(replace(TINY, max_num_batched_tokens=16))
    model.submit(0, 40, 2)
    outcomes = [model.step() for _ in range(3)]
    assert [o.prompt_tokens for o in outcomes] == [16, 16, 8]
    assert [o.first_token for o in outcomes] == [[], [], [0]]


def test_prefill_time_grows_with_prompt_length() -> None:
    short = simulate(TINY, [(0.0, 10, 5)])[0]
    long = simulate(TINY, [(0.0, 190, 5)])[0]
    assert long.ttft_s > short.ttft_s


def test_request_longer_than_max_model_len_is_refused() -> None:
    BatchModel(TINY).submit(0, 150, 50)  # exactly max_model_len fits
    with pytest.raises(
        ModelLimitError,
        match=r"maximum context length is 200 tokens\. However, you requested "
        r"201 tokens \(150 in the messages, 51 in the completion\)",
    ):
        BatchModel(TINY).submit(0, 150, 51)


def test_abort_frees_the_kv_reservation() -> None:
    profile = replace(TINY, kv_capacity_tokens=100, max_model_len=100)
    model = BatchModel(profile)
    model.submit(0, 50, 50)
    model.submit(1, 50, 50)
    model.step()
    assert list(model.running) == [0]
    model.abort(0)
    model.step()
    assert list(model.running) == [1]


def test_idle_model_takes_no_time() -> None:
    assert BatchModel(TINY).step().duration_s == 0.0
