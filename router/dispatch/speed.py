"""How fast each replica is, learned from the router's own observations (pure, no config).

A pool may mix GPUs (an A100 decodes about 3x faster than a T4); load signals say how busy a
replica is, not how fast it works off its queue, so ``gpu_load`` alone sends a slow replica as
many requests as a fast one at equal load. Each finished request (non-stream or stream, a good
answer with ``usage.completion_tokens`` > 0) gives one sample

    s_per_token = (end - sent) / (completion_tokens + PROMPT_WEIGHT * prompt_tokens)

seconds per token of work, end to end: it includes the replica's queueing and prefill, so it
is what a client of that replica sees. A prompt token counts as ``PROMPT_WEIGHT`` (0.1) of an
output token so that a replica that happens to get the long prompts (say the only one whose
``max_model_len`` fits them) does not look slow for it: per output token alone, a 30,000-token
prompt with a 10-token answer looks 100x slower than it is. 0.1 was chosen on
bench/dispatch_quality.py (2 A100 + 2 T4 sim replicas): 0.01 .. 0.3 all improve ``gpu_load`` on
the Azure conversation trace; on Mooncake's long prompts 0 (output tokens only) made the TTFT
p99 worse in 2 of 4 windows and 0.1 better in all 4 (router/README.md).
Samples are folded into an exponentially weighted moving average per
replica (:func:`observe`). Dispatch turns the estimates of the candidates into a *slowness*
factor (:func:`slowness`): a replica's estimate over the best one among them, trusted by its
number of samples (full from ``min_samples``) and by its age (half of its weight every
``half_life_s`` without a new sample), less a dead band, clipped to ``max_factor``:

    slowness = 1 + trust * (clip(estimate / best - dead_band, 1, max_factor) - 1)
    trust    = min(1, samples / min_samples) * 0.5 ** (age_s / half_life_s)

The dead band (0.25) keeps replicas of the same GPU, whose estimates differ by noise and by the
requests they happened to get, equal, so ties still rotate among them; GPU generations differ
by 2x or more (T4 vs A100 about 3x, A100 vs H100 about 2x).

A replica without samples (new, or none of its answers had usage) has slowness 1, i.e. it is
taken to be as fast as the best: it gets traffic and so gets measured, and its load-aware score
still rises with every request sent to it, so it is not flooded either.

Learned state gives way to fresh evidence, so a replica that only *looked* slow (a stall: the
requests it held finish with the stall in their duration) is trusted again within seconds:

- an estimate older than ``retest_s`` (5 s) of a replica with nothing in flight counts as
  unknown (:func:`current`): the replica gets a request (a *re-test*) and is measured again;
- a re-test starts a *probe*: the replica is measured afresh on ``min_samples`` requests and
  the median of their samples replaces the estimate (``observe(..., retest=True)``), instead
  of each moving it by ``alpha``: they are the only measurements taken after whatever made the
  replica look slow. While the probe runs, the replica with nothing in flight still counts as
  unknown, so its next request follows at once (one at a time: with one in flight, the
  interim median applies). The median, not the first sample alone nor a mean, because a
  probe request can itself be slow (a pause on a busy node): in CI one slow re-test sample
  replaced the estimate with full trust and shut a recovered replica out for another
  ``retest_s`` (tests/router/test_recovery_live.py); a mean keeps such an outlier for many
  samples, a median of 5 ignores up to 2.

A genuinely slower GPU keeps its factor: under load it has requests in flight (no re-test),
and after an idle spell the probe measures it slow again (``min_samples`` requests sent to it
while it is idle). On
bench/dispatch_quality.py's traces no replica is ever idle with a stale estimate, and its
numbers are unchanged. Besides, an estimate that is not refreshed loses trust with age
(``half_life_s``). Replacing every sample that follows a 5 s silence instead was tried and
dropped: requests there last longer than 5 s, so single noisy samples replaced good
estimates (gpu_load's TTFT p99 up to 34 % worse on Mooncake windows, 30 % on Azure).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

HALF_LIFE_S = 30.0  # seconds without a sample that halve a learned speed's trust (also ttft.py)


@dataclass(frozen=True, slots=True)
class SpeedConfig:
    """alpha: EWMA weight of a new sample (0..1); min_samples: samples for full trust;
    half_life_s: seconds without a sample that halve the trust; dead_band: ratio to the best
    that counts as equal speed; max_factor: largest slowness; retest_s: seconds after which an
    estimate is stale (re-tested when idle, replaced by the next sample)."""

    alpha: float = 0.2
    min_samples: int = 5
    half_life_s: float = HALF_LIFE_S
    dead_band: float = 0.25
    max_factor: float = 8.0
    retest_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Speed:
    """One replica's estimate: ``s_per_token`` (EWMA, seconds per token of work), ``samples``
    folded in, ``at`` (the time of the last sample, in the caller's clock, seconds), and
    ``probe``: the samples of a re-test probe under way (empty when none; module doc)."""

    s_per_token: float
    samples: int
    at: float
    probe: tuple[float, ...] = ()


PROMPT_WEIGHT = 0.1  # a prompt token's share of an output token's work (see module docstring)


def sample(duration_s: float, completion_tokens: int, prompt_tokens: int = 0) -> float | None:
    """Seconds per token of work of one request, ``duration_s`` from sending it to its last
    byte (None when it produced no output tokens, i.e. usage unknown, or the duration is not a
    finite positive number)."""
    if completion_tokens <= 0 or not (duration_s > 0.0 and math.isfinite(duration_s)):
        return None
    return duration_s / (completion_tokens + PROMPT_WEIGHT * max(0, prompt_tokens))


def observe(
    prev: Speed | None, s_per_token: float, now: float, config: SpeedConfig = SpeedConfig(), *, retest: bool = False
) -> Speed:
    """``prev`` with one more sample taken at ``now``. The first sample is the estimate; later
    ones move it by ``alpha`` (the older the estimate, the less it counts). The sample of a
    re-test (a request sent because :func:`current` found the estimate unknown) starts a probe,
    and every sample until the probe has ``min_samples`` joins it: the estimate is then the
    probe's median (module doc)."""
    if prev is None:
        return Speed(s_per_token, 1, now)
    if retest or prev.probe:
        probe = (*prev.probe, s_per_token)
        done = len(probe) >= config.min_samples
        return Speed(statistics.median(probe), prev.samples + 1, now, () if done else probe)
    alpha = config.alpha
    if prev.samples < config.min_samples:
        alpha = max(alpha, 1.0 / (prev.samples + 1))  # a plain mean until the EWMA has enough
    alpha = 1.0 - (1.0 - alpha) * _recency(now - prev.at, config)
    return Speed(prev.s_per_token + alpha * (s_per_token - prev.s_per_token), prev.samples + 1, now)


def current(speed: Speed | None, inflight: int, now: float, config: SpeedConfig = SpeedConfig()) -> Speed | None:
    """The estimate dispatch goes by: ``speed``, or None (unknown, so the replica is tried and
    measured again) when the replica has no request in flight (``inflight``, the router's own
    count) and the estimate is older than ``retest_s`` or a probe is under way. ``now`` in the
    clock of ``speed.at``."""
    if speed is not None and inflight == 0 and (speed.probe or now - speed.at >= config.retest_s):
        return None
    return speed


def slowness(speeds: Sequence[Speed | None], now: float, config: SpeedConfig = SpeedConfig()) -> list[float] | None:
    """The slowness factor (>= 1; 1 = as fast as the best) of each of ``speeds`` relative to the
    best estimate among them, at ``now``; None (no opinion: all 1) when fewer than two are known.
    Runs on every dispatch decision, hence the plain loops."""
    known = 0
    for speed in speeds:
        if speed is not None:
            known += 1
    if known < 2:
        return None
    decay = _LN2 / config.half_life_s
    trusts: list[float] = []
    best = math.inf
    for speed in speeds:
        if speed is None:
            trusts.append(0.0)
            continue
        trusts.append(_trust(speed, now, config, decay))
        if speed.s_per_token < best:
            best = speed.s_per_token
    if not best > 0.0:
        return None
    floor, cap = 1.0 + config.dead_band, config.max_factor + config.dead_band
    factors: list[float] = []
    for speed, trust in zip(speeds, trusts):  # noqa: B905 (same length by construction)
        ratio = 0.0 if speed is None else speed.s_per_token / best
        if ratio <= floor:
            factors.append(1.0)
        else:
            factors.append(1.0 + trust * (min(ratio, cap) - config.dead_band - 1.0))
    return factors


def _trust(speed: Speed, now: float, config: SpeedConfig, decay: float) -> float:
    count = 1.0 if speed.samples >= config.min_samples else speed.samples / config.min_samples
    age = now - speed.at
    return count * math.exp(-decay * age) if age > 0.0 else count


def _recency(age_s: float, config: SpeedConfig) -> float:
    weight: float = 0.5 ** (max(0.0, age_s) / config.half_life_s)  # a positive base: a real power
    return weight


_LN2 = math.log(2.0)
