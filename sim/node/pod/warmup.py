"""Warm-up (cold start) of a Pod's replica: a fixed number of seconds or a named distribution.

The named distributions are log-normal around a *published* vLLM cold start, sampled once per
Pod with a generator seeded by the Pod's name (so the same Pod names give the same warm-ups):

- ``vllm-8b-cold``: median 294 s. Tensorfuse, "Reducing GPU Cold Start Time when using vLLM"
  (S. Rawat, 2025-09-01, https://tensorfuse.io/docs/blogs/reducing_gpu_cold_start):
  meta-llama/Llama-3.1-8B-Instruct on one L40S, a fresh Pod with nothing cached: model download
  61 s + weight loading 33 s + Dynamo bytecode transform 10 s + graph compilation 42 s + CUDA
  graph capture 54 s + engine init and imports 94 s.
- ``vllm-8b-cached``: median 82 s, same source and model, with ``/root/.cache`` on a persistent
  volume (weights, torch.compile and other caches kept): 0 + 18 + 10 + 13 + 7 + 34 s.

What these are: one vendor's measured breakdown of one 8B model on one GPU type, from process
start to the server answering; they do not include image pull, scheduling or the readiness
probe's period (the loop adds those itself). What they are not: a measured spread. The source
reports one run per case, so the log-normal's ``sigma`` (0.2, i.e. about +-20 % for one standard
deviation, p99 about 1.6x the median) is our assumption, and samples are clipped to
``median * exp(+-3 sigma)``.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass


class WarmupError(ValueError):
    """A warm-up that is neither a non-negative number nor a known distribution name."""


@dataclass(frozen=True)
class LogNormalWarmup:
    """Log-normal warm-up in seconds around ``median_s`` with log-space spread ``sigma``."""

    median_s: float
    sigma: float
    source: str

    def sample(self, rng: random.Random) -> float:
        """One warm-up in seconds, within ``median * exp(+-3 sigma)``."""
        z = max(-3.0, min(3.0, rng.gauss(0.0, 1.0)))
        return self.median_s * math.exp(self.sigma * z)


_TENSORFUSE = "Tensorfuse 2025, Llama-3.1-8B-Instruct on L40S (tensorfuse.io/docs/blogs/reducing_gpu_cold_start)"
DISTRIBUTIONS: dict[str, LogNormalWarmup] = {
    "vllm-8b-cold": LogNormalWarmup(294.0, 0.2, _TENSORFUSE + ", nothing cached"),
    "vllm-8b-cached": LogNormalWarmup(82.0, 0.2, _TENSORFUSE + ", /root/.cache persisted"),
}


def warmup_seconds(value: str, pod_name: str) -> float:
    """Warm-up in simulated seconds for the Pod ``pod_name``: ``value`` is a number of seconds
    (>= 0) or a name in DISTRIBUTIONS, sampled with a generator seeded by the Pod's name.
    Raises WarmupError otherwise."""
    text = value.strip()
    dist = DISTRIBUTIONS.get(text)
    if dist is not None:
        seed = int.from_bytes(hashlib.sha256(pod_name.encode()).digest()[:8], "big")
        return dist.sample(random.Random(seed))
    try:
        seconds = float(text)
    except ValueError:
        raise WarmupError(
            f"warm-up {value!r} is neither seconds nor one of {', '.join(sorted(DISTRIBUTIONS))}"
        ) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise WarmupError(f"warm-up {value!r} must be a finite number of seconds >= 0")
    return seconds
