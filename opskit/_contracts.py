"""What the router and the forecaster share through Redis, defined once (docs/contracts.md).

The two processes import nothing of each other; both import these names, so a key or a field
renamed on one side is renamed on the other. Pure: standard library only, no Redis client.

**Traffic counters** (router writes, forecaster reads, ``sim`` seeds history): one hash per
model and day, ``TRAFFIC_KEY`` (``day`` = Unix minute // 1440), fields ``{minute}:{counter}``
for each counter of ``TRAFFIC_FIELDS`` (``minute`` = Unix s // 60), expiring after
``TRAFFIC_TTL_S``; the models that have counters in the set ``TRAFFIC_MODELS_KEY``. No Redis
Cluster hash tag: each hash is its own slot, and no command touches two.

**The forecast document** (forecaster writes each live cycle, the router's predictive warming
reads): JSON under ``FORECAST_KEY`` (``pool`` = ``ALL_POOLS`` when the forecast sums every
pool), built by :func:`forecast_document` and read back by :func:`read_forecast`, version
``FORECAST_VERSION``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TRAFFIC_KEY = "promptedge:traffic:{model}:{day}"
TRAFFIC_MODELS_KEY = "promptedge:traffic:models"
TRAFFIC_FIELDS = ("requests", "misses", "prompt_tokens", "completion_tokens")
# Each writer's bracket of a minute, ``{minute}:open`` and ``{minute}:partial`` (docs/contracts.md,
# "Only whole minutes are demand"): the reader counts a minute only when open is 0 and partial absent.
TRAFFIC_MARKERS = ("open", "partial")
TRAFFIC_TTL_S = 15 * 86400  # two weeks of history for the weekly season, and a day to spare

FORECAST_KEY = "promptedge:forecaster:forecast:{pool}"
FORECAST_VERSION = 1
ALL_POOLS = "*"  # the pool of a forecast summed over every pool (no model named)
# The largest forecast document read (bytes; the forecaster's is a few kB): parsing a larger one
# would hold the router's event loop (27 MB: 1.7 s) on every warming tick.
MAX_FORECAST_BYTES = 1024 * 1024
_MAX_EPOCH_S = 1e11  # Unix s of the year 5138: a larger time is in milliseconds


def traffic_key(model: str, minute: int) -> str:
    """The counter hash holding Unix minute ``minute`` (Unix s // 60) of ``model``."""
    return TRAFFIC_KEY.format(model=model, day=minute // 1440)


def traffic_field(minute: int, counter: str) -> str:
    """The hash field of one counter (one of ``TRAFFIC_FIELDS`` or ``TRAFFIC_MARKERS``) in Unix minute ``minute``."""
    return f"{minute}:{counter}"


@dataclass(frozen=True)
class Forecast:
    """A published forecast as the router reads it: ``points`` [(Unix s, demand/s)] of the
    mean, ``capacity`` (capacity per replica x decided replicas) in the same unit."""

    pool: str
    at: float
    points: list[tuple[float, float]]
    capacity: float


def forecast_document(
    pool: str,
    at: float,
    capacity_rps: float,
    points: Iterable[tuple[float, float]],
    upper: Iterable[tuple[float, float]],
    unit: str,
) -> dict[str, Any]:
    """The published forecast (pure): ``{"v": 1, "pool", "at" (Unix s, the forecaster's clock),
    "unit" ("requests" or "tokens": demand per second, cache misses when the router counts
    them), "capacity_rps" (capacity per replica x decided replicas, same unit), "points":
    [[step start Unix s, mean demand], ...], "upper": [[start, upper quantile], ...]}``."""
    return {
        "v": FORECAST_VERSION,
        "pool": pool,
        "at": at,
        "unit": unit,
        "capacity_rps": capacity_rps,
        "points": [[t, v] for t, v in points],
        "upper": [[t, v] for t, v in upper],
    }


def read_forecast(raw: str | bytes | None) -> tuple[Forecast | None, str | None]:
    """(the forecast, None) when usable, (None, None) when absent, (None, why) when unusable: of
    another version, malformed, with a NaN, infinite or negative time or value, or times past
    the year 5000 (milliseconds). ``why`` never quotes the document. Never raises: a document
    over ``MAX_FORECAST_BYTES`` is refused before it is parsed (the router parses on its event
    loop), and whatever json / float can raise on a hostile one (an int too large for a float,
    nesting deeper than the recursion limit) is a malformed document."""
    if raw is None:
        return None, None
    if len(raw) > MAX_FORECAST_BYTES:
        return None, f"{len(raw)} bytes, over the {MAX_FORECAST_BYTES} read"
    try:
        doc = json.loads(raw)
        version = doc.get("v")
        if version != FORECAST_VERSION:
            shown = version if isinstance(version, int) else type(version).__name__
            return None, f"version {shown}, not {FORECAST_VERSION}"
        points = [(float(t), float(v)) for t, v in doc["points"]]
        at, capacity = float(doc["at"]), float(doc["capacity_rps"])
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        return None, f"malformed ({exc.__class__.__name__})"
    # NaN fails every comparison (a peak would be seen), inf outranks any capacity; a negative
    # demand or capacity is no forecast either
    if not all(math.isfinite(x) and x >= 0 for x in (at, capacity, *(n for p in points for n in p))):
        return None, "a time, point or capacity_rps not finite and >= 0"
    if max((at, *(t for t, _ in points))) > _MAX_EPOCH_S:
        return None, "times past the year 5000: milliseconds, not Unix seconds?"
    return Forecast(str(doc["pool"]), at, points, capacity), None
