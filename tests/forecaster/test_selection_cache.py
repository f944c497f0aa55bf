"""The daemon keeps its model choice for RESELECT_S and carries the model over newer buckets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import forecaster.run as run_module
from forecaster import ForecasterSettings, run_once
from forecaster.run import SelectionCache
from forecaster.series import Traffic

STEP = 60.0
SEASON = 1440


@dataclass
class ArraySource:
    """Demand from an array of 1-minute rates starting at Unix 0; fetch(now) keeps what ended by now."""

    rates: np.ndarray
    name: str = "array"

    def fetch(self, now: float | None = None) -> Traffic:
        n = len(self.rates) if now is None else int(now // STEP)
        return Traffic(0.0, STEP, self.rates[:n].copy(), name=self.name)


def _daily(days: int = 4) -> np.ndarray:
    minute = np.arange(days * SEASON) % SEASON
    return np.where((minute >= 720) & (minute < 780), 3.0, 1.0)


def _counting_select(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = run_module.select

    def counted(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(run_module, "select", counted)
    return calls


def test_kept_choice_is_carried_over_newer_buckets_then_chosen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_select(monkeypatch)
    settings = ForecasterSettings(
        capacity_per_replica=1.0,
        models=["last_value", "seasonal_naive"],
        reselect_s=600.0,
        warmup_s=300.0,
        rate_window_s=60.0,
    )
    source = ArraySource(_daily())
    cache = SelectionCache(settings.reselect_s)
    t0 = (3 * SEASON + 700) * STEP  # day 4, 20 minutes before the daily peak
    first = run_once(settings, source, now=t0, cache=cache)
    later = run_once(settings, source, now=t0 + 300, cache=cache)
    assert len(calls) == 1 and later.model == first.model == "seasonal_naive"
    # carried over 5 newer minutes: the peak is now 15 minutes ahead instead of 20
    assert first.steps[20].forecast == 3.0 and first.steps[19].forecast == 1.0
    assert later.steps[15].forecast == 3.0 and later.steps[14].forecast == 1.0
    run_once(settings, source, now=t0 + 600, cache=cache)
    assert len(calls) == 2  # RESELECT_S later: chosen again


def test_without_a_cache_or_with_reselect_zero_every_run_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_select(monkeypatch)
    settings = ForecasterSettings(capacity_per_replica=1.0, models=["last_value"], reselect_s=0.0)
    source = ArraySource(_daily())
    cache = SelectionCache(settings.reselect_s)
    for i in range(3):
        run_once(settings, source, now=(3 * SEASON + 700 + i) * STEP, cache=cache)
        run_once(settings, source, now=(3 * SEASON + 700 + i) * STEP)
    assert len(calls) == 6


def test_a_short_history_choice_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_select(monkeypatch)
    settings = ForecasterSettings(capacity_per_replica=1.0, models=["last_value"], reselect_s=3600.0)
    source = ArraySource(np.ones(30))
    cache = SelectionCache(settings.reselect_s)
    run_once(settings, source, now=20 * STEP, cache=cache)
    run_once(settings, source, now=21 * STEP, cache=cache)
    assert len(calls) == 2
