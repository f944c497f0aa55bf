"""The forecaster's (possibly time-compressed) clock, with the router's semantics.

simulated now = origin + (time.time() - origin) * scale, the same rule as the router's
counters (``router/observe/counters.py`` ``SimClock``, ``PROMPTEDGE_ROUTER_CLOCK_ORIGIN`` /
``_CLOCK_SCALE``). Give both processes the same origin and scale and they agree on the minute:
the router counts traffic into simulated minutes, the forecaster reads them at simulated "now".

Everything the forecaster reasons about is in simulated seconds: the daemon interval, the
cooldowns, the warm-up lead time, the planner state's timestamps. Only two things are wall
time and are converted here: the daemon's schedule (it fires every ``interval / scale`` wall
seconds) and the warm-up measured from Kubernetes pod timestamps (the API server stamps them
with the wall clock, so a measured duration is multiplied by ``scale``).
"""

from __future__ import annotations

import time


class SimClock:
    """origin: Unix s where simulated and wall time coincide (default: when the clock is made);
    scale: simulated seconds per wall second (> 0; 1.0 = real time, then ``now()`` is exactly
    ``time.time()``). Raises ValueError for a scale that is not > 0."""

    def __init__(self, origin: float | None = None, scale: float = 1.0) -> None:
        if not scale > 0:
            raise ValueError(f"clock scale must be > 0, got {scale!r}")
        self.origin = time.time() if origin is None else float(origin)
        self.scale = float(scale)

    def now(self) -> float:
        """Current simulated Unix time, s."""
        real = time.time()
        return real if self.scale == 1.0 else self.origin + (real - self.origin) * self.scale

    def to_wall(self, simulated_s: float) -> float:
        """Wall seconds that ``simulated_s`` simulated seconds take (a schedule's period)."""
        return simulated_s / self.scale

    def to_simulated(self, wall_s: float) -> float:
        """Simulated seconds that passed during ``wall_s`` wall seconds (a measured duration)."""
        return wall_s * self.scale
