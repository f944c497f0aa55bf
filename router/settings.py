"""Router settings (pydantic-settings, env prefix ``PROMPTEDGE_``).

Replica list and clock settings are contracts (docs/contracts.md); everything else has a documented
default. Durations are seconds, fractions are 0..1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from opskit import FileSettings, LogFormat, RedisURL
from router.forward.credentials import SecretRef
from router.process.limits import Limits

Policy = Literal["round_robin", "least_request", "gpu_load", "power_of_two", "prefix_aware", "predicted_ttft"]
Transport = Literal["aiohttp", "httpx"]
# ``router serve --workers``' bound: one process per core of a large node; past it, more
# processes only add Redis connections, scrapes and memory (each loads its own embedding model).
WORKERS_MAX = 64
Discovery = Literal["static", "kubernetes"]


class ReplicaSpec(BaseModel):
    """One upstream OpenAI-compatible server.

    url: base URL without /v1 (e.g. http://127.0.0.1:8001); model: the pool it serves;
    profile: free label for logs (e.g. "a100"); gpu_metrics_url: optional GPU exporter
    (DCGM) /metrics URL for this replica; health_path: probed for readiness (200 = ready;
    vLLM, SGLang and llama.cpp's llama-server serve /health, llama-cpp-python does not:
    use /v1/models there); metrics_path: Prometheus text, None when the server has none
    (dispatch then uses the router's in-flight counts only); role: ``long`` reserves the
    replica for long prompts, ``normal`` (default) takes the rest (router/dispatch/lanes.py);
    backend_key: where the router's key for this replica lives (``{"file": path}`` or
    ``{"env": name}``, router/forward/credentials.py), overriding the pool's ``backend_keys``.
    Unknown fields are errors (a typo must not silently drop a setting), in every source.
    """

    model_config = ConfigDict(extra="forbid")

    url: str
    model: str
    profile: str | None = None
    gpu_metrics_url: str | None = None
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"
    role: Literal["normal", "long"] = "normal"
    backend_key: SecretRef | None = None

    @field_validator("url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("replica url must start with http:// or https://")
        _no_userinfo(value)
        return value.rstrip("/")

    @field_validator("gpu_metrics_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None:
            _no_userinfo(value)
        return value


def _no_userinfo(url: str) -> None:
    """Refuse ``user:pass@`` in a URL: URLs are logged and shown in /metrics; a key belongs in
    ``backend_key`` (the message does not repeat the URL)."""
    if "@" in urlsplit(url).netloc:
        raise ValueError(
            "a replica URL must not carry credentials (user:password@); "
            'give the key as backend_key {"file": ...} or {"env": ...}'
        )


class Timeouts(BaseModel):
    """Upstream timeouts of one priority class, seconds: connect, time to the first byte
    (for a non-stream request: the whole generation), idle gap between stream chunks. An
    unknown field (``ttfb`` for ``ttfb_s``) is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid")

    connect_s: float = Field(2.0, gt=0)
    ttfb_s: float = Field(120.0, gt=0)
    idle_s: float = Field(60.0, gt=0)


class RateLimit(BaseModel):
    """Token buckets of one API key: ``requests_per_s`` with ``burst`` capacity (default
    ceil(requests_per_s)), and ``tokens_per_min`` (prompt estimate + max_tokens per request).
    An unknown field (``rps``) is an error: ignored, it would have meant no limit at all."""

    model_config = ConfigDict(extra="forbid")

    requests_per_s: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1)
    tokens_per_min: int | None = Field(None, ge=1)


DEFAULT_TIMEOUTS = {
    "P0": Timeouts(connect_s=2.0, ttfb_s=300.0, idle_s=120.0),
    "P1": Timeouts(connect_s=2.0, ttfb_s=120.0, idle_s=60.0),
    "P2": Timeouts(connect_s=1.0, ttfb_s=60.0, idle_s=30.0),
}


