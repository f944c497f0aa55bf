"""The forecaster's alerting series (deploy/monitoring): whether the last run held, the last
observed demand, and the forecast one lead time ahead that the next runs are judged against."""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import REGISTRY

from forecaster import ForecasterSettings, run_once
from forecaster.errors import SourceUnavailable
from forecaster.plan import PlanStep
from forecaster.run import observe_forecast
from forecaster.series import Traffic

STEP = 60.0


class Fixed:
    """A source that answers with ``traffic``, or raises SourceUnavailable when it is None."""

    name = "fixed"

    def __init__(self, traffic: Traffic | None) -> None:
        self.traffic = traffic

    def fetch(self, now: float | None = None) -> Traffic:
        if self.traffic is None:
            raise SourceUnavailable("down")
        return self.traffic


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def settings() -> ForecasterSettings:
    return ForecasterSettings(
        redis_url="redis://127.0.0.1:1/0", models=["last_value"], warmup_s=300.0, actuation_delay_s=0.0
    )


def test_holding_is_one_while_the_source_is_down_and_zero_after() -> None:
    run_once(settings(), Fixed(None), now=6000.0)
    assert sample("promptedge_forecaster_holding") == 1.0
    run_once(settings(), Fixed(Traffic(0.0, STEP, np.full(30, 4.0))), now=30 * STEP)
    assert sample("promptedge_forecaster_holding") == 0.0
    assert sample("promptedge_forecaster_demand") == 4.0
    assert sample("promptedge_forecaster_forecast", band="mean") == 4.0  # last value
    assert sample("promptedge_forecaster_forecast", band="upper") >= 4.0


def test_forecast_is_the_step_one_lead_time_ahead() -> None:
    steps = [PlanStep(k, 600.0 + (k - 1) * STEP, float(k), float(k) + 0.5, 1) for k in range(1, 11)]
    observe_forecast(steps, 2.5, lead_at=600.0 + 300.0)  # 5 buckets ahead: the 6th step
    assert sample("promptedge_forecaster_forecast", band="mean") == 6.0
    assert sample("promptedge_forecaster_forecast", band="upper") == 6.5
    observe_forecast(steps, math.nan, lead_at=10_000.0)  # past the horizon: its last step
    assert sample("promptedge_forecaster_forecast", band="mean") == 10.0
    assert math.isnan(sample("promptedge_forecaster_demand") or 0.0)
