"""What is known about one request as it passes, and its accounting when it ends: Prometheus
series and one JSON log line (logger ``router.access``, INFO; built only when enabled)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from router.observe.metrics import RouterMetrics
from router.observe.tracing import record_spans

log = logging.getLogger("router.access")


@dataclass(slots=True)
class Record:
    """One request. Times are ``time.perf_counter()`` seconds; ``cache`` is exact | semantic |
    miss | none (refused before the cache was asked); ``status`` the HTTP status sent (499 if
    the client left)."""

    request_id: str
    started: float
    pool: str = ""
    target: str = ""  # the pool that serves it: ``pool`` or its fallback
    priority: str = "P1"  # the class it is served at (router/forward/classify.py bounded_priority)
    claimed_priority: str = "P1"  # the class its X-Priority asked for (logged when lowered)
    size: str = ""  # prompt size class: short | medium | long
    lane: str = ""  # normal | long in a pool with replicas reserved for long prompts, else ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replica: str = ""
    profile: str = ""
    cache: str = "none"
    status: int = 200
    forwarded_at: float | None = None
    first_byte_at: float | None = None
    retries: int = 0
    deferred: bool = False  # accounted for when the body has been sent (streams, misses)
    demand: bool = True  # counted in the forecaster's traffic counters (not /tokenize, /detokenize)
    api_key: str = ""  # whose token bucket was charged (never logged)
    charged_tokens: int = 0  # what admission took from it: prompt count + output bound; 0 = nothing
    # a replica may have generated for it: set when it is sent, cleared when the replica provably
    # never got it (no connection, 429/503) or refused it (4xx); what is charged stays charged
    may_have_generated: bool = False

    def finish(self, metrics: RouterMetrics, tracer: Tracer | None = None) -> None:
        """Count the request in the metrics, write its log line and spans (call exactly once)."""
        end = time.perf_counter()
        if tracer is not None:
            record_spans(
                tracer,
                {
                    "request_id": self.request_id,
                    "pool": self.target,
                    "lane": self.lane,
                    "replica": self.replica,
                    "cache": self.cache,
                    "status": self.status,
                },
                self.started,
                self.forwarded_at,
                self.first_byte_at,
                end,
            )
        metrics.observe_request(
            self.pool,
            self.replica,
            self.status,
            self.cache,
            end - self.started,
            None if self.first_byte_at is None else self.first_byte_at - self.started,
        )
        if log.isEnabledFor(logging.INFO):
            forwarded = self.forwarded_at or end
            log.info(
                json.dumps(
                    {
                        "request_id": self.request_id,
                        "model": self.pool,
                        "priority": self.priority,
                        "claimed_priority": self.claimed_priority,
                        "size": self.size,
                        "prompt_tokens": self.prompt_tokens,
                        "completion_tokens": self.completion_tokens,
                        "pool": self.target,
                        "lane": self.lane,
                        "replica": self.replica,
                        "profile": self.profile,
                        "cache": self.cache,
                        "status": self.status,
                        "retries": self.retries,
                        "queue_time": round(forwarded - self.started, 6),
                        "inference_time": round(end - forwarded, 6),
                        "ttft": None if self.first_byte_at is None else round(self.first_byte_at - self.started, 6),
                    }
                )
            )
