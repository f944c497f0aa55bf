"""Per-pool settings of predictive warming (``PROMPTEDGE_CACHE_WARMING``, a JSON object of pool or
``"*"`` -> these fields; cache/README.md, "Predictive warming"). Off unless ``enabled``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cache.warming.plan import WarmPolicy


class WarmingSettings(BaseModel):
    """One pool's warming. Unknown fields are errors (a typo must not leave warming on defaults).

    enabled: count this pool's cacheable requests per time-of-day slot, keep their recipes
      (the clients' request bodies, prompts included) for ``history_days + 1`` days, and regenerate
      expired hot entries before forecast peaks. False (default): nothing is recorded or warmed.
    slot_s .. burst: the planner's rules (cache/warming/plan.py ``WarmPolicy``: slot length s,
      earlier days counted, hottest keys considered, days a key must recur on, warm generations
      per minute, lead before the peak slot s, idle pool load, peak fraction of capacity, rise
      over now, bucket size).
    keep_per_slot: keys kept per (day, slot) in Redis, all tenants together, >= top_k: a set
      trimmed to exactly top_k could never admit a newcomer (its first count would always be the
      lowest). Over it, the tenant holding the most keys loses its lowest counts (popularity.py).
    max_recipe_bytes: largest recipe (JSON, the client's body included) kept; a larger request is not
      counted (one surely larger is refused before its recipe is built).
    tick_s: seconds between the warmer's looks at the forecast (router background task).
    replica_slots: requests one replica runs at once at full load (pool load = requests in
      flight or queued / (replicas x replica_slots)); vLLM's ``max_num_seqs`` is the upper end.
    lock_ttl_s: how long one router worker holds the pool's warming lock without renewing it;
      >= 2 x tick_s (its holder renews it every tick, and every lock_ttl_s / 3 during a generation).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    slot_s: int = Field(600, ge=60, le=86400)
    history_days: int = Field(7, ge=1, le=60)
    top_k: int = Field(50, ge=1, le=10_000)
    min_days_seen: int = Field(2, ge=1)
    budget_per_min: float = Field(6.0, ge=0)
    lead_s: int = Field(900, ge=0)
    idle_load: float = Field(0.5, gt=0)
    peak_fraction: float = Field(0.5, ge=0)
    min_rise: float = Field(0.2, ge=0)
    burst: float = Field(1.0, ge=1)
    keep_per_slot: int = Field(100, ge=1, le=100_000)
    max_recipe_bytes: int = Field(16 * 1024, ge=256, le=1024 * 1024)
    tick_s: float = Field(15.0, ge=0.05, le=3600)
    replica_slots: int = Field(8, ge=1)
    lock_ttl_s: int = Field(60, ge=1)

    @model_validator(mode="after")
    def _valid_policy(self) -> WarmingSettings:
        self.policy()  # ValueError names the rule (slot_s divides a day, min_days_seen <= history_days)
        if self.keep_per_slot < self.top_k:
            raise ValueError(f"keep_per_slot {self.keep_per_slot} must be >= top_k {self.top_k}")
        if self.lock_ttl_s < 2 * self.tick_s:  # the holder renews it at least every tick
            raise ValueError(f"lock_ttl_s {self.lock_ttl_s} must be >= 2 x tick_s {self.tick_s}")
        return self

    def policy(self) -> WarmPolicy:
        """The planner's view of these settings."""
        return WarmPolicy(
            slot_s=self.slot_s,
            history_days=self.history_days,
            top_k=self.top_k,
            min_days_seen=self.min_days_seen,
            budget_per_min=self.budget_per_min,
            lead_s=self.lead_s,
            idle_load=self.idle_load,
            peak_fraction=self.peak_fraction,
            min_rise=self.min_rise,
            burst=self.burst,
        )

    @property
    def history_ttl_s(self) -> int:
        """How long counts and recipes are kept after their last write: history_days + 1 days."""
        return (self.history_days + 1) * 86400
