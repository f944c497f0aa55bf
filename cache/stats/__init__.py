"""Counting what the cache does: ``store`` (outcome counters in Redis, shared by every worker:
the /cache/stats JSON) and ``metrics`` (the Prometheus series of this process). Nothing is
imported here: import the submodule you need."""
