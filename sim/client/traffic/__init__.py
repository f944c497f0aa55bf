"""Client traffic with real peaks: arrivals rebuilt from published per-window rate statistics.

Public surface:

- :func:`read_servegen` / :func:`read_nab` -> :class:`RateSeries` (per-window, per-client
  rate, inter-arrival CV and fitted distribution);
- :func:`steepest_ramp` picks a segment with a ramp; :func:`scale_for_peak` rescales volume;
- :func:`generate_arrivals` -> arrival offsets (seconds) of one segment, seeded;
- :class:`TokenSampler` draws (context, generated) token pairs from a real trace;
- :func:`build_segment` ties them into :class:`~sim.client.traces.TraceRequest` rows for the replayer;
- :func:`history_minutes` turns the days before a segment into per-minute counts for the
  router's Redis traffic counters (:mod:`sim.client.traffic.history` writes them).
"""

from sim.client.traffic.arrivals import generate_arrivals, shape_for_cv
from sim.client.traffic.rates import ClientWindow, RateSeries, TrafficFormatError, read_nab, read_rates, read_servegen
from sim.client.traffic.segment import Segment, build_segment, history_minutes, scale_for_peak, steepest_ramp
from sim.client.traffic.tokens import TokenSampler

__all__ = [
    "ClientWindow",
    "RateSeries",
    "Segment",
    "TokenSampler",
    "TrafficFormatError",
    "build_segment",
    "generate_arrivals",
    "history_minutes",
    "read_nab",
    "read_rates",
    "read_servegen",
    "scale_for_peak",
    "shape_for_cv",
    "steepest_ramp",
]
