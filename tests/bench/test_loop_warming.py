"""bench/loop_warming.py's measures (pure): the peak minutes and the lead before them, GPU-seconds
from the replicas' generation counts, and each warming run against its policy's off run."""

from __future__ import annotations

from tests.bench_script import load_bench

bench = load_bench("loop_warming")


def test_peak_minutes_and_the_lead_before_them() -> None:
    # windows of 10 min from the segment start: the last two are within 90 % of the busiest
    found = bench.peak_and_pre([0.7, 0.9, 1.1, 1.5, 1.6], 600.0, 0.0, 45, 15)
    assert found == {"peak": list(range(30, 45)), "pre": list(range(15, 30))}


def test_gpu_seconds_count_replica_generations_and_compare_with_the_off_run() -> None:
    row = {"demand_rps": 1.0, "forwarded_rps": 0.5, "queue_time_s": {"requests": 40}}
    off = {"peak": bench.minutes_sum([row] * 2, [0, 1], 2.0), "pre": bench.minutes_sum([row], [0], 2.0)}
    on_row = {"demand_rps": 1.0, "forwarded_rps": 0.25, "queue_time_s": {"requests": 20}}
    on = {
        "peak": bench.minutes_sum([on_row] * 2, [0, 1], 2.0),
        "pre": bench.minutes_sum([row | {"queue_time_s": {"requests": 50}}], [0], 2.0),
    }
    assert off["peak"] == {
        "requests": 120,
        "hits": 60,
        "hit_ratio": 0.5,
        "client_misses": 60,
        "generations": 80,
        "gpu_s": 160.0,
    }
    off["all"], on["all"] = off["peak"], on["peak"]
    moved = bench.compare({"p:off": off, "p:on": on})["p:on"]
    assert (moved["peak_gpu_s_saved"], moved["pre_gpu_s_added"]) == (80.0, 20.0)
    assert moved["peak_hit_ratio"] == [0.5, 0.75]
