"""``python -m sim node``: a kubelet stand-in that runs each Pod bound to it as a sim replica.

Public surface: :class:`NodeSettings`, :class:`SimNode`, :func:`run_node`, the pure helpers
:func:`replica_spec` (Pod -> replica), :func:`warmup_seconds` and :data:`DISTRIBUTIONS`.
"""

from sim.node.main import run_node
from sim.node.kubelet import SimNode
from sim.node.podspec import PodSpecError, ReplicaSpec, replica_spec
from sim.node.settings import NodeSettings
from sim.node.warmup import DISTRIBUTIONS, WarmupError, warmup_seconds

__all__ = [
    "DISTRIBUTIONS",
    "NodeSettings",
    "PodSpecError",
    "ReplicaSpec",
    "SimNode",
    "WarmupError",
    "replica_spec",
    "run_node",
    "warmup_seconds",
]
