"""What a Pod asks of the stand-in node, read purely from the API's JSON (no I/O).

- ``spec``: the Pod's container read as vLLM would read it (:func:`replica_spec`);
- ``prestop``: its ``lifecycle.preStop`` hook and the kubelet's termination clock;
- ``probe``: readiness-probe state, as the kubelet keeps it per container;
- ``warmup``: a replica's warm-up: fixed seconds or a published cold-start distribution.
"""

from sim.node.pod.prestop import PreStopHook, pre_stop_hook, prestop_sleep_wall_s, sigkill_at
from sim.node.pod.probe import Readiness
from sim.node.pod.spec import PROFILE_ANNOTATION, WARMUP_ANNOTATION, PodSpecError, ProbeSpec, ReplicaSpec, replica_spec
from sim.node.pod.warmup import DISTRIBUTIONS, WarmupError, warmup_seconds

__all__ = [
    "DISTRIBUTIONS",
    "PROFILE_ANNOTATION",
    "WARMUP_ANNOTATION",
    "PodSpecError",
    "PreStopHook",
    "ProbeSpec",
    "Readiness",
    "ReplicaSpec",
    "WarmupError",
    "pre_stop_hook",
    "prestop_sleep_wall_s",
    "replica_spec",
    "sigkill_at",
    "warmup_seconds",
]
