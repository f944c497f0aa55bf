"""Stuck generation: a replica that has work and makes no progress on it (pure, explicit ``now``).

A replica whose engine hangs (a stuck kernel, a deadlock) while its API server still answers
``/health`` 200 is never taken down by probes: vLLM's ``/health`` checks that the engine
process is alive, not that it generates. Two views of progress judge it instead, both
bounded by ``stuck_after_s`` (seconds, monotonic clock):

- the router's own streams: *progress* is any chunk received from the replica on any
  request (:meth:`Progress.advanced`). The replica is *quiet* while it has at least one open
  streamed request and nothing arrived since the later of its last progress and the oldest
  open stream's send. Non-stream requests are no evidence of silence (their only byte comes
  after the whole generation), but their answer is progress.
- its metrics (:meth:`Progress.scraped`): its generation token counter (vLLM's
  ``vllm:generation_tokens_total``) moving is progress; it is quiet while its running count
  is above 0 and the counter stands still. Only a scrape of the last ``stuck_after_s``
  counts: a replica whose ``/metrics`` stopped answering is not judged on an old page.

It is *stuck* when either view has been quiet for ``stuck_after_s``: it admits no new request
(:meth:`Progress.admits`). It comes back at its next progress: a chunk of one of its open
streams, or its counter moving. When its silent requests end without progress (they timed
out, their clients left), it is still *out*; it then admits one request at a time, a trial
whose first chunk brings it back and whose silence for ``stuck_after_s`` makes it stuck again,
so that a replica the router has no other evidence about is neither lost for good nor flooded.

Why a bound and not the stream timeouts: those are each request's deadline (its priority's
``ttfb_s``/``idle_s``, up to minutes), chosen by the client; they say nothing about the replica
and load-aware dispatch keeps sending it requests until they expire.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class Progress:
    """Whether one replica makes progress on its open requests; every method takes ``now``
    (monotonic seconds) where it needs one. ``stuck_after_s`` > 0."""

    def __init__(self, stuck_after_s: float) -> None:
        self.stuck_after_s = stuck_after_s
        self._last = float("-inf")  # the last progress seen
        self._streams: OrderedDict[Hashable, float] = OrderedDict()  # open streamed requests -> sent, oldest first
        self._open = 0  # open requests, streamed or not
        self._generated: float | None = None  # the generation counter at the last scrape
        self._busy_since: float | None = None  # first scrape of the current spell with running > 0
        self._scraped_at = float("-inf")
        self._latched = False  # judged stuck and not seen progressing since

    def opened(self, key: Hashable, now: float, streamed: bool) -> None:
        """A request was sent (``key``: anything hashable naming it, until :meth:`closed`)."""
        self._open += 1
        if streamed:
            self._streams[key] = now

    def closed(self, key: Hashable) -> None:
        """The request ``key`` of :meth:`opened` ended, however; call once per request."""
        self._open -= 1
        self._streams.pop(key, None)

    def advanced(self, now: float) -> None:
        """Something of a generation arrived from the replica (a stream's chunk, a whole answer)."""
        self._last = max(self._last, now)
        self._latched = False

    def scraped(self, now: float, running: float | None, generated: float | None) -> None:
        """One ``/metrics`` scrape: requests running, generation tokens counted (None: not
        exported; then the metrics say nothing). A counter that moved (also down: the
        replica restarted) is progress."""
        if running is None or generated is None:
            self._busy_since = None
            return
        if self._generated is not None and generated != self._generated:
            self.advanced(now)
        self._generated = generated
        self._scraped_at = now
        if running <= 0:
            self._busy_since = None
        elif self._busy_since is None:
            self._busy_since = now

    def quiet_s(self, now: float) -> float | None:
        """Seconds the replica has had work and shown no progress on it (the longer of the
        two views), or None when neither view sees open work."""
        quiet: float | None = None
        if self._streams:
            quiet = now - max(self._last, next(iter(self._streams.values())))
        if self._busy_since is not None and now - self._scraped_at <= self.stuck_after_s:
            by_metrics = now - max(self._last, self._busy_since)
            quiet = by_metrics if quiet is None else max(quiet, by_metrics)
        return quiet

    def stuck(self, now: float) -> bool:
        """True when the replica has been quiet for ``stuck_after_s`` or more."""
        quiet = self.quiet_s(now)
        return quiet is not None and quiet >= self.stuck_after_s

    def out(self, now: float) -> bool:
        """True while the replica is out of rotation for lack of progress: stuck now, or
        judged stuck and not seen progressing since (then it admits trials, :meth:`admits`)."""
        if self.stuck(now):
            self._latched = True  # stays out until it progresses, whatever happens to its requests
        return self._latched

    def admits(self, now: float) -> bool:
        """True if a new request may be sent now: not stuck, and when judged stuck before and
        not seen progressing since, only while no other request is open (one trial at a time)."""
        if not self.out(now):
            return True
        return not self.stuck(now) and self._open == 0
