"""The cache's error tree (cache/errors.py) and its one Redis translation (cache/redis_errors.py)."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import RedisClusterException

from cache import CacheError, CacheUnavailable
from cache.errors import (
    BoundError,
    CorruptEntry,
    EmbedderBusy,
    EmbeddingError,
    PairsFormatError,
    RedisFailed,
    VerifierError,
)
from cache.redis_errors import redis_failures


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (CacheUnavailable, Exception),
        (RedisFailed, CacheUnavailable),
        (EmbeddingError, RuntimeError),
        (EmbedderBusy, TimeoutError),
        (CorruptEntry, ValueError),
        (VerifierError, ValueError),
        (BoundError, ValueError),
        (PairsFormatError, ValueError),
    ],
)
def test_every_error_is_a_cache_error_and_keeps_its_builtin_base(
    error: type[Exception], builtin: type[Exception]
) -> None:
    # handlers written before the tree (``except ValueError``, ``except TimeoutError``) still catch
    assert issubclass(error, CacheError)
    assert issubclass(error, builtin)


@pytest.mark.parametrize(
    "raised",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading"),
        RedisClusterException("no node answers"),
        OSError("network is unreachable"),
        TimeoutError("slow"),
    ],
)
def test_redis_failures_become_redis_failed_with_the_message_and_kind(raised: BaseException) -> None:
    with pytest.raises(RedisFailed) as caught:
        with redis_failures():
            raise raised
    assert str(caught.value) == str(raised)
    assert caught.value.kind == type(raised).__name__
    assert caught.value.__cause__ is raised
    assert isinstance(caught.value, CacheUnavailable)


@pytest.mark.parametrize("raised", [ValueError("a bug"), KeyError("k"), asyncio.CancelledError()])
def test_other_errors_and_a_cancel_pass_unchanged(raised: BaseException) -> None:
    with pytest.raises(type(raised)) as caught:
        with redis_failures():
            raise raised
    assert caught.value is raised
