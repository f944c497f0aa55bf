"""Load signals parsed from a replica's Prometheus ``/metrics`` text (pure, no I/O).

Metric names by source (current and older servers, so one router fronts all of them):

- vLLM >= 0.10 (v1 engine): ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc`` (a 0..1 fraction despite the name); vLLM < 0.10 exported
  ``vllm:gpu_cache_usage_perc`` instead (docs.vllm.ai, "Production Metrics").
- SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage`` (0..1).
- llama.cpp server (``--metrics``): ``llamacpp:requests_deferred``,
  ``llamacpp:requests_processing``, ``llamacpp:kv_cache_usage_ratio`` (0..1, older builds).
- KV size: vLLM's info gauge ``vllm:cache_config_info`` (labels: its CacheConfig's fields as
  strings, ``vllm/v1/metrics/loggers.py`` ``log_metrics_info``): ``num_gpu_blocks`` x
  ``block_size`` tokens, summed over engines.
- Generation progress (counters of tokens generated since the server started, router/fleet/progress.py):
  vLLM's ``vllm:generation_tokens_total``, SGLang's ``sglang:generation_tokens_total``,
  llama.cpp's ``llamacpp:tokens_predicted_total``.
- NVIDIA DCGM exporter: ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB),
  ``DCGM_FI_DEV_GPU_UTIL`` (percent), ``DCGM_FI_DEV_GPU_TEMP`` (degrees C).

Counts are summed over label sets (several engines or GPUs per replica); fractions and
temperature take the maximum (the hottest engine/GPU is the one a new request may hit).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio")
_GENERATED = ("vllm:generation_tokens_total", "sglang:generation_tokens_total", "llamacpp:tokens_predicted_total")
_FB_USED, _FB_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
_UTIL, _TEMP = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"
_CACHE_INFO = "vllm:cache_config_info"
_WANTED = (*_WAITING, *_RUNNING, *_KV, *_GENERATED, _FB_USED, _FB_FREE, _UTIL, _TEMP, _CACHE_INFO)
_WANTED_BYTES = tuple(name.encode() for name in _WANTED)


@dataclass(frozen=True, slots=True)
class Signals:
    """One scrape's load signals; None = the replica does not export it.

    waiting/running: requests (count); kv_usage, mem_used, gpu_util: fractions 0..1;
    temp_c: degrees Celsius; kv_capacity_tokens: KV cache size in tokens; generated: tokens
    generated since the server started (a counter: only its moving means anything).
    """

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    mem_used: float | None = None
    gpu_util: float | None = None
    temp_c: float | None = None
    kv_capacity_tokens: float | None = None
    generated: float | None = None

    def merged(self, gpu: Signals) -> Signals:
        """These engine signals completed with a GPU exporter's (memory, utilisation, temperature)."""
        return Signals(
            self.waiting,
            self.running,
            self.kv_usage,
            gpu.mem_used,
            gpu.gpu_util,
            gpu.temp_c,
            self.kv_capacity_tokens,
            self.generated,
        )


def parse_metrics(text: bytes) -> Signals:
    """Parse Prometheus text exposition into :class:`Signals`.

    Only lines of the metrics above are handed to ``prometheus_client.parser`` (a vLLM page is
    mostly histogram buckets the router does not read; filtering first makes a scrape cheap).
    Raises ValueError on malformed lines of those metrics.
    """
    kept = [line for line in text.split(b"\n") if line.startswith(_WANTED_BYTES)]
    values: dict[str, list[float]] = {}
    kv_capacity: float | None = None
    for family in text_string_to_metric_families(b"\n".join(kept).decode() + "\n"):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)
            if sample.name == _CACHE_INFO:
                tokens = _kv_tokens(sample.labels)
                if tokens is not None:
                    kv_capacity = (kv_capacity or 0.0) + tokens

    def total(names: tuple[str, ...]) -> float | None:
        for name in names:
            if name in values:
                return sum(values[name])
        return None

    def peak(names: tuple[str, ...]) -> float | None:
        for name in names:
            if name in values:
                return max(values[name])
        return None

    mem_used = None
    if _FB_USED in values and _FB_FREE in values:
        fractions = [u / (u + f) for u, f in zip(values[_FB_USED], values[_FB_FREE], strict=False) if u + f > 0]
        mem_used = max(fractions) if fractions else None
    util = peak((_UTIL,))
    return Signals(
        waiting=total(_WAITING),
        running=total(_RUNNING),
        kv_usage=peak(_KV),
        mem_used=mem_used,
        gpu_util=None if util is None else util / 100.0,
        temp_c=peak((_TEMP,)),
        kv_capacity_tokens=kv_capacity,
        generated=total(_GENERATED),
    )


def _kv_tokens(labels: dict[str, str]) -> float | None:
    # num_gpu_blocks is "None" until vLLM has profiled memory; anything not a positive count is unknown
    try:
        tokens = int(labels.get("num_gpu_blocks", "")) * int(labels.get("block_size", ""))
    except ValueError:
        return None
    return float(tokens) if tokens > 0 else None
