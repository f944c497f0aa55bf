"""What the router tells operators: Prometheus metrics (per worker and shared), OpenTelemetry
spans, per-request records and the per-minute traffic counters the forecaster reads."""
