"""The one place where redis-py's errors become the cache's: ``redis_failures``.

Every Redis call of the cache either runs inside ``ResponseCache``'s bound (cache/service.py),
or in the semantic index's rebuild and follower (cache/semantic/cache.py); each wraps its calls
in ``redis_failures`` and catches ``RedisFailed`` (cache/errors.py), never redis-py's classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cache.errors import RedisFailed
from opskit.redis_client import REDIS_ERRORS


@contextmanager
def redis_failures() -> Iterator[None]:
    """Run the block's Redis calls; what redis-py (or the socket under it) raises leaves the
    block as ``RedisFailed``. The errors translated are ``opskit.redis_client.REDIS_ERRORS``:
    ``redis.RedisError``, the cluster client's ``RedisClusterException`` (no RedisError) and
    ``OSError``, which includes ``TimeoutError``. Anything else passes unchanged, a
    cancellation included."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise RedisFailed(exc) from exc
