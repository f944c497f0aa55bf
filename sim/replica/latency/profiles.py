"""GPU profiles for the simulated replica: roofline estimates from public datasheet numbers.

The numbers are illustrative estimates, not measurements. Each is derived from the public
figures named below for a Llama-3.1-8B-class model (32 layers, 8 KV heads of dim 128, so the
KV cache takes 2 * 32 * 8 * 128 * 2 bytes = 128 KiB per token in fp16):

- ``a100``: NVIDIA A100 80GB SXM datasheet: 2,039 GB/s HBM2e, 312 TFLOPS dense bf16.
  Decode is memory-bound: reading 16 GB of bf16 weights takes ~8 ms per step; reading the KV
  cache costs 128 KiB / 2,039 GB/s ~ 64 ns per cached token. Prefill is compute-bound:
  2 * 8e9 FLOPs per token at ~50% of peak ~ 0.1 ms per token. KV cache: 80 GB * 0.9
  (vLLM's default gpu_memory_utilization) - 16 GB weights - ~4 GB activations ~ 52 GB
  ~ 400k tokens.
- ``t4``: NVIDIA T4 datasheet: 16 GB GDDR6 at 320 GB/s, 65 TFLOPS fp16 tensor. An 8B model
  only fits 4-bit quantised (AWQ, ~5.7 GB): ~18 ms to read the weights, ~25 ms per step
  with overheads; 410 ns per cached KV token; prefill ~0.6 ms per token at ~40% of peak.
  KV cache: 16 GB * 0.9 - 5.7 GB - ~1.7 GB ~ 7 GB ~ 55k tokens.
- ``l4``: NVIDIA L4 datasheet: 24 GB GDDR6 at 300 GB/s, 121 TFLOPS dense fp16 tensor (242
  with sparsity). The 8B model in bf16 (16 GB): ~53 ms to read the weights, ~58 ms per step
  with overheads; 128 KiB / 300 GB/s ~ 437 ns per cached KV token; prefill ~0.33 ms per token
  at ~40% of dense peak. KV cache: 24 GB * 0.9 - 16 GB - ~1.5 GB ~ 4.1 GB ~ 31k tokens, so
  the KV cache, not ``max_num_seqs``, bounds the batch: a small GPU on which the closed loop
  (``python -m sim loop``) needs several replicas at modest request rates.

``decode_per_seq_s`` (sampling, scheduling and compute per sequence in the batch) is a rough
allowance, not derived from a datasheet.
"""

from __future__ import annotations

from sim.replica.latency.batch import Profile

A100 = Profile(
    name="a100",
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    kv_capacity_tokens=400_000,
    max_model_len=32_768,
    prefill_s_per_token=0.0001,
    decode_base_s=0.009,
    decode_per_seq_s=0.00005,
    kv_read_s_per_token=64e-9,
)

T4 = Profile(
    name="t4",
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    kv_capacity_tokens=55_000,
    max_model_len=8_192,
    prefill_s_per_token=0.0006,
    decode_base_s=0.025,
    decode_per_seq_s=0.0003,
    kv_read_s_per_token=410e-9,
)

L4 = Profile(
    name="l4",
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    kv_capacity_tokens=31_000,
    max_model_len=16_384,
    prefill_s_per_token=0.00033,
    decode_base_s=0.058,
    decode_per_seq_s=0.0001,
    kv_read_s_per_token=437e-9,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (A100, T4, L4)}


def get_profile(name: str) -> Profile:
    """Profile by name ("a100", "t4" or "l4"). Raises KeyError naming the known profiles."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
