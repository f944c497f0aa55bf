"""Every Redis failure of the forecaster's own stores (planner state, forecast, the published
decision) becomes its error tree's SourceUnavailable / PublishUnavailable at one adapter
(forecaster/sources/redis_errors.py), whatever redis-py raises: a cluster client's
RedisClusterException is no RedisError, and a raw socket error is an OSError."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from redis.exceptions import RedisClusterException

from forecaster.actuate import PublishUnavailable
from forecaster.actuate.publish import DesiredStore
from forecaster.errors import ForecasterError, SourceUnavailable
from forecaster.plan import PlannerState
from forecaster.state import RedisStateStore

FAILURES = [
    redis.ConnectionError("refused"),
    redis.TimeoutError("slow"),
    redis.ResponseError("WRONGTYPE"),
    RedisClusterException("no node answers"),
    ConnectionResetError("reset"),
]


class Failing:
    """A redis-py client stand-in whose every command raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise self.error

        return fail


@pytest.mark.parametrize("error", FAILURES, ids=lambda e: type(e).__name__)
def test_state_store_failures_are_source_unavailable(error: BaseException) -> None:
    store = RedisStateStore("redis://127.0.0.1:9/0", "k")
    store._conn = Failing(error)  # type: ignore[assignment]
    for call in (
        store.load,
        lambda: store.save(PlannerState(2, 0.0)),
        lambda: store.publish_forecast({"pool": "m"}, 60),
    ):
        with pytest.raises(SourceUnavailable) as caught:
            call()
        assert str(error) in str(caught.value)


@pytest.mark.parametrize("error", FAILURES, ids=lambda e: type(e).__name__)
def test_desired_store_failures_are_publish_unavailable(error: BaseException) -> None:
    store = DesiredStore(lambda: Failing(error), "ns", "dep")  # type: ignore[arg-type, return-value]
    for call in (store.read, lambda: store.publish(3, "why", datetime.now(UTC))):
        with pytest.raises(PublishUnavailable) as caught:
            call()
        assert isinstance(caught.value, ForecasterError) and str(error) in str(caught.value)


def test_other_errors_pass_unchanged() -> None:
    store = RedisStateStore("redis://127.0.0.1:9/0", "k")
    store._conn = Failing(KeyError("not redis"))  # type: ignore[assignment]
    with pytest.raises(KeyError):
        store.load()
