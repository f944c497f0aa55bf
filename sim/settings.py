"""Settings of a simulated replica (env prefix ``PROMPTEDGE_SIM_``; CLI flags override)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SimSettings(BaseSettings):
    """One replica. ``fail_rate``: fraction 0..1 of completion requests answered 500;
    ``hang``: completion requests never answer (for router timeout tests);
    ``stream_interval_s``: SSE chunks carry the tokens produced in this many seconds, so a
    streaming client costs one chunk per interval instead of one per engine step;
    ``max_model_len``: most tokens (prompt + max_tokens) of one request, as vLLM's
    ``--max-model-len``; None keeps the profile's (a100 32,768, t4 8,192). It must fit in the
    profile's KV cache (``create_app`` raises ValueError otherwise); ``time_scale``: simulated
    seconds per wall second (step times, warm-up and every sleep are divided by it; metrics
    stay in simulated seconds)."""

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_SIM_")

    host: str = "127.0.0.1"
    port: int = 8001
    model: str = "sim-llama-8b"
    profile: str = "a100"
    warmup_s: float = Field(default=0.0, ge=0)
    fail_rate: float = Field(default=0.0, ge=0, le=1)
    hang: bool = False
    stream_interval_s: float = Field(default=0.05, gt=0)
    seed: int = 0
    max_model_len: int | None = Field(default=None, ge=1)
    time_scale: float = Field(default=1.0, gt=0)
