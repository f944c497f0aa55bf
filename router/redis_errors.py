"""The one place where redis-py's errors become the router's: ``redis_failures``.

The router's own Redis calls (rate limits, response affinity, predictive warming, ``/health``)
run inside ``redis_failures`` and catch ``RedisUnavailable`` (router/errors.py), never
redis-py's classes. The cache's calls are the cache's (cache/redis_errors.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opskit.redis_client import REDIS_ERRORS
from router.errors import RedisUnavailable


@contextmanager
def redis_failures() -> Iterator[None]:
    """Run the block's Redis calls; what redis-py (or the socket under it) raises leaves the
    block as ``RedisUnavailable``. The errors translated are ``opskit.redis_client.REDIS_ERRORS``:
    ``redis.RedisError``, the cluster client's ``RedisClusterException`` (no RedisError) and
    ``OSError``, which includes ``TimeoutError``. Anything else passes unchanged, a
    cancellation included."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise RedisUnavailable(exc) from exc
