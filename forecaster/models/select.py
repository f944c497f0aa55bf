"""Per-series model choice by rolling-origin backtest, within a time budget.

Each candidate is fitted once on the history before the first origin, then applied
(``forward``) at every origin of the recent backtest span; its score is the MAE over the steps
from the lead-time horizon (the step the planner acts on) to the lead plus the origins'
spacing, so every bucket of the span is scored once whatever the phase of the origins. A model must beat last value by a margin to
be chosen: selection falls back rather than loses. The chosen model's backtest residuals (log1p
space, per step ahead) also calibrate its upper quantile, unless too few exist, in which case
the model's own interval stays. With ``band_window`` the band is conditioned on where the last
bucket stands against the trailing mean (``forecaster.models.band``): wider after a dip, narrower
after a rise; with ``band_scale`` also in proportion to the volatility of that trailing span.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from forecaster.errors import ConfigError
from forecaster.models.band import ReversionBand, fit_reversion_band, reversion_feature, volatility
from forecaster.models.base import Forecast, Model, clean
from forecaster.models.baselines import LastValue, SeasonalNaive
from forecaster.models.ets import HoltWinters
from forecaster.models.seasonal import SeasonalLevel

# A candidate must be this much better than last value at the lead-time horizon to be chosen.
MARGIN = 0.05
MIN_FIT = 10
MIN_ORIGINS = 8
MIN_CALIBRATION = 10
# Prophet needs seconds per fit and one fit per backtest origin; below this budget it is skipped.
PROPHET_MIN_BUDGET_S = 30.0


def build_candidates(names: list[str], season: int, step: float, level: float) -> list[Model]:
    """Candidate models by name ("last_value", "seasonal_naive", "seasonal_level", "ets_level",
    "holt_winters", "prophet"), cheapest first; last value is always included (it is the fallback). Raises
    ConfigError naming an unknown model."""
    makers: dict[str, Callable[[], Model]] = {
        "last_value": LastValue,
        "seasonal_naive": lambda: SeasonalNaive(season),
        "seasonal_level": lambda: SeasonalLevel(season),
        "ets_level": lambda: HoltWinters(season, trend=False),
        "holt_winters": lambda: HoltWinters(season),
    }
    if "prophet" in names:
        from forecaster.models.prophet_adapter import ProphetModel

        makers["prophet"] = lambda: ProphetModel(step, level)
    unknown = set(names) - set(makers) - {"prophet"}
    if unknown:
        raise ConfigError(f"unknown model(s) {sorted(unknown)}; known: {sorted([*makers, 'prophet'])}")
    order = ["last_value", "seasonal_naive", "seasonal_level", "ets_level", "holt_winters", "prophet"]
    wanted = {"last_value", *names}
    return [makers[name]() for name in order if name in wanted and name in makers]


@dataclass
class Selection:
    """Outcome of model selection on one series.

    model: the chosen model, fitted on the full history. scores: backtest MAE over the steps
    [lead, lead + origin spacing) ahead, per model tried (same unit as the series). log_q: per step ahead (index k-1), the
    upper-quantile offset in log1p space from backtest residuals, or None to keep the model's
    own band. residuals: the backtest residuals per step ahead (log1p space), so the band can be
    calibrated at another level too (``calibrate(forecast, level)``). note: why this model
    (goes into the decision's reason). band: the band conditioned on the reversion feature (None:
    the static ``log_q``); level: the selection's level.
    """

    model: Model
    scores: dict[str, float] = field(default_factory=dict)
    log_q: np.ndarray | None = None
    note: str = ""
    residuals: list[np.ndarray] = field(default_factory=list)
    band: ReversionBand | None = None
    level: float = 0.9

    def calibrate(self, forecast: Forecast, level: float | None = None, history: np.ndarray | None = None) -> Forecast:
        """Replace the model's upper band with the backtest-residual quantile when available:
        at the selection's level (``log_q``), or at ``level`` from the stored residuals; with a
        conditioned ``band`` and the ``history`` the forecast was made on (rates, ``clean``ed),
        that band's offsets for it. Pass the model's own forecast at the same level; it is kept
        when too few residuals exist."""
        if self.band is not None and history is not None:
            log_q = self.band.log_offsets(history, self.level if level is None else level)
        else:
            log_q = self.log_q if level is None or self.log_q is None else _quantiles(self.residuals, level)
        if log_q is None:
            return forecast
        k = min(log_q.size, forecast.mean.size)
        upper = forecast.upper.copy()
        upper[:k] = np.expm1(np.log1p(forecast.mean[:k]) + np.maximum(log_q[:k], 0.0))
        if forecast.mean.size > k:  # beyond the calibrated steps keep the last step's offset
            upper[k:] = np.expm1(np.log1p(forecast.mean[k:]) + max(log_q[-1], 0.0))
        return Forecast(forecast.mean, np.maximum(upper, forecast.mean))


def _quantiles(usable: list[np.ndarray], level: float) -> np.ndarray:
    """Per-step ``level`` quantiles of residuals; per-step quantiles from a few origins are
    noisy, so the band never narrows with the horizon."""
    return np.maximum.accumulate(np.array([np.quantile(r, level) for r in usable]))


def select(
    y: np.ndarray,
    horizon: int,
    lead_steps: int,
    candidates: list[Model],
    level: float = 0.9,
    budget_s: float = 5.0,
    max_origins: int = 144,
    span: int | None = None,
    band_window: int = 0,
    band_scale: bool = False,
) -> Selection:
    """Choose a model for ``y`` (rates per step, NaN allowed) and fit it on the full history.

    horizon: steps forecast (>= lead_steps >= 1). span: steps the backtest origins should
    cover (e.g. one season, so a daily shape is judged over a whole day and not only its last
    hours); at most ``max_origins`` origins, spaced evenly (None: the last ``max_origins``
    steps, every one), and spaced only as far as the history fills them all. Short history (too little for MIN_ORIGINS backtest origins) gives last
    value with a note saying so. Candidates after the budget is spent are skipped (and named in
    the note). band_window: buckets of the trailing span the band is conditioned on (0: one
    band); band_scale: the band is also scaled by that span's volatility (``band.volatility``).
    """
    started = time.monotonic()
    y_clean = clean(y)
    n = y_clean.size
    last = n - lead_steps
    # ceil(span / max_origins), but never so sparse that a short history loses origins
    every = max(1, min(-(-(span or max_origins) // max_origins), (last - MIN_FIT) // max(1, max_origins - 1)))
    first = max(MIN_FIT, last - (max_origins - 1) * every)
    if (last - first) // every + 1 < MIN_ORIGINS:
        need = MIN_FIT + MIN_ORIGINS + lead_steps - 1
        return Selection(
            LastValue().fit(y_clean),
            note=f"short history ({n} buckets, a backtest needs {need}): last-value baseline",
            level=level,
        )
    origins = np.arange(last, first - 1, -every)[::-1]
    # Score the steps [lead, lead + every) ahead of each origin: with origins ``every`` apart,
    # every bucket of the span is then scored once at a horizon the planner acts on. Scoring
    # the lead step alone saw a step change only when an origin fell just before it, so on
    # 1-minute counters the choice flipped with the minute (found in the closed loop).
    scored_end = min(horizon, lead_steps - 1 + every)
    scores: dict[str, float] = {}
    residuals: dict[str, list[list[float]]] = {}
    skipped: list[str] = []
    for model in candidates:
        over = time.monotonic() - started > budget_s
        if model.name != "last_value" and (over or (model.name == "prophet" and budget_s < PROPHET_MIN_BUDGET_S)):
            skipped.append(model.name)
            continue
        model.fit(y_clean[: origins[0]])
        per_step: list[list[float]] = [[] for _ in range(horizon)]
        errors: list[float] = []
        for o in origins:
            fc = model.forward(y_clean[:o], horizon, level)
            steps = min(horizon, n - o)
            actual = y_clean[o : o + steps]
            for k in range(steps):
                per_step[k].append(float(np.log1p(actual[k]) - np.log1p(fc.mean[k])))
            hi = min(scored_end, steps)
            errors.extend(np.abs(actual[lead_steps - 1 : hi] - fc.mean[lead_steps - 1 : hi]).tolist())
        scores[model.name] = float(np.mean(errors))
        residuals[model.name] = per_step
    best = min(scores, key=lambda name: scores[name])
    if scores[best] > (1 - MARGIN) * scores["last_value"]:
        best = "last_value"
    chosen = next(m for m in candidates if m.name == best)
    chosen.fit(y_clean)
    per_step = residuals[best]
    log_q = None
    band = None
    usable: list[np.ndarray] = []
    if len(per_step[0]) >= MIN_CALIBRATION:
        usable = [np.asarray(r) for r in per_step if len(r) >= MIN_CALIBRATION]
        log_q = _quantiles(usable, level)
        features = np.array([reversion_feature(y_clean[:o], band_window) for o in origins])
        scales = np.array([volatility(y_clean[:o], band_window) for o in origins]) if band_scale else None
        band = fit_reversion_band(per_step, features, band_window, MIN_CALIBRATION, scales)
    ratio = scores[best] / scores["last_value"] if scores["last_value"] > 0 else 1.0
    note = f"{best} chosen by backtest over {origins.size} origins (MAE {ratio:.2f}x last value)"
    if skipped:
        note += f"; time budget skipped {', '.join(skipped)}"
    if band is not None:
        note += f"; band conditioned on the last {band_window} buckets' mean"
        note += " and scaled by their volatility" if band.scale_range is not None else ""
    return Selection(chosen, scores, log_q, note, usable, band, level)
