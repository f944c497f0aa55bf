"""The Redis keys and the forecast document the router and the forecaster share are defined
once (opskit) and used by both sides; their spelling is the wire format, so it is pinned here."""

from __future__ import annotations

import json
import math

import pytest

from opskit import (
    FORECAST_KEY,
    MAX_FORECAST_BYTES,
    TRAFFIC_FIELDS,
    TRAFFIC_KEY,
    TRAFFIC_MODELS_KEY,
    TRAFFIC_TTL_S,
    forecast_document,
    read_forecast,
    traffic_field,
    traffic_key,
)


def test_the_wire_format_is_what_running_routers_and_forecasters_use() -> None:
    # a router and a forecaster of different releases share one Redis: these strings must not move
    assert traffic_key("llama", 1440 * 20000 + 5) == "promptedge:traffic:llama:20000"
    assert traffic_field(1440 * 20000 + 5, "misses") == f"{1440 * 20000 + 5}:misses"
    assert TRAFFIC_KEY == "promptedge:traffic:{model}:{day}"
    assert TRAFFIC_MODELS_KEY == "promptedge:traffic:models"
    assert TRAFFIC_FIELDS == ("requests", "misses", "prompt_tokens", "completion_tokens")
    assert TRAFFIC_TTL_S == 15 * 86400
    assert FORECAST_KEY.format(pool="m") == "promptedge:forecaster:forecast:m"


def test_both_sides_import_the_one_definition() -> None:
    from forecaster import state
    from forecaster.sources import redis_counters
    from router.caching import warming
    from router.observe import counters
    from sim.client.traffic import history

    assert warming.FORECAST_KEY is state.FORECAST_KEY is FORECAST_KEY
    assert counters.KEY is redis_counters.TRAFFIC_KEY is TRAFFIC_KEY
    assert counters.MODELS_KEY is redis_counters.MODELS_KEY is history.MODELS_KEY is TRAFFIC_MODELS_KEY
    assert redis_counters.FIELDS is TRAFFIC_FIELDS


def test_the_document_written_reads_back() -> None:
    doc = forecast_document(
        "m",
        1_796_090_460.0,
        7.5,
        [(1_796_090_460.0, 4.2), (1_796_091_060.0, 5.0)],
        [(1_796_090_460.0, 5.1), (1_796_091_060.0, 6.3)],
        "requests",
    )
    assert doc == {
        "v": 1,
        "pool": "m",
        "at": 1_796_090_460.0,
        "unit": "requests",
        "capacity_rps": 7.5,
        "points": [[1_796_090_460.0, 4.2], [1_796_091_060.0, 5.0]],
        "upper": [[1_796_090_460.0, 5.1], [1_796_091_060.0, 6.3]],
    }
    forecast, why = read_forecast(json.dumps(doc))
    assert why is None and forecast is not None
    assert (forecast.pool, forecast.at, forecast.capacity) == ("m", 1_796_090_460.0, 7.5)
    assert forecast.points == [(1_796_090_460.0, 4.2), (1_796_091_060.0, 5.0)]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"v": 2}, "version 2, not 1"),
        ({"at": math.inf}, "a time, point or capacity_rps not finite and >= 0"),
        ({"capacity_rps": -1.0}, "a time, point or capacity_rps not finite and >= 0"),
        ({"at": 1_796_090_460_000.0}, "times past the year 5000: milliseconds, not Unix seconds?"),
        ({"points": "x"}, "malformed (ValueError)"),
    ],
)
def test_an_unusable_document_is_refused_with_a_reason(change: dict[str, object], why: str) -> None:
    doc = {**forecast_document("m", 100.0, 1.0, [(100.0, 1.0)], [(100.0, 2.0)], "requests"), **change}
    assert read_forecast(json.dumps(doc)) == (None, why)


def test_absent_and_oversized_documents() -> None:
    assert read_forecast(None) == (None, None)
    assert (
        read_forecast(b" " * (MAX_FORECAST_BYTES + 1))[1]
        == f"{MAX_FORECAST_BYTES + 1} bytes, over the {MAX_FORECAST_BYTES} read"
    )
