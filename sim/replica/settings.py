"""Settings of a simulated replica (env prefix ``PROMPTEDGE_SIM_``; CLI flags override)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from opskit import FileSettings, LogFormat


class SimSettings(FileSettings):
    """One replica. ``fail_rate``: fraction 0..1 of completion requests answered 500;
    ``hang``: completion requests are held (a stall) until the fault is cleared with
    ``POST /sim/faults``, then served, or until their client leaves;
    ``stream_interval_s``: SSE chunks carry the tokens produced in this many seconds, so a
    streaming client costs one chunk per interval instead of one per engine step;
    ``max_model_len``: most tokens (prompt + max_tokens) of one request, as vLLM's
    ``--max-model-len``; None keeps the profile's (a100 32,768, t4 8,192). It must fit in the
    profile's KV cache (``create_app`` raises ValueError otherwise);
    ``api_key``: as vLLM's ``--api-key``, every ``/v1`` route then needs
    ``Authorization: Bearer <api_key>`` (401 otherwise); ``/health``, ``/metrics`` and
    ``/sim/faults`` stay open, as vLLM leaves its non-``/v1`` routes open; ``time_scale``: simulated seconds per wall second (step times, warm-up and every sleep are divided by it; metrics
    stay in simulated seconds); ``warmup_from``: Unix time (wall seconds) the warm-up counts
    from, e.g. when a node launched the process, so the interpreter's start-up (wall time the
    scale would multiply) is not added to the simulated warm-up; None: from the engine's start;
    ``reasoning_tokens``: the first tokens of every chat answer are reasoning
    (``reasoning_content``, as vLLM with ``--reasoning-parser``), 0 = none;
    ``system_fingerprint``: put on every answer and chunk (None: left out, as vLLM does);
    ``log_format``: json (one object per stderr line) or text;
    ``enable_prefix_caching``: vLLM's automatic prefix caching (on by default, as in vLLM V1;
    ``--no-enable-prefix-caching`` there): a prompt's leading blocks found in the KV cache are
    not prefilled again (sim/replica/latency/prefix.py); ``block_size``: tokens per KV block (vLLM's
    ``--block-size``, default 16, 1..256)."""

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
    api_key: str | None = Field(default=None, min_length=1, repr=False)
    time_scale: float = Field(default=1.0, gt=0)
    warmup_from: float | None = None
    reasoning_tokens: int = Field(default=0, ge=0)
    system_fingerprint: str | None = None
    enable_prefix_caching: bool = True
    block_size: int = Field(default=16, ge=1, le=256)
    log_format: LogFormat = "json"  # stderr lines as JSON objects (opskit); "text" for a terminal
