"""Settings passed by field name in code are used, not silently replaced by the default."""

from __future__ import annotations

import pytest

from forecaster.settings import ForecasterSettings


def test_redis_url_given_by_name_is_the_one_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # ForecasterSettings(redis_url=...) was ignored (only the environment aliases were read), so
    # tests that passed their own database wrote planner state and counters to db 0 of the
    # machine's Redis instead.
    monkeypatch.delenv("PROMPTEDGE_REDIS_URL", raising=False)
    monkeypatch.delenv("PROMPTEDGE_FORECASTER_REDIS_URL", raising=False)
    assert ForecasterSettings(redis_url="redis://127.0.0.1:6390/7").redis_url == "redis://127.0.0.1:6390/7"
