"""Cache settings (pydantic-settings, environment prefix ``PROMPTEDGE_``)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class CacheSettings(BaseSettings):
    """Settings of the response cache.

    ttl_s: fixed time to live of an entry in seconds (not sliding: a hit never extends it).
    min_ttl_s / max_ttl_s: bounds for a per-request TTL override.
    redis_timeout_s: upper bound on one cache round trip; past it the request is served uncached.
    key_prefix: prefix of every Redis key the cache writes.
    """

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_CACHE_", extra="ignore")

    enabled: bool = True
    ttl_s: int = Field(3600, ge=1)
    min_ttl_s: int = Field(1, ge=1)
    max_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    redis_timeout_s: float = Field(0.05, gt=0)
    key_prefix: str = "promptedge:cache"

    @model_validator(mode="after")
    def _bounds(self) -> "CacheSettings":
        if not self.min_ttl_s <= self.ttl_s <= self.max_ttl_s:
            raise ValueError("cache TTL must satisfy min_ttl_s <= ttl_s <= max_ttl_s")
        return self
