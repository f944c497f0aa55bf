"""Pure readiness-probe state, as the kubelet keeps it for one container.

A container starts not ready. ``success_threshold`` consecutive successful probes make it ready;
``failure_threshold`` consecutive failures make it not ready; a container (re)start resets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.node.pod.spec import ProbeSpec


@dataclass
class Readiness:
    """Readiness of one container and the current run of equal probe results."""

    ready: bool = False
    successes: int = 0
    failures: int = 0

    def observe(self, ok: bool, probe: ProbeSpec) -> bool:
        """Record one probe result; returns True when ``ready`` changed."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if not self.ready and self.successes >= probe.success_threshold:
                self.ready = True
                return True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.ready and self.failures >= probe.failure_threshold:
                self.ready = False
                return True
        return False

    def reset(self) -> None:
        """The container (re)started or stopped: not ready, no results counted."""
        self.ready, self.successes, self.failures = False, 0, 0
