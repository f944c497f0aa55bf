"""Prometheus metrics of a simulated replica, under vLLM's names.

Names, label names (``model_name``, ``engine``), meanings and histogram buckets follow vLLM's
V1 engine logger ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger) as of vLLM 0.11/0.12,
where ``vllm:kv_cache_usage_perc`` (0..1) replaced the deprecated ``vllm:gpu_cache_usage_perc``.
Counters are declared without ``_total``; prometheus_client appends it, as in vLLM.

``vllm:request_queue_time_seconds`` is vLLM V1's ``histogram_queue_time_request`` in the same
``loggers.py``: help text "Histogram of time spent in WAITING phase for request.", the same
buckets as ``vllm:e2e_request_latency_seconds`` (vLLM's ``request_latency_buckets``). vLLM
observes it once per request when the request finishes (``vllm/v1/metrics/stats.py``,
``IterationStats.update_from_finished_request``: ``queued_time = scheduled_ts - queued_ts``,
from entering the waiting queue to being first scheduled).

``vllm:request_success`` (exported as ``vllm:request_success_total``) is the same logger's
``counter_request_success``: "Count of successfully processed requests.", labelled
``model_name``, ``engine`` and ``finished_reason``, one series per reason (``str`` of vLLM's
``FinishReason``: stop, length, abort) created at start, so each reads 0 before its first
request. A simulated completion always ends at ``max_tokens``: ``finished_reason="length"``.
The forecaster's default Prometheus query (``forecaster/settings.py``) reads this counter.

Prefix cache (vLLM V1, same ``loggers.py``): counters ``vllm:prefix_cache_queries`` ("Prefix
cache queries, in terms of number of queried tokens.") and ``vllm:prefix_cache_hits``
("Prefix cache hits, in terms of number of cached tokens."), exported with ``_total``;
queries add every looked-up request's prompt tokens, hits the tokens found cached
(``vllm/v1/core/kv_cache_manager.py``). vLLM V1 exports no hit-rate gauge (V0's
``vllm:gpu_prefix_cache_hit_rate`` is gone; the rate is hits / queries, and V1 prints it
only in its log line), so neither does the sim. ``vllm:cache_config_info`` is V1's info
gauge (always 1) whose labels are the CacheConfig's fields as strings plus ``engine``
(``log_metrics_info``); the sim sets ``block_size``, ``num_gpu_blocks`` and
``enable_prefix_caching``, from which a router reads the KV size (blocks x block size).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# vLLM reuses its request-latency buckets for the queue-time histogram.
QUEUE_BUCKETS = E2E_BUCKETS
LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort")


class ReplicaMetrics:
    """One replica's registry. Gauges are read from the engine at scrape time (no staleness)."""

    def __init__(
        self,
        model_name: str,
        running: Callable[[], float],
        waiting: Callable[[], float],
        kv_usage: Callable[[], float],
        cache_config: dict[str, str] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, LABELS, registry=self.registry).labels(**labels).set_function(fn)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=self.registry
        ).labels(**labels)
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            LABELS,
            registry=self.registry,
        ).labels(**labels)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        ).labels(**labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        ).labels(**labels)
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LABELS,
            buckets=QUEUE_BUCKETS,
            registry=self.registry,
        ).labels(**labels)

        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS,
            registry=self.registry,
        ).labels(**labels)
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            LABELS,
            registry=self.registry,
        ).labels(**labels)
        if cache_config is not None:
            info = {**cache_config, "engine": "0"}
            Gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                tuple(info),
                registry=self.registry,
            ).labels(**info).set(1)

        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=self.registry,
        )
        self.request_success = {reason: success.labels(**labels, finished_reason=reason) for reason in FINISHED_REASONS}

    def render(self) -> bytes:
        """Prometheus text exposition of this replica's metrics."""
        return generate_latest(self.registry)
