"""The one place where redis-py's errors become the forecaster's: ``redis_failures``.

The forecaster's stores (planner state and forecast, forecaster/state.py; the published
decision, forecaster/actuate/publish.py) run their Redis calls inside ``redis_failures`` and
catch errors of the forecaster's tree (forecaster/errors.py), never redis-py's classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from forecaster.errors import ForecasterError
from opskit.redis_client import REDIS_ERRORS


@contextmanager
def redis_failures(error: type[ForecasterError], what: str) -> Iterator[None]:
    """Run the block's Redis calls; what redis-py (or the socket under it) raises leaves the
    block as ``error(f"{what}: {original}")``, the original as ``__cause__`` (redis-py's
    messages name the host and port or the command, never the password). The errors translated
    are ``opskit.redis_client.REDIS_ERRORS``: ``redis.RedisError``, the cluster client's
    ``RedisClusterException`` (no RedisError) and ``OSError``. Anything else passes unchanged."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise error(f"{what}: {exc}") from exc
