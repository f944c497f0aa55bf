"""The redis-py client of a Redis URL: one server, Redis Cluster or Sentinel (URL forms and
credentials: opskit/_redis_url.py). Kept out of ``opskit``'s own surface so that importing opskit
(settings, log format) never imports redis-py.

:func:`async_redis` for asyncio code (router, cache), :func:`sync_redis` for blocking code
(forecaster, scripts); both use redis-py's own ``Redis``, ``RedisCluster`` and ``Sentinel``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel

from opskit._redis_url import SENTINEL_TIMEOUT_S, RedisTarget, RedisURLError, parse_redis_url

__all__ = ["REDIS_ERRORS", "RedisURLError", "async_redis", "check_redis_url", "sync_redis", "translated"]

# What a Redis call can raise when Redis is down, slow or refuses a command: redis-py's cluster
# client raises its own RedisClusterException, which is no RedisError (a script whose keys span
# two slots; a cluster none of whose nodes answers), so a handler that catches RedisError alone
# lets a cluster outage through as a 500. Every fail-open handler catches this tuple.
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, RedisClusterException, OSError)


@contextmanager
def translated(error: Callable[[BaseException], Exception]) -> Iterator[None]:
    """Run the block's Redis calls; what redis-py (or the socket under it) raises, one of
    ``REDIS_ERRORS`` (``redis.RedisError``, the cluster client's ``RedisClusterException``, which
    is no RedisError, and ``OSError``, ``TimeoutError`` included), leaves the block as
    ``error(original)`` with the original as ``__cause__``. Anything else passes unchanged, a
    cancellation included. Each package's adapter (``<package>/redis_errors.py``) names its error."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise error(exc) from exc


def _target(url: str | RedisTarget) -> RedisTarget:
    target = url if isinstance(url, RedisTarget) else parse_redis_url(url)
    if target.topology == "standalone":
        try:  # the options redis-py's from_url would refuse later, with a bare ValueError
            parse_url(target.url)
        except ValueError as exc:  # redis-py's message names the option, never the credentials
            raise RedisURLError(f"a bad option in the Redis URL: {exc}") from None
        # an option redis-py does not know passes parse_url and fails at the first connection
        # (TypeError naming it); making one connection object opens no socket
        pool = redis.ConnectionPool.from_url(target.url)
        try:
            pool.make_connection()
        except TypeError as exc:
            raise RedisURLError(f"an unknown option in the Redis URL: {exc}") from None
        finally:
            pool.disconnect()
    return target


def check_redis_url(url: str) -> None:
    """Raise RedisURLError for a URL no client can be built from, its query options included
    (``?socket_timeout=abc``, which opskit/_redis_url.py's pure parser does not read): for a
    start-up check that names the setting instead of a traceback when the client is built."""
    _target(url)


def _sentinel_kwargs(target: RedisTarget, options: dict[str, Any]) -> dict[str, Any]:
    timeout = min(t for t in (options.get("socket_timeout"), SENTINEL_TIMEOUT_S) if t is not None)
    connect = options.get("socket_connect_timeout")
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout if connect is None else min(connect, timeout),
    }
    if target.sentinel_password is not None:
        kwargs["password"] = target.sentinel_password
    if target.ssl:
        kwargs["ssl"] = True
    return kwargs


def _auth(target: RedisTarget) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if target.username is not None:
        kwargs["username"] = target.username
    if target.password is not None:
        kwargs["password"] = target.password
    if target.ssl:
        kwargs["ssl"] = True
    return kwargs


def async_redis(url: str | RedisTarget, **options: Any) -> aioredis.Redis:
    """An asyncio client for ``url`` (the table in opskit/_redis_url.py): ``redis.asyncio.Redis``,
    ``redis.asyncio.RedisCluster`` or a Sentinel-managed ``redis.asyncio.Redis`` that finds the
    current master on every (re)connect, so it follows a failover by itself.

    options: redis-py client keywords (``socket_timeout``, ``socket_connect_timeout``,
    ``decode_responses``, ...), given to every connection; sentinel queries are bounded by
    ``min(socket_timeout, SENTINEL_TIMEOUT_S)``. Raises RedisURLError; connects lazily (the
    first command raises redis errors). The cluster client is typed as ``Redis``: it offers the
    same commands, pipelines and scripts (keys of one call in one slot)."""
    target = _target(url)
    if target.topology == "standalone":
        return aioredis.Redis.from_url(target.url, **options)
    if target.topology == "cluster":
        nodes = [AsyncClusterNode(host, port) for host, port in target.nodes]
        return AsyncRedisCluster(startup_nodes=nodes, **_auth(target), **options)  # type: ignore[return-value]
    sentinel = AsyncSentinel(list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, options))
    assert target.service is not None
    return sentinel.master_for(target.service, db=target.db, **_auth(target), **options)


def sync_redis(url: str | RedisTarget, **options: Any) -> redis.Redis:
    """The blocking twin of :func:`async_redis` (``redis.Redis``, ``redis.RedisCluster`` or a
    Sentinel-managed ``redis.Redis``), for the forecaster and scripts; same options and errors,
    except that redis-py's blocking cluster client connects at once: it raises
    ``redis.ConnectionError`` when no startup node answers (build it where redis errors are
    handled)."""
    target = _target(url)
    if target.topology == "standalone":
        return redis.Redis.from_url(target.url, **options)
    if target.topology == "cluster":
        nodes = [ClusterNode(host, port) for host, port in target.nodes]
        try:
            return RedisCluster(startup_nodes=nodes, **_auth(target), **options)  # type: ignore[return-value]
        except RedisClusterException as exc:  # not a RedisError: callers handle those
            raise redis.ConnectionError(f"no Redis Cluster startup node answers: {exc}") from None
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs=_sentinel_kwargs(target, options))
    assert target.service is not None
    return sentinel.master_for(target.service, db=target.db, **_auth(target), **options)
