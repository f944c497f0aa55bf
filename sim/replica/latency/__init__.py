"""The pure latency model of one vLLM-like replica (no clock, no I/O).

- ``batch``: continuous batching, one engine step at a time (:class:`BatchModel`), and
  :func:`simulate` on virtual time;
- ``prefix``: vLLM's automatic prefix caching on token blocks (:class:`KVBlockPool`);
- ``profiles``: GPU profiles, roofline estimates from public datasheet numbers.
"""

from sim.replica.latency.batch import BatchModel, ModelLimitError, Profile, SimResult, StepOutcome, simulate
from sim.replica.latency.prefix import DEFAULT_BLOCK_SIZE, KVBlockPool, block_hashes
from sim.replica.latency.profiles import A100, PROFILES, T4, get_profile

__all__ = [
    "A100",
    "DEFAULT_BLOCK_SIZE",
    "PROFILES",
    "T4",
    "BatchModel",
    "KVBlockPool",
    "ModelLimitError",
    "Profile",
    "SimResult",
    "StepOutcome",
    "block_hashes",
    "get_profile",
    "simulate",
]
