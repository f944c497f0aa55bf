"""The loop's advising forecaster (LoopConfig.advise, issue 35): beside the reactive policy it
runs with the predictive policy's settings, only its mode differs (no processes)."""

from __future__ import annotations

from pathlib import Path

from sim.loop.config import LoopConfig
from sim.loop.run import ADVISORY_KEYS, _forecaster_env


class Prep:
    capacity_rps = 0.3


def test_the_advising_forecaster_is_the_predictive_one_in_advisory_mode() -> None:
    cfg = LoopConfig(trace=Path("unused"), advise=True)
    args = (cfg, Prep(), Path("/k"), "redis://127.0.0.1:1/0", {"PROMPTEDGE_FORECASTER_CLOCK_SCALE": "7.0"})
    control, advising = _forecaster_env(*args, "kubernetes"), _forecaster_env(*args, "advisory")  # type: ignore[arg-type]
    assert advising.pop("PROMPTEDGE_ACTUATOR_MODE") == "advisory"
    assert control.pop("PROMPTEDGE_ACTUATOR_MODE") == "kubernetes"
    assert advising == control
    assert not LoopConfig(trace=Path("unused")).advise  # off unless asked


def test_the_record_is_found_under_the_forecasters_key_prefix() -> None:
    from forecaster.advisory.record import KEY_PREFIX

    assert ADVISORY_KEYS == f"{KEY_PREFIX}:*"
