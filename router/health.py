"""Replica health: active probes, passive circuit breaker, latency-outlier ejection.

Pure state machines driven by explicit ``now`` values (seconds, monotonic clock), so they are
tested without I/O or sleeping.

- Active (``/health`` probes): a replica is *up* after ``rise`` consecutive successes and
  *down* after ``fall`` consecutive failures. It starts down, so a replica that is still
  warming up (vLLM answers 503 or nothing while loading a model) gets no traffic.
- Passive circuit breaker: ``failures`` consecutive request failures open the circuit for
  ``open_s``; then it is half-open and lets exactly one trial request through; its success
  closes the circuit, its failure opens it again.
- Outlier ejection: when the p99 of the last ``window`` TTFTs is above ``outlier_p99_s``
  (default 2 s), the replica is ejected for ``eject_s``; the pool never ejects its last
  replicas this way (see ``Pool.eligible``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Thresholds (counts and seconds) for :class:`HealthState`."""

    rise: int = 1
    fall: int = 2
    failures: int = 3
    open_s: float = 5.0
    outlier_p99_s: float = 2.0
    window: int = 50
    min_samples: int = 20
    eject_s: float = 10.0


class HealthState:
    """Health of one replica; all methods take ``now`` (monotonic seconds)."""

    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.up = False
        self._streak = 0  # >0: consecutive probe successes, <0: consecutive failures
        self._failures = 0
        self._open_until: float | None = None
        self._trial_out = False
        self._ttfts: deque[float] = deque(maxlen=config.window)
        self.ejected_until = 0.0
        self.draining = False  # set by discovery: open requests finish, nothing new is admitted

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

    def admits(self, now: float, *, ignore_ejection: bool = False) -> bool:
        """True if a request may be sent now (probe up, not draining, circuit not open, not ejected)."""
        if not self.up or self.draining or (now < self.ejected_until and not ignore_ejection):
            return False
        if self._open_until is None:
            return True
        return now >= self._open_until and not self._trial_out

    def on_dispatch(self, now: float) -> None:
        """Call when a request is sent; in half-open state it becomes the single trial."""
        if self._open_until is not None and now >= self._open_until:
            self._trial_out = True

    def on_success(self, now: float, ttft_s: float | None = None) -> None:
        """A request got a good answer (``ttft_s``: its time to first byte, if measured)."""
        self._failures = 0
        self._open_until = None
        self._trial_out = False
        if ttft_s is not None:
            self._ttfts.append(ttft_s)
            if len(self._ttfts) >= self.config.min_samples and self.p99() > self.config.outlier_p99_s:
                self.ejected_until = now + self.config.eject_s
                self._ttfts.clear()

    def on_failure(self, now: float) -> None:
        """A request failed at the replica (unreachable, 5xx, broke off, timed out)."""
        self._failures += 1
        if self._trial_out or self._failures >= self.config.failures:
            self._open_until = now + self.config.open_s
            self._trial_out = False

    def p99(self) -> float:
        """p99 of the recent TTFT window in seconds (0 when empty)."""
        if not self._ttfts:
            return 0.0
        ordered = sorted(self._ttfts)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
