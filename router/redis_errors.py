"""The one place where redis-py's errors become the router's: ``redis_failures``.

The router's own Redis calls (rate limits, response affinity, predictive warming, ``/health``)
run inside ``redis_failures`` and catch ``RedisUnavailable`` (router/errors.py), never
redis-py's classes. The cache's calls are the cache's (cache/redis_errors.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from opskit.redis_client import translated
from router.errors import RedisUnavailable


def redis_failures() -> AbstractContextManager[None]:
    """Run the block's Redis calls; what redis-py raises leaves it as ``RedisUnavailable``
    (:func:`opskit.redis_client.translated` says which errors, and that nothing else is caught)."""
    return translated(RedisUnavailable)
