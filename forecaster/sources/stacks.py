"""PromQL for the demand (requests/s that reach the GPUs) of the stacks people run vLLM in.

Each query returns one rate per second, as ``PROMPTEDGE_FORECASTER_PROMETHEUS_QUERY`` must;
the metric names were checked against each project's source (file and commit below). Narrow a
query to one Deployment's pods with the labels your scrape config adds (e.g. ``{namespace="llm"}``
for a ServiceMonitor); unnarrowed, it sums every series Prometheus holds under that name.

- ``vllm``: vLLM's own server, counter ``vllm:request_success`` exported as
  ``vllm:request_success_total`` (labels ``model_name``, ``engine``, ``finished_reason``),
  incremented once per finished request in ``vllm/v1/metrics/loggers.py``
  (PrometheusStatLogger, vllm-project/vllm at a6f0308cfe806b7731ad4979c9bea6e470c35efd). It is
  the forecaster's default query (forecaster/settings.py). Finished, not arrived: a rate of
  completions lags arrivals by a request's latency, seconds against the minutes planned for.
- ``llm-d``: the gateway's endpoint picker (Gateway API Inference Extension's EPP, which llm-d
  deploys), counter ``inference_model_request_total`` (labels ``model_name``,
  ``target_model_name``), one per request it schedules, in ``pkg/epp/metrics/metrics.go``
  (kubernetes-sigs/gateway-api-inference-extension at 8c7067f3cb96a9828c6308a0f3ec760ef2376f43).
- ``production-stack``: vLLM production stack's router, counter ``vllm:num_incoming_requests``
  exported as ``vllm:num_incoming_requests_total`` (label ``model``), "valid incoming requests
  to router", in ``src/vllm_router/services/metrics_service/__init__.py``
  (vllm-project/production-stack at 0c740a253d0c4673480b932d51b57520a695c926). Counted at the
  router, before any backend: requests refused for want of one count too. The router also
  exports gauges under vLLM's names (``vllm:num_requests_running`` with a ``server`` label):
  do not sum them with the engines' own series.
"""

from __future__ import annotations

STACK_QUERIES: dict[str, str] = {
    "vllm": "sum(rate(vllm:request_success_total[1m]))",
    "llm-d": "sum(rate(inference_model_request_total[1m]))",
    "production-stack": "sum(rate(vllm:num_incoming_requests_total[1m]))",
}
