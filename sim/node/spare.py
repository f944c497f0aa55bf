"""A spare replica process: ``python -m sim.node.spare``, imports done, waiting for its settings.

A replica's Python start-up (~3 s of FastAPI/pydantic imports on the shared machine) is wall
time that the time scale multiplies into simulated warm-up (60 simulated seconds per wall
second at 60x). So the node keeps a few spares that have imported everything; when a Pod needs
a replica, the node writes one JSON object of replica settings (``SimSettings`` fields, e.g.
``{"host": ..., "port": ..., "model": ..., "warmup_from": ...}``) as one line to a spare's
stdin, and the spare serves exactly as ``python -m sim serve`` would (same errors, exit 2 for
settings that cannot run). End of input without a line: exit 0 (a spare released unused).
"""

from __future__ import annotations

import json
import sys

from sim.replica.serving import ReplicaConfigError, build_replica, serve_replica


def main() -> int:
    """Read one settings line from stdin and serve; returns the process exit code."""
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    try:
        overrides = json.loads(line)
        if not isinstance(overrides, dict):
            raise ValueError("expected a JSON object of replica settings")
        app, settings = build_replica(overrides)
    except (ValueError, ReplicaConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    serve_replica(app, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
