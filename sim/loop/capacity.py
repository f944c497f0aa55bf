"""Requests/s one simulated replica serves within the SLO, measured on the latency model (pure).

The capacity the autoscalers plan with (forecaster ``CAPACITY_PER_REPLICA``, the HPA's target)
and that sizes the fixed policies: the highest Poisson arrival rate on a grid at which
``sim.replica.latency.batch.simulate`` (virtual time, no CPU contention) keeps at least ``attainment`` (99.5 %)
of the requests within both SLOs (TTFT and per-request ITL) over ``span_s`` of the segment's
own token pairs (prompts padded to the trace's context, capped at ``max_context_tokens``).
"""

from __future__ import annotations

import numpy as np

from sim.client.traffic import TokenSampler
from sim.replica.latency.batch import Profile, simulate

RATE_GRID = tuple(round(0.1 * 1.25**i, 3) for i in range(30))  # 0.1 .. ~64 requests/s


def replica_capacity(
    profile: Profile,
    tokens: TokenSampler,
    ttft_slo_s: float,
    itl_slo_s: float,
    pad_context: bool,
    max_context_tokens: int = 4000,
    attainment: float = 0.995,
    span_s: float = 900.0,
    seed: int = 0,
) -> float:
    """Requests/s (simulated) one replica of ``profile`` carries within the SLO (see module
    doc); the grid's smallest rate when even that fails. Prompts are the trace's context
    tokens when ``pad_context`` (capped), else ~20 tokens."""
    best = RATE_GRID[0]
    for rate in RATE_GRID:
        rng = np.random.default_rng(seed)
        n = max(1000, int(rate * span_s))  # enough requests to resolve 99.5 %
        times = np.cumsum(rng.exponential(1.0 / rate, n))
        pairs = tokens.draw(n, rng)
        arrivals = []
        for t, (ctx, gen) in zip(times, pairs):
            gen = int(min(gen, profile.max_model_len // 2))
            prompt = int(min(ctx, max_context_tokens, profile.max_model_len - gen)) if pad_context else 20
            arrivals.append((float(t), max(1, prompt), max(1, gen)))
        results = simulate(profile, arrivals)
        good = 0
        for i, (_, _, gen) in enumerate(arrivals):
            r = results[i]
            itl = (r.e2e_s - r.ttft_s) / (gen - 1) if gen > 1 else 0.0
            good += r.ttft_s <= ttft_slo_s and itl <= itl_slo_s
        if good >= attainment * n:
            best = rate
        else:
            break
    return best
