"""The closed loop (``python -m sim loop``): real control plane, stand-in node, router,
forecaster or HPA, replayed traffic on one simulated clock; measured side by side.

Public surface: :class:`LoopConfig`, :func:`run_loop`, :func:`render`, :func:`write_json`,
:func:`plot`, and the pure measures in :mod:`sim.loop.measure` and :mod:`sim.loop.queue_time`.
"""

from sim.loop.config import DEFAULT_ITL_S, DEFAULT_TTFT_S, POLICIES, LoopConfig
from sim.loop.report import plot, ratios, render, write_json


def run_loop(cfg: LoopConfig) -> dict:  # type: ignore[type-arg]
    """See :func:`sim.loop.run.run_loop` (imported lazily: it needs the kubernetes client)."""
    from sim.loop.run import run_loop as _run

    return _run(cfg)


__all__ = [
    "DEFAULT_ITL_S",
    "DEFAULT_TTFT_S",
    "POLICIES",
    "LoopConfig",
    "plot",
    "ratios",
    "render",
    "run_loop",
    "write_json",
]