class CachePolicy(BaseModel):
    """How one pool's answers are cached (router/caching/policy.py; defaults and why: the
    README's Caching policy). cache_sampled: cache answers of sampled requests (temperature
    > 0, no seed, not greedy by top_k 1 or beam search); cache_n: cache answers of ``n`` > 1
    (always as a whole: every choice, or nothing). Unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")

    cache_sampled: bool = True
    cache_n: bool = True


class RouterSettings(FileSettings):
    """All router settings; env names are ``PROMPTEDGE_`` + field name upper-cased.

    ``redis_url`` is shared with cache and forecaster (PROMPTEDGE_REDIS_URL): ``redis://``,
    ``rediss://``, ``unix://`` (one server), ``redis+cluster://host:port[,host:port]`` (Redis
    Cluster) or ``redis+sentinel://host:port[,host:port]/service_name[/db]`` (Sentinel), see
    opskit/_redis_url.py; redis_timeout_s bounds each call of the rate limiter and counters'
    client (socket timeout, s). The rest use the
    ``ROUTER_`` infix (PROMPTEDGE_ROUTER_REPLICAS, ...): docs/configuration.md.
    """

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_ROUTER_", extra="ignore", populate_by_name=True)

    # checked at start-up (opskit.RedisURL): a bad URL is an error naming the setting, never a
    # traceback, and the message never repeats the URL (it may hold a password)
    redis_url: RedisURL = Field("redis://127.0.0.1:6379/0", validation_alias="PROMPTEDGE_REDIS_URL")
    redis_timeout_s: float = 0.25
    replicas: list[ReplicaSpec] = Field(default_factory=list)
    replicas_file: Path | None = None  # YAML replica list (router/discovery/file.py)
    discovery: Discovery = "static"  # kubernetes: EndpointSlices, PROMPTEDGE_ROUTER_K8S_* (router/discovery/kube.py)
    host: str = "127.0.0.1"
    port: int = 8000
    # worker processes serving the port (router/process/launch.py; router/README.md, Workers)
    workers: int = Field(1, ge=1, le=WORKERS_MAX)
    log_format: LogFormat = "json"  # every stderr line one JSON object (opskit); "text" for a terminal
    cache_ttl_s: int | None = None  # None: the cache's own default (PROMPTEDGE_CACHE_TTL_S)
    # pool or "*" -> where the router's key for that pool's replicas lives (router/forward/credentials.py)
    backend_keys: dict[str, SecretRef] = Field(default_factory=dict)
    forward_client_key: bool = False  # send the client's own Authorization to replicas without a backend key
    admin_key: str | None = None  # bearer key for DELETE /cache; None or empty switches the route off
    clock_origin: float | None = None
    clock_scale: float = Field(1.0, gt=0)

    policy: Policy = "predicted_ttft"  # router/dispatch/ttft.py; bench/prefix_dispatch.py (issue 33)
    scrape_interval_s: float = Field(0.25, gt=0)
    health_interval_s: float = Field(1.0, gt=0)
    scrape_timeout_s: float = Field(1.0, gt=0)  # a replica busy generating may answer /metrics late
    stale_after_s: float = Field(1.0, gt=0)
    health_rise: int = Field(1, ge=1)
    health_fall: int = Field(2, ge=1)
    # a replica with open requests and no progress on them (no stream chunk, its generation counter
    # still) for this long takes no new request until it progresses (router/fleet/progress.py); above a
    # long prompt's prefill on a busy replica, below P2's stream idle timeout (30 s)
    stuck_after_s: float = Field(15.0, gt=0, le=600)

    upstream_transport: Transport = "aiohttp"
    timeouts: dict[Literal["P0", "P1", "P2"], Timeouts] = Field(default_factory=dict)
    max_connections: int = Field(1000, ge=1)

    counters_flush_s: float = Field(1.0, gt=0)

    api_keys: dict[str, str] = Field(default_factory=dict)  # API key -> tenant (cache scope)
    # cache for requests without an API key: off | exact (default: no semantic sharing) | semantic
    anonymous_cache: Literal["off", "exact", "semantic"] = "exact"
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)  # API key or "*" -> buckets
    # tenant (api_keys value) or "*" (no key, unmapped keys) -> the highest X-Priority it may claim;
    # a mapped tenant not listed may claim P0, "*" defaults to P1 (router/forward/classify.py bounded_priority)
    max_priority: dict[str, Literal["P0", "P1", "P2"]] = Field(default_factory=dict)
    queue_limit: int = Field(4, ge=1)  # waiting requests that make a replica "saturated"
    max_inflight_per_replica: int | None = Field(None, ge=1)
    fallback: dict[str, str] = Field(default_factory=dict)  # pool -> pool taking its overflow
    cache_policy: dict[str, CachePolicy] = Field(default_factory=dict)  # pool or "*" -> its policy
    response_affinity_ttl_s: int = Field(86400, ge=1)  # how long a Responses API id remembers its replica
    tokenizers: dict[str, Path] = Field(
        default_factory=dict
    )  # pool -> its model's tokenizer.json (router/forward/tokens.py)
    other_paths: Literal["refuse", "forward"] = (
        "refuse"  # paths the router has no route for (router/api/other_paths.py)
    )

    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str | None = None  # OTLP/HTTP traces endpoint (default: the exporter's own)
    prefix_affinity: bool = True
    prefix_chars: int = Field(2048, ge=64)  # characters of prompt that make its prefix key
    prefix_ttl_s: float = Field(120.0, gt=0)  # how long a prefix remembers its replica
    # policy prefix_aware (router/dispatch/prefix_index.py, router/dispatch/choice.py): prompt chunk size in
    # characters, KV size (tokens) assumed for a replica that exports no vllm:cache_config_info
    # (the sim a100 profile's: vLLM on an 80 GB A100 with an 8B model), bonus of a full match
    prefix_chunk_chars: int = Field(256, ge=16, le=65_536)
    prefix_kv_tokens: int = Field(400_000, ge=1)
    prefix_weight: float = Field(12.0, ge=0)
    size_thresholds: tuple[int, int] = (512, 4096)  # prompt tokens: short < a <= medium < b <= long
    limits: Limits = Field(default_factory=Limits)  # JSON; every resource limit (router/process/limits.py)

    @field_validator("api_keys")
    @classmethod
    def _own_tenants(cls, value: dict[str, str]) -> dict[str, str]:
        # "default" is the tenant of requests without a key, "key:..." that of unmapped keys
        # (router/forward/classify.py): a key mapped to one of them would share those clients' entries.
        for tenant in value.values():  # the keys are secrets: never in the message
            if tenant == "default" or tenant.startswith("key:") or not tenant.strip():
                raise ValueError(
                    f"api_keys: a key's tenant cannot be empty, 'default' or start with "
                    f"'key:' (reserved), got {tenant!r}"
                )
        return value

    @field_validator("max_priority")
    @classmethod
    def _bounded_tenants_exist(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        # a misspelled tenant must not silently leave that tenant unbounded; a field validator
        # (api_keys is validated before), so the error's input is this setting, not the keys
        unknown = sorted(set(value) - set((info.data.get("api_keys") or {}).values()) - {"*"})
        if unknown:
            raise ValueError(f"{unknown} are neither '*' nor a tenant of api_keys")
        return value

    @field_validator("timeouts")
    @classmethod
    def _all_priorities(cls, value: dict[str, Timeouts]) -> dict[str, Timeouts]:
        return {**DEFAULT_TIMEOUTS, **value}

    log_requests: bool = True

    def cache_policy_for(self, pool: str) -> CachePolicy:
        """The pool's cache policy: its own entry, else ``"*"``'s, else the defaults."""
        return self.cache_policy.get(pool) or self.cache_policy.get("*") or _DEFAULT_CACHE_POLICY


_DEFAULT_CACHE_POLICY = CachePolicy()
# Settings whose dict keys are API keys (secrets): an error names the setting, never the key.
SECRET_KEYED = ("api_keys", "rate_limits")


def error_location(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as printed at start-up (``rate_limits.<key>.burst``): the
    dotted path, with an API key in a ``SECRET_KEYED`` setting replaced by ``<key>`` (``*``
    is no secret and is kept). loc: pydantic's ``error["loc"]``."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in SECRET_KEYED and parts[1] != "*":
        parts[1] = "<key>"
    return ".".join(parts)
