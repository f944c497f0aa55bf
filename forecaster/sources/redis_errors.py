"""The one place where redis-py's errors become the forecaster's: ``redis_failures``.

The forecaster's stores (planner state and forecast, forecaster/state.py; the published
decision, forecaster/actuate/publish.py) run their Redis calls inside ``redis_failures`` and
catch errors of the forecaster's tree (forecaster/errors.py), never redis-py's classes.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from forecaster.errors import ForecasterError
from opskit.redis_client import translated


def redis_failures(error: type[ForecasterError], what: str) -> AbstractContextManager[None]:
    """Run the block's Redis calls; what redis-py (or the socket under it) raises leaves the
    block as ``error(f"{what}: {original}")``, the original as ``__cause__`` (redis-py's
    messages name the host and port or the command, never the password); which errors, and that
    nothing else is caught: :func:`opskit.redis_client.translated`."""
    return translated(lambda exc: error(f"{what}: {exc}"))
