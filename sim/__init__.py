"""PromptEdge sim: simulated vLLM replicas, a trace replayer and the local demo stack.

Public surface: the latency model (:class:`Profile`, :class:`BatchModel`, :func:`simulate`),
the GPU profiles, the replica app factory (:func:`create_app`, :class:`SimSettings`).
"""

from sim.api import create_app
from sim.latency import BatchModel, ModelLimitError, Profile, StepOutcome, simulate
from sim.profiles import A100, PROFILES, T4, get_profile
from sim.settings import SimSettings

__all__ = [
    "A100",
    "PROFILES",
    "T4",
    "BatchModel",
    "ModelLimitError",
    "Profile",
    "SimSettings",
    "StepOutcome",
    "create_app",
    "get_profile",
    "simulate",
]
