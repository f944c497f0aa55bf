"""Local processes on one machine, stopped together however a run ends: the demo's and the
closed loop's children, and real Redis servers and topologies for tests and benchmarks.

- ``processes``: :class:`Stack` of child processes (own process groups, SIGTERM then SIGKILL),
  :class:`RedisServer`, free-port helpers;
- ``redis_topology``: a local Redis Cluster (:class:`LocalCluster`) and a Sentinel group
  (:class:`LocalSentinel`).
"""

from sim.stack.processes import Child, RedisServer, Stack, StackError, free_port, pid_alive, port_free
from sim.stack.redis_topology import LocalCluster, LocalSentinel, binaries_missing

__all__ = [
    "Child",
    "LocalCluster",
    "LocalSentinel",
    "RedisServer",
    "Stack",
    "StackError",
    "binaries_missing",
    "free_port",
    "pid_alive",
    "port_free",
]
