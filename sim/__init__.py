"""PromptEdge sim: simulated vLLM replicas, a trace replayer and the local demo stack.

Rooms (``python -m sim --help`` lists the commands that use them):

- ``replica/``: one simulated vLLM replica (``python -m sim serve``): its HTTP surface
  (``replica/api/``), its pure latency model with prefix caching and GPU profiles
  (``replica/latency/``), the engine loop, vLLM's metrics, settings and the server process;
- ``client/``: what sends requests (``python -m sim replay``, ``sample``): trace readers,
  prompt mixes, the replayer and its report; ``client/traffic/`` rebuilds arrivals with real
  peaks from published rate statistics;
- ``demo/``: the local demo (``python -m sim demo``, ``make demo``), its report and picture;
- ``stack/``: local processes stopped together (the demo's and the loop's children, Redis
  servers, Redis Cluster and Sentinel topologies for tests and benchmarks);
- ``node/``: the stand-in kubelet (``python -m sim node``), with the pure reading of a Pod in
  ``node/pod/``;
- ``loop/``: the closed loop on a real control plane (``python -m sim loop``).

Public surface: the latency model (:class:`Profile`, :class:`BatchModel`, :func:`simulate`),
the GPU profiles, the replica app factory (:func:`create_app`, :class:`SimSettings`).
"""

from sim.replica.api.app import create_app
from sim.replica.latency.batch import BatchModel, ModelLimitError, Profile, StepOutcome, simulate
from sim.replica.latency.profiles import A100, PROFILES, T4, get_profile
from sim.replica.settings import SimSettings

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
