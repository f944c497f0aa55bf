"""One live cycle in advisory mode (forecaster/live.py): it plans as if in control -- from its
own last decision, not from the replicas another autoscaler set -- records what it saw in real
Redis, and writes nothing through the actuator."""

from __future__ import annotations

import numpy as np

from forecaster.actuate import ActuationResult, ActuatorSettings
from forecaster.advisory.record import AdvisoryLog, advisory_key
from forecaster.live import cycle
from forecaster.series import Traffic
from forecaster.settings import ForecasterSettings
from tests.forecaster.test_run_metrics import Fixed


class Observed:
    """An advisory actuator stand-in whose cluster has ``spec`` replicas (20: another
    autoscaler's choice), ``ready`` of them Ready."""

    def __init__(self, spec: int, ready: int) -> None:
        self.spec, self.ready = spec, ready
        self.applied: list[int] = []

    def read_current(self) -> int:
        return self.spec

    def apply(self, decision, current):  # type: ignore[no-untyped-def]
        self.applied.append(decision.replicas)
        return ActuationResult(
            "advisory", "llm/vllm", decision.replicas, self.spec, "advised", decision.reason, ready=self.ready
        )


def test_advisory_plans_from_its_own_decisions_and_records_the_cluster(redis_url: str) -> None:
    settings = ForecasterSettings(redis_url=redis_url, models=["last_value"], capacity_per_replica=1.0, max_replicas=32)
    actuator_settings = ActuatorSettings(mode="advisory", namespace="llm", deployment=None)
    traffic = Traffic(0.0, 60.0, np.full(60, 3.0))  # 3 requests/s for an hour
    actuator = Observed(spec=20, ready=18)
    outcome = cycle(settings, actuator_settings, Fixed(traffic), actuator, now=3600.0)  # type: ignore[arg-type]
    # In control from here it would set 3 x 1.2 -> 4; planned from the cluster's 20 it could
    # only have halved them (max_scale_down_fraction) to 10.
    assert outcome.result.decision.replicas == 4, outcome.result.decision.reason
    (seen,), _ = AdvisoryLog(redis_url, advisory_key("llm/-")).read(0, 1e10)
    assert (seen.desired, seen.spec, seen.ready, seen.demand) == (4, 20, 18, 3.0)
