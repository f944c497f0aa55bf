"""``python -m sim node``: a kubelet stand-in that runs each Pod bound to it as a sim replica.

Public surface: :class:`NodeSettings`, :class:`SimNode`, :func:`run_node`, the pure helpers
:func:`replica_spec` (Pod -> replica), :func:`warmup_seconds` and :data:`DISTRIBUTIONS`.

Rooms: ``node/pod/`` reads a Pod (its container, preStop hook, readiness probe, warm-up), purely;
``kubeapi`` is the node's only door to Kubernetes and ``status`` builds what it writes there;
``process``, ``spare`` and ``runtime`` are the replica processes it runs; ``kubelet`` is its loop,
``main`` the process and ``settings`` its settings.
"""

from sim.node.kubelet import SimNode
from sim.node.main import run_node
from sim.node.pod import DISTRIBUTIONS, PodSpecError, ReplicaSpec, WarmupError, replica_spec, warmup_seconds
from sim.node.settings import NodeSettings

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
