"""Forecaster settings (pydantic-settings).

Environment: ``PROMPTEDGE_REDIS_URL`` (shared with the router) and ``PROMPTEDGE_FORECASTER_*``
for everything else, e.g. ``PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA=2.5``. Lists and mappings
are JSON (``PROMPTEDGE_FORECASTER_MODELS='["last_value","holt_winters","prophet"]'``,
``PROMPTEDGE_FORECASTER_POPS='{"paris": "redis://redis.paris:6379/0", "nyc": "redis://redis.nyc:6379/0"}'``).
A value that does not validate is reported by its setting's name, never repeated (a Redis URL
may hold a password).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, PositiveFloat, PositiveInt, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from forecaster.clock import SimClock
from forecaster.plan import PLANNER_DEFAULTS as _PLAN
from forecaster.plan import PlannerConfig
from opskit import FileSettings, LogFormat, RedisURL

# A POP name (``pops``' keys): it appears in log lines, hold reasons and error messages.
POP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
DEFAULT_PROMETHEUS_URL = "http://127.0.0.1:9090"
NO_HOST = "the Redis URL has no host (redis://host:port/db); redis-py would read localhost"


def has_host(url: str) -> bool:
    """False for a one-server Redis URL with an empty host (``redis://:6379/0``,
    ``redis://:pw@/0``), which redis-py reads as localhost; True otherwise (``unix://`` has a
    path instead; a Cluster or Sentinel URL without a host fails its own check). Pure."""
    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "rediss"):
        return True
    try:
        return bool(urlsplit(url).hostname)
    except ValueError:  # not a URL at all: the RedisURL check says so
        return True


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: a JSON object whose keys are all different (json.loads
    itself keeps the last of a repeated key in silence)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:  # a key that is no POP name (a URL pasted as one) is not repeated
            raise ValueError(f"POP {key if POP_NAME.fullmatch(key) else '(a bad name)'} is named twice")
        seen[key] = value
    return seen


# The planner's knobs take their defaults from PlannerConfig (forecaster/plan.py
# ``PLANNER_DEFAULTS``), where they are defined once for the settings, the backtest, the CLI and
# the bench.
class ForecasterSettings(FileSettings):
    """All forecaster knobs; units in the field names (``_s`` seconds)."""

    model_config = SettingsConfigDict(
        env_prefix="PROMPTEDGE_FORECASTER_", extra="ignore", populate_by_name=True, hide_input_in_errors=True
    )

    redis_url: RedisURL = Field(  # one server, Redis Cluster or Sentinel (opskit/_redis_url.py)
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("PROMPTEDGE_REDIS_URL", "PROMPTEDGE_FORECASTER_REDIS_URL"),
    )
    # Several POPs, each router counting into its own Redis: POP name -> Redis URL (env: a JSON
    # object). Their counters are summed per minute, a minute known only when every POP counted
    # it (forecaster/sources/pops.py); redis_url then keeps only the planner state. Empty: the
    # counters are read from redis_url. NoDecode: _pops_json decodes the environment's JSON
    # itself, to refuse a repeated name (json.loads keeps the last).
    pops: Annotated[dict[str, RedisURL], NoDecode] = Field(default_factory=dict)
    # Source of demand: the router's Redis counters or a Prometheus query_range. "auto": Prometheus
    # when prometheus_url is set, else the router's counters; so a vLLM Deployment without the
    # PromptEdge router needs only the Prometheus URL (and the Deployment's name, an actuator
    # setting) with the default query below (docs/advisory.md, "Demand from any stack").
    source: Literal["auto", "redis", "prometheus"] = "auto"
    model_name: str | None = None  # the router's model/pool; None = sum over all models
    prometheus_url: str | None = None  # None: http://127.0.0.1:9090 when source is prometheus
    # Requests/s that reach the GPUs; vLLM >= 0.10 counts finished requests in this counter. The
    # queries for llm-d's gateway and vLLM's production-stack router: forecaster/sources/stacks.py.
    prometheus_query: str = "sum(rate(vllm:request_success_total[1m]))"
    source_timeout_s: PositiveFloat = 5.0  # bound on every source call
    trace_tz: str = "UTC"  # time zone of naive timestamps in trace files
    log_format: LogFormat = "json"  # stderr lines as JSON objects (opskit); "text" for a terminal

    step_s: PositiveFloat = 60.0
    # Demand is the mean rate over this trailing window (s), as PromQL's rate(x[5m]), before it
    # is forecast and before the reactive floor reads it; <= step_s: each bucket as counted. At
    # most an hour (inf included): a longer mean flattens the daily peak it should forecast.
    rate_window_s: float = Field(300.0, ge=0.0, le=3600.0)
    history_s: PositiveFloat = 14 * 86400.0
    horizon_s: PositiveFloat = 1800.0
    # Upper quantile of the forecast band the planner provisions for (calibrated on backtest
    # residuals), with ``upper_headroom`` over it; chosen on the backtest's tuning days
    # (README, "Measured").
    level: float = Field(0.9, gt=0.5, lt=1.0)
    # The band is conditioned on where the last bucket stands against the mean of this trailing
    # span (s): wider after a dip, narrower after a rise (forecaster/models/band.py); 0 = one band
    # for every origin. Chosen on the backtest's tuning days with ``level`` (README, "Measured").
    band_window_s: float = Field(3600.0, ge=0.0, le=7 * 86400.0)  # at most a week
    # The band is also scaled by the volatility of that span (root mean square of its log
    # changes): wide in a restless hour, narrow in a calm one; chosen with ``level``.
    band_scale: bool = True
    models: list[str] = ["last_value", "seasonal_naive", "seasonal_level", "ets_level", "holt_winters"]
    time_budget_s: PositiveFloat = 5.0  # model selection budget per run
    # The daemon keeps its model choice this long (simulated s) and carries the chosen model over
    # newer buckets in between, as the backtest does between refits; 0 = choose at every run.
    reselect_s: float = Field(3600.0, ge=0.0)
    season_s: PositiveFloat = 86400.0

    demand_unit: Literal["requests", "tokens"] = "requests"
    capacity_per_replica: PositiveFloat = _PLAN.capacity_per_replica  # in the demand unit per second
    headroom: float = Field(_PLAN.headroom, ge=0.0)  # over the mean forecast and the current demand
    upper_headroom: float = Field(_PLAN.upper_headroom, ge=0.0)  # over the upper quantile
    min_replicas: int = Field(_PLAN.min_replicas, ge=0)
    max_replicas: PositiveInt = _PLAN.max_replicas
    warmup_s: float = Field(_PLAN.lead_time_s, ge=0.0)  # lead time when none is measured from pods
    # Added to the lead time: from the decision to the Pod's creation (scale patch, Deployment
    # and ReplicaSet controllers), which the warm-up (pod creation -> Ready) does not include.
    actuation_delay_s: float = Field(15.0, ge=0.0)
    up_cooldown_s: float = Field(_PLAN.up_cooldown_s, ge=0.0)
    down_cooldown_s: float = Field(_PLAN.down_cooldown_s, ge=0.0)  # HPA's default scale-down stabilisation
    max_step: PositiveInt = _PLAN.max_step  # the most replicas one decision adds
    # The most one decision removes, as a share of the current replicas (at least one replica;
    # issue 31: a first decision read demand as 0 and took a pool 4 -> 1, ten minutes of
    # warm-ups to come back). A share, not a count: 2 a minute held a pool of hundreds up for an
    # hour after each peak (ServeGen m-large at 2 req/s a replica: 1.165x the oracle, 1.095x
    # uncapped); 0.5 halves it at most per decision.
    max_scale_down_fraction: float = Field(_PLAN.max_scale_down_fraction, gt=0.0, le=1.0)

    # Scheduling; what is scaled and how is forecaster.actuate's (PROMPTEDGE_ACTUATOR_*).
    daemon_interval_s: PositiveFloat = (
        _PLAN.decision_interval_s
    )  # also the cron interval the planner assumes (simulated s)
    # Simulated clock, same semantics as the router's: origin + (time.time() - origin) * scale.
    clock_origin: float | None = None  # Unix s; None = when the process starts
    clock_scale: PositiveFloat = 1.0  # simulated seconds per wall second
    # The daemon serves its Prometheus metrics (holds, desired replicas) here; 0 = off.
    metrics_port: int = Field(9464, ge=0, le=65535)

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_http_url(cls, url: str | None) -> str | None:
        # "banana" would otherwise surface only at the first query, as "Prometheus could not
        # answer" in every cycle; the value is not echoed (it may carry a password).
        if url is None:
            return url
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host (e.g. http://prometheus:9090)")
        return url

    @field_validator("pops", mode="before")
    @classmethod
    def _pops_json(cls, value: Any) -> Any:
        if not isinstance(value, (str, bytes)):  # the settings file's mapping, or an argument
            return value
        try:
            return json.loads(value, object_pairs_hook=_unique_pairs)
        except json.JSONDecodeError as exc:  # its message quotes no input
            raise ValueError(f"not JSON: {exc.msg} at character {exc.pos}") from None

    @field_validator("pops")
    @classmethod
    def _pop_names(cls, pops: dict[str, str]) -> dict[str, str]:
        seen: dict[str, str] = {}
        for name, url in pops.items():
            if not POP_NAME.fullmatch(name):
                raise ValueError(f"bad POP name {name[:40]!r} (letters, digits, '.', '_', '-'; at most 63)")
            if not has_host(url):
                raise ValueError(f"POP {name}: {NO_HOST}")
            # the same Redis listed twice would count its demand twice (attack round: 100 copies
            # of one POP read 100x the demand); the URL is compared as written, never printed
            key = url.strip().lower()
            if key in seen:
                raise ValueError(f"POPs {seen[key]} and {name} name the same Redis URL")
            seen[key] = name
        return pops

    @model_validator(mode="after")
    def _pops_are_redis(self) -> ForecasterSettings:
        if self.source == "auto":  # resolved once: the rest of the code sees redis or prometheus
            self.source = "prometheus" if self.prometheus_url and not self.pops else "redis"
        if self.source == "prometheus" and not self.prometheus_url:
            self.prometheus_url = DEFAULT_PROMETHEUS_URL
        if self.pops and self.source != "redis":
            raise ValueError("pops are read as Redis counters; they need source 'redis'")
        return self

    def clock(self) -> SimClock:
        """The clock every "now" of this process comes from (forecaster.clock.SimClock)."""
        return SimClock(self.clock_origin, self.clock_scale)

    def planner(self, lead_time_s: float | None = None) -> PlannerConfig:
        """The planner's view of these settings; ``lead_time_s`` overrides ``warmup_s`` (e.g.
        the warm-up measured from the Deployment's pods); ``actuation_delay_s`` is added to
        either."""
        return PlannerConfig(
            capacity_per_replica=self.capacity_per_replica,
            headroom=self.headroom,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            lead_time_s=(self.warmup_s if lead_time_s is None else lead_time_s) + self.actuation_delay_s,
            up_cooldown_s=self.up_cooldown_s,
            down_cooldown_s=self.down_cooldown_s,
            max_step=self.max_step,
            max_scale_down_fraction=self.max_scale_down_fraction,
            decision_interval_s=self.daemon_interval_s,
            upper_headroom=self.upper_headroom,
        )
