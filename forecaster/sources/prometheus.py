"""Demand from Prometheus ``/api/v1/query_range`` over httpx.

The PromQL (a setting) must return a rate (per second) of the demand, e.g.
``sum(rate(vllm:request_success_total[1m]))``; several returned series are summed. Prometheus
caps a range query at 11,000 points per series, so long histories are read in chunks. A step
with no sample in any series is missing (NaN), never zero. Every request is bounded by
``timeout_s``; network errors, HTTP errors, non-"success" answers and answers not shaped as Prometheus
documents raise SourceUnavailable.
"""

from __future__ import annotations

import math
import time

import httpx
import numpy as np

from forecaster.errors import SourceUnavailable
from forecaster.series import Traffic

MAX_POINTS = 11_000


class PrometheusSource:
    """``query`` evaluated every ``step`` s over [now - history_s, now) at ``url``.

    transport: an httpx transport to use instead of the network (tests, proxies)."""

    def __init__(
        self,
        url: str,
        query: str,
        step: float,
        history_s: float,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._client = httpx.Client(base_url=url, timeout=timeout_s, transport=transport)
        self._query = query
        self._step = step
        self._history_s = history_s
        self.name = f"prometheus:{query}"

    def fetch(self, now: float | None = None) -> Traffic:
        """Rates on the grid ending at the last whole step before ``now``."""
        now = time.time() if now is None else now
        end = math.floor(now / self._step) * self._step - self._step
        n = int(self._history_s // self._step)
        start = end - (n - 1) * self._step
        values = np.full(n, np.nan)
        chunk = MAX_POINTS - 1
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            self._read(start + lo * self._step, start + (hi - 1) * self._step, start, values)
        return Traffic(start, self._step, values, name=self.name)

    def _read(self, lo: float, hi: float, origin: float, values: np.ndarray) -> None:
        params = {"query": self._query, "start": lo, "end": hi, "step": self._step}
        try:
            response = self._client.get("/api/v1/query_range", params=params)
            response.raise_for_status()
            body = response.json()
        except httpx.HTTPStatusError as exc:  # its message repeats the URL, password included
            raise SourceUnavailable(f"Prometheus query_range answered HTTP {exc.response.status_code}") from None
        except (httpx.HTTPError, ValueError) as exc:
            raise SourceUnavailable(f"Prometheus query_range failed: {exc}") from None
        try:
            self._add(body, origin, values)
        except (AttributeError, TypeError, ValueError, IndexError, OverflowError) as exc:
            # An answer not shaped as Prometheus documents (a point ["x","y"], a result that is
            # no list): the source cannot answer, the same as a network error, so callers keep
            # their path for an unavailable source instead of a traceback.
            raise SourceUnavailable(f"Prometheus query_range answer malformed: {exc}") from None

    def _add(self, body: object, origin: float, values: np.ndarray) -> None:
        """Sum the matrix answer's finite points into ``values``; raises SourceUnavailable for a
        non-success answer and TypeError/ValueError/... for a malformed one."""
        if not isinstance(body, dict):
            raise TypeError(f"the answer is a JSON {type(body).__name__}, not an object")
        data = body.get("data")
        if body.get("status") != "success" or not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise SourceUnavailable(f"Prometheus answered {body.get('status')}: {body.get('error')}")
        result = data.get("result")
        if not isinstance(result, list):
            raise TypeError(f"data.result is a JSON {type(result).__name__}, not a list")
        for series in result:
            points = series.get("values", [])
            if not isinstance(points, list):
                raise TypeError(f"a series' values is a JSON {type(points).__name__}, not a list")
            for ts, raw in points:
                value = float(raw)
                if not math.isfinite(value):
                    continue
                idx = round((float(ts) - origin) / self._step)
                if 0 <= idx < values.size:
                    values[idx] = value if np.isnan(values[idx]) else values[idx] + value
