"""Prophet behind the model interface (optional engine: ``pip install 'promptedge[prophet]'``).

Prophet fits in seconds, not milliseconds, so model selection only tries it when the time
budget allows (see ``select``). ``forward`` refits: Prophet has no cheap state update.
Upper quantile: Prophet's own ``yhat_upper`` at ``interval_width = level``.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pandas as pd

from forecaster.errors import ConfigError
from forecaster.models.base import Forecast, clean

# Prophet's daily + weekly seasonality needs no more than a few weeks of recent history.
FIT_WINDOW_S = 21 * 86400


class ProphetModel:
    """Prophet on log1p(y) with daily seasonality; ``step`` is the bucket length in s."""

    name = "prophet"

    def __init__(self, step: float, level: float = 0.9) -> None:
        try:
            from prophet import Prophet  # noqa: F401  (heavy import, only when used)
        except ImportError:
            raise ConfigError("model 'prophet' needs the prophet package: pip install 'promptedge[prophet]'") from None
        for noisy in ("cmdstanpy", "prophet"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        self.step = step
        self._level = level
        self._model: object | None = None
        self._n = 0

    def _frame(self, n: int, offset: int = 0) -> pd.DataFrame:
        index = np.arange(offset, offset + n)
        return pd.DataFrame({"ds": pd.to_datetime(index * self.step, unit="s")})

    def fit(self, y: np.ndarray) -> ProphetModel:
        from prophet import Prophet

        y = clean(y)[-int(FIT_WINDOW_S // self.step) :]
        frame = self._frame(y.size)
        frame["y"] = np.log1p(y)
        model = Prophet(
            interval_width=self._level,
            daily_seasonality=y.size * self.step >= 2 * 86400,
            weekly_seasonality=y.size * self.step >= 14 * 86400,
            yearly_seasonality=False,
            uncertainty_samples=200,
        )
        with warnings.catch_warnings():  # pandas deprecations inside prophet, not ours to fix
            warnings.simplefilter("ignore")
            self._model = model.fit(frame)
        self._n = y.size
        return self

    def predict(self, h: int, level: float = 0.9) -> Forecast:
        if level != self._level:  # the interval width is fixed at fit time in Prophet
            raise ConfigError(f"prophet was fitted for level {self._level}, asked {level}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = self._model.predict(self._frame(h, self._n))  # type: ignore[attr-defined]
        mean = np.maximum(np.expm1(out["yhat"].to_numpy()), 0.0)
        upper = np.maximum(np.expm1(out["yhat_upper"].to_numpy()), mean)
        return Forecast(mean, upper)

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast:
        return ProphetModel(self.step, level).fit(y).predict(h, level)
