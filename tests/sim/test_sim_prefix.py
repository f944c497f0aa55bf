"""The simulator's prefix cache: block-hash chain, LRU eviction, prefill of uncached tokens
only, vLLM's prefix-cache counters in tokens, and prompts built from Mooncake hash_ids."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sim import BatchModel, Profile
from sim.client.prefix_text import BLOCK_CHARS, prompt_from_blocks
from sim.client.replay import ReplayConfig, plan_requests
from sim.client.traces import TraceRequest
from sim.replica.latency.prefix import KVBlockPool, block_hashes
from sim.replica.tokens import chat_token_ids, estimate_chat_tokens

PREFILL = Profile(
    name="prefill",
    max_num_seqs=4,
    max_num_batched_tokens=4096,
    kv_capacity_tokens=4096,
    max_model_len=2048,
    prefill_s_per_token=0.001,
    decode_base_s=0.01,
    decode_per_seq_s=0.0,
    kv_read_s_per_token=0.0,
)


def test_block_hashes_chain_equal_prefixes_and_only_full_blocks() -> None:
    a = list(range(100))
    b = list(range(40)) + [999] + list(range(41, 100))  # differs in block 2 (tokens 32..47)
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(ha) == 6  # 100 // 16 full blocks; the partial last block gets no hash
    assert ha[:2] == hb[:2] and all(x != y for x, y in zip(ha[2:], hb[2:]))  # the chain carries the change on
    # the same block of tokens after a different parent hashes differently
    assert block_hashes(list(range(16, 32)), 16)[0] != ha[1]
    assert block_hashes(a[:50], 16) == ha[:3]


def test_block_hashes_are_the_same_in_another_process() -> None:
    code = "from sim.replica.latency.prefix import block_hashes; print(block_hashes(list(range(64)), 16))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(block_hashes(list(range(64)), 16))  # no per-process hash seed


def test_lru_eviction_never_takes_a_block_a_running_request_holds() -> None:
    pool = KVBlockPool(num_blocks=10, block_size=4)
    a = block_hashes(list(range(16)), 4)  # 4 blocks
    b = block_hashes(list(range(100, 116)), 4)
    pool.admit(1, a, 17, 17 + 3)  # 5 blocks: 4 prompt blocks + 1 for the last prompt token and output
    pool.computed(1, a, 17)
    pool.admit(2, b, 17, 20)
    pool.computed(2, b, 17)
    assert pool.held_blocks == 10
    c = block_hashes(list(range(200, 216)), 4)
    assert not pool.can_admit(c, 17, 20)  # every block is held: nothing may be evicted
    pool.release(1)  # request 1's 4 cached blocks become free, its private one empty
    assert pool.cached_blocks == 8 and pool.evictions == 0
    pool.admit(3, c, 17, 20)  # needs 5 blocks: 1 empty + 4 evicted, all of request 1's
    assert pool.evictions == 4
    assert pool.lookup(b, 17) == 4  # request 2 still runs: its blocks were never candidates
    assert pool.lookup(a, 17) == 0


def test_eviction_takes_the_least_recent_and_a_prompt_tail_first() -> None:
    pool = KVBlockPool(num_blocks=10, block_size=4)
    a = block_hashes(list(range(16)), 4)
    pool.admit(1, a, 17, 17)
    pool.computed(1, a, 17)
    pool.release(1)  # 4 free cached blocks, released tail first
    other = block_hashes(list(range(500, 532)), 4)
    pool.admit(2, other, 33, 36)  # 9 blocks: 6 empty + the 3 oldest free ones evicted
    assert pool.evictions == 3
    assert pool.lookup(a, 17) == 1  # the head block of a survives, its tail went first


def test_prefill_is_charged_only_for_uncached_tokens() -> None:
    tokens = chat_token_ids([("system", "s" * 2000), ("user", "question?")])
    prompt = len(tokens)
    hashes = block_hashes(tokens, 16)
    model = BatchModel(PREFILL, prefix_caching=True, block_size=16)
    model.submit(0, prompt, 1, hashes)
    first = model.step()
    assert first.prompt_tokens == prompt and first.cached_tokens == 0 and first.finished == [0]
    model.submit(1, prompt, 1, hashes)
    second = model.step()
    cached = (prompt - 1) // 16 * 16  # full blocks, at least the last prompt token recomputed
    assert second.cached_tokens == cached and second.prompt_tokens == prompt - cached
    assert abs((first.duration_s - second.duration_s) - cached * PREFILL.prefill_s_per_token) < 1e-9
    assert second.queried_tokens == prompt


def test_without_prefix_caching_nothing_is_reused() -> None:
    tokens = list(range(600))
    model = BatchModel(PREFILL)  # the pure model's default: off, token-granular pool
    for i in range(2):
        model.submit(i, 600, 1, block_hashes(tokens, 16))
        out = model.step()
        assert out.prompt_tokens == 600 and out.cached_tokens == 0 and out.queried_tokens == 0


def test_a_shared_block_counts_once_in_kv_usage() -> None:
    tokens = list(range(320))
    model = BatchModel(replace(PREFILL, max_num_batched_tokens=320), prefix_caching=True, block_size=16)
    model.submit(0, 320, 50, block_hashes(tokens, 16))
    model.step()  # request 0 prefilled; its 20 blocks cached while it decodes
    alone = model.kv_tokens_in_use
    model.submit(1, 320, 50, block_hashes(tokens, 16))
    model.step()
    # request 1 holds request 0's first 19 blocks (304 tokens) and computes 16 tokens itself
    assert model.kv_tokens_in_use == alone + 1 + (320 - 304) + 1


async def test_replica_exports_prefix_cache_counters_in_tokens(serve_replica) -> None:
    url = await serve_replica(profile=replace(PREFILL, decode_base_s=0.001))
    messages = [{"role": "system", "content": "policy " * 300}, {"role": "user", "content": "hi"}]
    prompt = estimate_chat_tokens(m["content"] for m in messages)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for _ in range(2):
            r = await client.post(
                "/v1/chat/completions", json={"model": "sim-llama-8b", "messages": messages, "max_tokens": 2}
            )
            assert r.status_code == 200
        metrics = (await client.get("/metrics")).text
    values = {s.name: s for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert values["vllm:prefix_cache_queries_total"].value == 2 * prompt
    assert values["vllm:prefix_cache_hits_total"].value == (prompt - 1) // 16 * 16
    assert values["vllm:prompt_tokens_total"].value == 2 * prompt  # the whole prompts, as before
    info = values["vllm:cache_config_info"].labels
    assert info["block_size"] == "16" and int(info["num_gpu_blocks"]) == PREFILL.kv_capacity_tokens // 16


def test_equal_hash_ids_give_equal_prompt_prefixes() -> None:
    a = prompt_from_blocks([0, 1, 2, 3], 4 * 512)
    b = prompt_from_blocks([0, 1, 7], 3 * 512)
    assert a[: 2 * BLOCK_CHARS] == b[: 2 * BLOCK_CHARS]  # blocks 0 and 1 shared
    assert (
        a[2 * BLOCK_CHARS : 2 * BLOCK_CHARS + 64] != b[2 * BLOCK_CHARS : 2 * BLOCK_CHARS + 64]
    )  # different ids differ
    assert len(prompt_from_blocks([0, 1], 700)) == 700 * 4  # trimmed to the input length
    rows = [
        TraceRequest(0.0, 1500, 5, (10, 11, 12)),
        TraceRequest(1.0, 1200, 7, (10, 11, 13)),
        TraceRequest(2.0, 900, 3, (20, 21)),
    ]
    plan = plan_requests(rows, None, ReplayConfig(target="http://x", shared_prefixes=True))  # type: ignore[arg-type]
    texts = [p.body["messages"][0]["content"] for p in plan]
    assert texts[0][: 2 * BLOCK_CHARS] == texts[1][: 2 * BLOCK_CHARS] and texts[0][:64] != texts[2][:64]
    assert [len(t) for t in texts] == [1500 * 4, 1200 * 4, 900 * 4] and [p.max_tokens for p in plan] == [5, 7, 3]
    # the replica's token blocks follow: the first two 512-token blocks' worth of blocks are shared
    ta = block_hashes(chat_token_ids([("user", texts[0])]), 16)
    tb = block_hashes(chat_token_ids([("user", texts[1])]), 16)
    shared = next(i for i, (x, y) in enumerate(zip(ta, tb)) if x != y)
    assert shared == (3 + 2 * 512) // 16


def test_padded_prompts_of_different_questions_share_no_prefix_blocks() -> None:
    # With prefix caching on, a padding text common to every request would make every padded
    # prompt's prefill a cache hit; padding belongs to its source question instead.
    from sim.client.questions import MixConfig, QuestionMix, load_pairs
    from sim.client.sample import QUESTIONS_FILE, TRACE_FILE
    from sim.client.traces import read_trace

    cfg = ReplayConfig(target="http://x", pad_context=True, max_context_tokens=1000)
    plan = plan_requests(read_trace(TRACE_FILE)[:200], QuestionMix(load_pairs(QUESTIONS_FILE), MixConfig(seed=1)), cfg)
    firsts: dict[str, str] = {}
    for p in plan:
        if p.kind == "new" and len(p.body["messages"]) == 2:
            firsts.setdefault(p.body["messages"][1]["content"], p.body["messages"][0]["content"])
    pads = list(firsts.values())
    assert len(pads) > 20
    heads = {pad[:64] for pad in pads}  # one 16-token block of 4-character tokens
    assert len(heads) == len(pads)
