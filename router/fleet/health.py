"""Replica health: active probes, passive circuit breaker, latency-outlier ejection.

Pure state machines driven by explicit ``now`` values (seconds, monotonic clock), so they are
tested without I/O or sleeping. Health is judged only on evidence that the replica itself is
unhealthy, never on a deadline a client chose (its priority's time-to-first-byte) nor on a few
unlucky answers:

- Active (``/health`` probes): a replica is *up* after ``rise`` consecutive successes and
  *down* after ``fall`` consecutive failures. It starts down, so a replica that is still
  warming up (vLLM answers 503 or nothing while loading a model) gets no traffic.
- Passive circuit breaker, opened for ``open_s`` by either
  - ``connect_failures`` consecutive requests that could not connect at all, or
  - server errors (5xx answers, answers broken off) at a *rate*: at least ``error_rate`` of
    the answers of the last ``error_window_s`` seconds, counted only once that window holds
    ``error_min_samples`` answers;
  then it is half-open and lets one trial request through at a time: a good answer closes it,
  a server error or connect failure opens it again, a trial without a verdict (timed out,
  client gone, 429/503) lets the next request be the trial.
- Timeouts and 429 and 503 answers are no evidence either way (the caller records nothing);
  a 4xx answer is a good answer (the replica works, the request was bad). But a replica that
  answered 429 or 503 said "not now": it is *refused* for its ``Retry-After`` (capped at
  ``REFUSED_MAX_S``) or ``REFUSED_DEFAULT_S`` without one, and takes no new request until then
  (:meth:`HealthState.on_refused`), unless no replica of the pool admits (the last resort
  below), so a pool of one busy replica still asks it rather than answering 503. A draining replica (SIGTERM, before discovery or the next
  probe says so) answers every new request 503; without the back-off, least-load dispatch sent
  it more of them, since it is the idlest replica of the pool (issue 10's closed loop lost 56
  requests to a scale-down that way).
- Outlier ejection: when the p99 of the last ``window`` TTFTs is above ``outlier_p99_s``
  (default 2 s), the replica is ejected for ``eject_s``. Only requests with a *short* prompt
  give TTFT samples (:func:`judged_ttft`): a long prompt's TTFT is mostly its own prefill,
  which the client chose, so it says nothing about the replica's health.
- Stuck generation (:class:`~router.fleet.progress.Progress`, ``progress``): a replica that has open
  requests and shows no progress on them (no chunk of its streams, its generation counter
  still) for ``stuck_after_s`` (default 15 s) admits nothing new until it progresses again.
- The last resort (``admits(now, last_resort=True)``, used by ``Pool.eligible`` when no replica
  of a pool admits): a replica that is up, not draining and still answers (its circuit was
  opened by server errors, it is ejected, or it is judged stuck) takes requests rather than
  leaving the whole pool with a 503; one that cannot be connected to does not.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from router.fleet.progress import Progress

REFUSED_DEFAULT_S = 2.0  # back-off after a 429/503 without Retry-After (seconds)
REFUSED_MAX_S = 30.0  # a longer Retry-After is cut to this: the /health probes still judge


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Thresholds (counts, seconds, a 0..1 rate) for :class:`HealthState`."""

    rise: int = 1
    fall: int = 2
    connect_failures: int = 3
    error_rate: float = 0.5
    error_window_s: float = 30.0
    error_min_samples: int = 10
    open_s: float = 5.0
    outlier_p99_s: float = 2.0
    window: int = 50
    min_samples: int = 20
    eject_s: float = 10.0
    stuck_after_s: float = 15.0


JUDGED_SIZE = "short"  # the prompt size class (router/forward/classify.py size_class) whose TTFT is judged


def judged_ttft(ttft_s: float | None, size: str) -> float | None:
    """The TTFT sample (seconds) that health may judge a replica on: ``ttft_s`` for a request
    of prompt size class ``short`` (below the first ``size_thresholds`` bound, 512 tokens by
    default: its prefill is a small part of 2 s), else None (no sample)."""
    return ttft_s if size == JUDGED_SIZE else None


CONNECT_FAILURE = "connect_failure"
SERVER_ERROR = "server_error"


