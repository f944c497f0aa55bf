"""Advisory mode and the what-if report: the forecaster decides and records but never scales,
and ``python -m forecaster report`` tells what would have happened had it been in control.

- record.py: one Observation per cycle (decision, Ready and spec replicas, demand) in Redis;
- observe.py: the desired-against-actual gauges and the per-cycle record;
- whatif.py (pure): the emulated Deployment under the decisions, scored against the cluster;
- report.py: the report (JSON, text) from the records and Prometheus; plot.py: its PNG.
"""
