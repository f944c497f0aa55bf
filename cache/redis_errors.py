"""The one place where redis-py's errors become the cache's: ``redis_failures``.

Every Redis call of the cache either runs inside ``ResponseCache``'s bound (cache/service.py),
or in the semantic index's rebuild and follower (cache/semantic/cache.py); each wraps its calls
in ``redis_failures`` and catches ``RedisFailed`` (cache/errors.py), never redis-py's classes.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from cache.errors import RedisFailed
from opskit.redis_client import translated


def redis_failures() -> AbstractContextManager[None]:
    """Run the block's Redis calls; what redis-py raises leaves it as ``RedisFailed``
    (:func:`opskit.redis_client.translated` says which errors, and that nothing else is caught)."""
    return translated(RedisFailed)