class HealthState:
    """Health of one replica; all methods take ``now`` (monotonic seconds)."""

    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.up = False
        self._streak = 0  # >0: consecutive probe successes, <0: consecutive failures
        self._connect_failures = 0  # consecutive
        # answers of the error window in one-second buckets [second, answers, server errors]:
        # at most error_window_s + 1 buckets whatever the request rate
        self._buckets: deque[list[int]] = deque()
        self._answers = 0
        self._errors = 0
        self._open_until: float | None = None
        self._open_reason = ""  # CONNECT_FAILURE | SERVER_ERROR while the circuit is not closed
        self._trial_out = False
        self._ttfts: deque[float] = deque(maxlen=config.window)
        self.ejected_until = 0.0
        self.draining = False  # set by discovery: open requests finish, nothing new is admitted
        self.refused_until = 0.0  # the replica answered 429/503: no new request before this
        self.progress = Progress(config.stuck_after_s)  # open requests -> stuck generation (router/fleet/progress.py)

    def probe(self, ok: bool) -> None:
        """Record one active ``/health`` probe result."""
        self._streak = max(self._streak, 0) + 1 if ok else min(self._streak, 0) - 1
        if ok and self._streak >= self.config.rise:
            self.up = True
        elif not ok and -self._streak >= self.config.fall:
            self.up = False

    def circuit(self, now: float) -> str:
        """``closed`` | ``open`` | ``half_open``."""
        if self._open_until is None:
            return "closed"
        return "open" if now < self._open_until else "half_open"

    def admits(self, now: float, *, last_resort: bool = False) -> bool:
        """True if a request may be sent now (probe up, not draining, circuit not open, not
        ejected, not stuck). ``last_resort``: ignore ejection, a stuck generation and a circuit
        opened by server errors (the replica answers), not one opened by connect failures."""
        if not self.up or self.draining:
            return False
        if last_resort:  # a replica that refused may have room again: better asked than a 503
            return self._open_until is None or self._open_reason != CONNECT_FAILURE or now >= self._open_until
        if now < self.ejected_until or now < self.refused_until or not self.progress.admits(now):
            return False
        if self._open_until is None:
            return True
        return now >= self._open_until and not self._trial_out

    def on_dispatch(self, now: float) -> bool:
        """Call when a request is sent; True when it is the half-open circuit's trial (then
        call :meth:`end_trial` when the request ends, whatever its outcome)."""
        if self._open_until is not None and now >= self._open_until and not self._trial_out:
            self._trial_out = True
            return True
        return False

    def end_trial(self) -> None:
        """The trial request ended; without a verdict the next request is the next trial."""
        self._trial_out = False

    def on_success(self, now: float, ttft_s: float | None = None) -> None:
        """A request got a good answer (``ttft_s``: its time to first byte, if measured)."""
        self._connect_failures = 0
        if self._open_until is not None and now >= self._open_until:
            self._close()
        self._count(now, error=False)
        if ttft_s is not None:
            self._ttfts.append(ttft_s)
            if len(self._ttfts) >= self.config.min_samples and self.p99() > self.config.outlier_p99_s:
                self.ejected_until = now + self.config.eject_s
                self._ttfts.clear()

    def on_refused(self, now: float, retry_after_s: float | None = None) -> None:
        """The replica answered 429 or 503 (busy, warming up or draining): admit nothing new to
        it for ``retry_after_s`` seconds (its ``Retry-After``, at most ``REFUSED_MAX_S``), or
        ``REFUSED_DEFAULT_S`` without one. Not a fault: the circuit is not touched."""
        wait = REFUSED_DEFAULT_S if retry_after_s is None else min(max(retry_after_s, 0.0), REFUSED_MAX_S)
        self.refused_until = max(self.refused_until, now + wait)

    def on_evidence(self, evidence: str | None, now: float) -> None:
        """A request failed: ``evidence`` is ``server_error``, ``connect_failure`` or None
        (no evidence: nothing is recorded)."""
        if evidence == SERVER_ERROR:
            self._connect_failures = 0
            self._count(now, error=True)
            config = self.config
            half_open = self._open_until is not None and now >= self._open_until
            if half_open or (
                self._open_until is None
                and self._answers >= config.error_min_samples
                and self._errors >= config.error_rate * self._answers
            ):
                self._open(now, SERVER_ERROR)
        elif evidence == CONNECT_FAILURE:
            self._connect_failures += 1
            half_open = self._open_until is not None and now >= self._open_until
            if half_open or self._connect_failures >= self.config.connect_failures:
                self._open(now, CONNECT_FAILURE)

    def error_ratio(self, now: float) -> float:
        """Server errors over answers in the last ``error_window_s`` (0 when none)."""
        self._expire(now)
        return self._errors / self._answers if self._answers else 0.0

    def p99(self) -> float:
        """p99 of the recent TTFT window in seconds (0 when empty)."""
        if not self._ttfts:
            return 0.0
        ordered = sorted(self._ttfts)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def _open(self, now: float, reason: str) -> None:
        self._open_until = now + self.config.open_s
        self._open_reason = reason
        self._trial_out = False

    def _close(self) -> None:
        self._open_until = None
        self._open_reason = ""
        self._trial_out = False
        self._buckets.clear()  # judged afresh from here
        self._answers = self._errors = 0

    def _count(self, now: float, *, error: bool) -> None:
        self._expire(now)
        second, buckets = int(now), self._buckets
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0])
        buckets[-1][1] += 1
        buckets[-1][2] += error
        self._answers += 1
        self._errors += error

    def _expire(self, now: float) -> None:
        horizon = now - self.config.error_window_s
        buckets = self._buckets
        while buckets and buckets[0][0] + 1 <= horizon:
            _, answers, errors = buckets.popleft()
            self._answers -= answers
            self._errors -= errors
