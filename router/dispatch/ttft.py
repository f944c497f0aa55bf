"""Predicted time to first token: the ``predicted_ttft`` policy's score (pure, no I/O).

For each candidate replica, the seconds until this request's first token if it went there::

    ahead    = pending prefill the router sent there (``ReplicaView.prefill_tokens``)
               + requests others sent that wait there x ``unknown_prompt_tokens``
    own      = this prompt's tokens the replica probably does not hold in its prefix cache
    budget   = max(1, chunk_tokens - running)           # tokens of prefill per engine step
    ttft     = (ahead + own) x prefill_s_per_token + ceil((ahead + own) / budget) x step_s

This is vLLM's chunked-prefill scheduler seen from outside: every engine step carries one
token of each running sequence (decode first) and fills the rest of its
``max_num_batched_tokens`` with prefill, first come first served, so a request's first token
comes after the prefill queued ahead of it and its own uncached part, spread over steps that
each cost a decode step of the running batch. ``step_s`` is that decode step (the replica's
inter-token latency), so a large running batch slows a prefill twice: fewer prefill tokens per
step, and slower steps.

Each replica's two speeds are learned online (:func:`observe_ttft`, :func:`observe_itl`) from
its own answers, so a pool mixing an A100 (0.1 ms per prefill token, ~10 ms steps in the sim's
profiles) and a T4 (0.6 ms, ~25 ms) is scored by what each does, not by a pool-wide constant:

- ``step_s`` from inter-token latencies, (last token - first token) / (output tokens - 1);
- ``prefill_s_per_token`` from times to first token: (TTFT - steps x step_s) / (ahead + own),
  with ``ahead + own`` the tokens the router predicted at dispatch; requests with fewer than
  ``min_work_tokens`` of prefill say little about prefill speed (their TTFT is one step) and
  are not used for it.

Each is an exponentially weighted mean, blended with the prior until ``min_samples`` samples
(``trust = samples / min_samples``): a new replica is scored with the priors, which are the
same for every replica, so before any data the policy ranks replicas by queued work alone.
The priors are an A100 serving an 8B model (sim/replica/latency/profiles.py); a slower replica
looks fast until its first answers, gets a few requests and is then measured.

A replica learns only from its own answers, so one that looks slow gets no traffic and nothing
would ever correct it: two or three streams with a long ITL during a warm-up hiccup shut a
replica out for good (0 of 192 requests once healthy again). So the learned values carry the
time of their last sample (``TtftSpeed.at``) and their trust halves every ``half_life_s``
without a new one (60 s, twice router/dispatch/speed.py's ``HALF_LIFE_S``, which decays the
``gpu_load`` speeds for the same reason: with 30 s, bench/prefix_dispatch.py's mixed_chat TTFT
p99 went from 193 / 254 ms to 210 / 323 ms, 1 / 4 workers, as the T4s' estimates faded between
their requests; with 60 s it stayed at 193 / 255)::

    trust = min(1, samples / min_samples) x 0.5 ** (age_s / half_life_s)

A replica left idle drifts back to the priors (from the 50x clamp to within 2x in about six
half-lives, sooner when the others are busy), is tried again and measured afresh: a sample on an
old estimate counts for as much as the estimate's lost trust (``alpha`` grows with age, as in
speed.py; not for an ITL above the estimate, which stays a low quantile). A replica that is
really slow keeps getting answers, and so keeps its estimate. Dispatch ages the estimates only
of replicas with none of its requests open (router/dispatch/choice.py), as speed.py re-tests
only those: one with requests open is being measured.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from router.dispatch.speed import HALF_LIFE_S


@dataclass(frozen=True, slots=True)
class HomeSlack:
    """How much slower than the fastest candidate (predicted TTFT) a conversation's rendezvous
    owner may be and still be chosen: ``ratio`` x the fastest + ``seconds``."""

    ratio: float = 1.25
    seconds: float = 0.02


@dataclass(frozen=True, slots=True)
class TtftConfig:
    """Priors and learning rates of the predicted TTFT.

    prefill_s_per_token: prior seconds per prompt token prefilled; step_s: prior seconds per
    engine step (inter-token latency); chunk_tokens: tokens per step (vLLM's
    ``max_num_batched_tokens``; 2048, its default for online serving on most GPUs);
    unknown_prompt_tokens: prompt tokens assumed for a request waiting on a replica that
    another router worker sent (its size unknown here); alpha: weight of a new sample (0..1);
    min_samples: samples for full trust in the learned value; min_work_tokens: least
    predicted prefill (tokens) of a request whose TTFT teaches the prefill speed;
    max_ratio: a learned value is kept within [prior / max_ratio, prior x max_ratio], so one
    absurd sample (a stall, a clock jump) cannot make a replica look free or dead;
    home_slack: how far a conversation's rendezvous owner may trail the fastest and still win;
    first_turn_slack: the same for a first turn (nothing carried), which may have no second
    (Mooncake's and Azure's single prompts: with the loose slack a random owner took them
    3-6 % above gpu_load's TTFT p99); herd_slack: with several ``workers``, each picks at
    random among the candidates this close to the fastest (they all read the same scrape and
    would all pick the same replica: with 4 workers Mooncake's TTFT p99 9.2 s, 8.4 s so);
    bound_slack: open requests above the mean a replica may have and still be credited its
    prefix cache (the load bound's floor, router/dispatch/choice.py ``ttft_load_bound``);
    outlier_ratio: a TTFT sample more than this many times slower per token than the current
    estimate is dropped: on Mooncake's long prompts, requests waiting for KV cache space made
    idle-looking A100s look 15x slower and the predictions absurd (bench/prefix_dispatch.py);
    outlier_run: ...unless it is the ``outlier_run``-th such sample in a row (no normal one in
    between): a wait for KV space is a sample here and there, a replica that became slower
    (a throttled GPU, a noisy neighbour) is slow on every sample, and dropping them all meant a
    replica 10x slower than its estimate was never avoided;
    half_life_s: seconds without a sample that halve the trust in the learned values (module
    docstring), so a replica that looked slow once is tried again;
    step_alpha_up: weight of an ITL sample above the estimate (:func:`observe_itl`);
    workers: router worker processes dispatching to the same replicas, each seeing only its own
    requests (``router serve --workers``).
    """

    prefill_s_per_token: float = 0.0001
    step_s: float = 0.010
    chunk_tokens: int = 2048
    unknown_prompt_tokens: int = 1000
    alpha: float = 0.2
    min_samples: int = 3
    min_work_tokens: int = 256
    max_ratio: float = 50.0
    home_slack: HomeSlack = field(default_factory=lambda: HomeSlack())
    first_turn_slack: HomeSlack = field(default_factory=lambda: HomeSlack(1.05, 0.005))
    herd_slack: HomeSlack = field(default_factory=lambda: HomeSlack(1.3, 0.02))
    bound_slack: float = 8.0
    outlier_ratio: float = 4.0
    outlier_run: int = 3
    half_life_s: float = 2 * HALF_LIFE_S  # 60 s: at 30 s mixed_chat TTFT p99 +9 % / +27 % (module doc)
    workers: int = 1
    step_alpha_up: float = 0.02


@dataclass(frozen=True, slots=True)
class TtftSpeed:
    """One replica's learned speeds: ``prefill_s`` (seconds per prefilled prompt token) over
    ``prefill_samples`` samples and ``step_s`` (seconds per engine step) over ``step_samples``;
    a value with 0 samples is unused (the prior stands). ``at``: the time of the last sample
    learned (seconds, the caller's clock; the learner's ``now``), from which trust decays;
    ``outliers``: TTFT outliers in a row dropped so far (``TtftConfig.outlier_run``)."""

    prefill_s: float = 0.0
    prefill_samples: int = 0
    step_s: float = 0.0
    step_samples: int = 0
    at: float = 0.0
    outliers: int = 0


def _recency(speed: TtftSpeed, now: float | None, config: TtftConfig) -> float:
    # the share of trust an estimate keeps at `now`: 0.5 per half-life since its last sample;
    # no clock (None) or a clock behind `at` (another clock's `now`): full trust
    if now is None or now <= speed.at:
        return 1.0
    weight: float = 0.5 ** ((now - speed.at) / config.half_life_s)  # a positive base: a real power
    return weight


def _blend(prior: float, learned: float, samples: int, config: TtftConfig, recency: float = 1.0) -> float:
    if samples <= 0:
        return prior
    trust = min(1.0, samples / config.min_samples) * recency
    return prior + trust * (learned - prior)


def speeds(speed: TtftSpeed | None, config: TtftConfig = TtftConfig(), now: float | None = None) -> tuple[float, float]:
    """(seconds per prefill token, seconds per step) that dispatch uses for a replica at ``now``
    (the clock of ``speed.at``; None: no decay): the learned values blended with the priors by
    trust, which halves every ``half_life_s`` since the last sample (module docstring). The learned prefill
    speed can only make a replica slower than the prior: a TTFT sample is a lower bound of the
    prefill cost, since a prompt the router took as cold may be cached there (another router
    worker sent it), and learning from such samples as they come made two idle A100s look 3x
    faster than the others and take 70 % of the traffic (bench/prefix_dispatch.py, 4 workers).
    So a GPU faster than the prior's is scored as fast as the prior, never as faster. Its floor
    is the prior scaled by the learned step over the step prior (when above 1): a GPU that
    decodes 3x slower is taken to prefill at least 3x slower (a T4 against an A100: 2.8x and
    6x), before and besides any clean TTFT sample."""
    if speed is None:
        return config.prefill_s_per_token, config.step_s
    recency = _recency(speed, now, config)
    step_s = _blend(config.step_s, speed.step_s, speed.step_samples, config, recency)
    floor = config.prefill_s_per_token * max(1.0, step_s / config.step_s)
    return max(floor, _blend(floor, speed.prefill_s, speed.prefill_samples, config, recency)), step_s


def steps(tokens: float, running: float, config: TtftConfig = TtftConfig()) -> int:
    """Engine steps to prefill ``tokens`` with ``running`` sequences decoding alongside (each
    takes one token of the step's budget); at least 1, the step that emits the first token."""
    budget = max(1.0, config.chunk_tokens - max(0.0, running))
    return max(1, math.ceil(max(0.0, tokens) / budget))


def predict(
    ahead_tokens: float,
    own_tokens: float,
    running: float,
    speed: TtftSpeed | None,
    config: TtftConfig = TtftConfig(),
    now: float | None = None,
) -> float:
    """Predicted seconds to this request's first token on one replica: ``ahead_tokens`` of
    prefill queued before it, ``own_tokens`` of its prompt to prefill there, ``running``
    sequences decoding there, the replica's learned ``speed`` (None: priors) as trusted at
    ``now`` (:func:`speeds`)."""
    prefill_s, step_s = speeds(speed, config, now)
    work = max(0.0, ahead_tokens) + max(0.0, own_tokens)
    return work * prefill_s + steps(work, running, config) * step_s


def _clamp(value: float, prior: float, config: TtftConfig) -> float:
    return min(prior * config.max_ratio, max(prior / config.max_ratio, value))


def _ewma(prev: float, samples: int, value: float, config: TtftConfig, recency: float = 1.0) -> float:
    if samples <= 0:
        return value
    alpha = max(config.alpha, 1.0 / (samples + 1))  # a plain mean until the EWMA has enough
    alpha = 1.0 - (1.0 - alpha) * recency  # an old estimate counts for the trust it has left
    return prev + alpha * (value - prev)


def observe_ttft(
    prev: TtftSpeed | None,
    ttft_s: float,
    work_tokens: float,
    running: float,
    config: TtftConfig = TtftConfig(),
    ahead_tokens: float = 0.0,
    cached_tokens: float = 0.0,
    now: float | None = None,
) -> TtftSpeed:
    """``prev`` with one time to first token learned: ``ttft_s`` seconds from sending the
    request to its first token, ``work_tokens`` its own prefill predicted at dispatch,
    ``running`` the decoding sequences then, ``ahead_tokens`` the prefill the router counted
    ahead of it, ``cached_tokens`` the part of its prompt it took to be cached there.
    Unchanged when the sample says little about prefill speed: under ``min_work_tokens``, not
    a finite positive time, an outlier (``outlier_ratio``), with prefill queued ahead or a
    prefix taken as cached. Those last
    two rest on guesses (the router counts its own requests only; a prefix it sent there a
    moment ago is not cached until computed): learning from them made idle A100s look 1.4x
    and 5x slower in bench/prefix_dispatch.py, and a replica that looks slow gets no traffic
    to correct it. A sample of a cold prompt on an idle replica is clean; until there is one,
    the prefill speed follows the step speed (:func:`speeds`). An outlier is learned after all
    when it is the ``outlier_run``-th in a row (a replica that became slower). ``now``: the
    time of the sample (seconds, the clock of dispatch's ``Context.now``; None: no decay)."""
    prev = prev or TtftSpeed()
    clean = ahead_tokens <= 0.0 and cached_tokens <= 0.0 and work_tokens >= config.min_work_tokens
    if not clean or not (ttft_s > 0.0 and math.isfinite(ttft_s)):
        return prev
    prefill_s, step_s = speeds(prev, config, now)
    per_token = max(0.0, ttft_s - steps(work_tokens, running, config) * step_s) / work_tokens
    if per_token > config.outlier_ratio * prefill_s and prev.outliers + 1 < config.outlier_run:
        # a wait the model does not know (KV cache full, a stall): not prefill speed, unless
        # it goes on (the run reaches outlier_run)
        return replace(prev, outliers=prev.outliers + 1)
    value = _clamp(per_token, config.prefill_s_per_token, config)
    recency = _recency(prev, now, config)
    learned = _ewma(prev.prefill_s, prev.prefill_samples, value, config, recency)
    at = prev.at if now is None else now
    return TtftSpeed(learned, prev.prefill_samples + 1, prev.step_s, prev.step_samples, at, 0)


def observe_itl(
    prev: TtftSpeed | None, itl_s: float, config: TtftConfig = TtftConfig(), now: float | None = None
) -> TtftSpeed:
    """``prev`` with one inter-token latency learned (seconds per output token after the first,
    i.e. per engine step); unchanged for a value that is not finite and positive. The estimate
    follows lower samples at ``alpha`` and higher ones at ``step_alpha_up`` only (a low
    quantile, not the mean): an answer's ITL includes the other requests' prefill chunks run
    in its steps, which the prediction counts already as prefill ahead; on Mooncake's long
    prompts the mean ITL was 15x a decode step and every prediction 10x too long. ``now``: the
    time of the sample (as for :func:`observe_ttft`); an old estimate gives way faster."""
    prev = prev or TtftSpeed()
    if not (itl_s > 0.0 and math.isfinite(itl_s)):
        return prev
    value = _clamp(itl_s, config.step_s, config)
    recency = _recency(prev, now, config)
    if prev.step_samples >= config.min_samples and value > prev.step_s:
        learned = prev.step_s + config.step_alpha_up * (value - prev.step_s)
    else:
        learned = _ewma(prev.step_s, prev.step_samples, value, config, recency)
    at = prev.at if now is None else now
    return TtftSpeed(prev.prefill_s, prev.prefill_samples, learned, prev.step_samples + 1, at, prev.outliers)


def itl_sample(first_token_s: float, last_token_s: float, completion_tokens: int) -> float | None:
    """Seconds per output token after the first, from the first and last token times (same
    clock) and the answer's output tokens; None when there is no second token."""
    if completion_tokens < 2 or last_token_s <= first_token_s:
        return None
    return (last_token_s - first_token_s) / (completion_tokens - 1)


def rendezvous(key: str, candidates: Sequence[str]) -> str | None:
    """The candidate that ``key`` belongs to by rendezvous (highest random weight) hashing:
    every router worker computes the same owner from the same candidates without talking to
    the others, and removing one candidate moves only the keys it owned (Thaler and Ravishankar,
    "Using name-based mappings to increase hit rates", IEEE/ACM ToN 1998). None when empty."""
    best: tuple[int, str] | None = None
    for cand in candidates:
        digest = hashlib.blake2b(f"{key}\x1f{cand}".encode(), digest_size=8).digest()
        weight = (int.from_bytes(digest, "big"), cand)
        if best is None or weight > best:
            best = weight
    return None if best is None else best[1]
