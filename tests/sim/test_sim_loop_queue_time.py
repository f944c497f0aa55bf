"""The loop's queue time from per-Pod histogram scrapes (pure: no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from sim.loop.observe import metrics_targets, scrape_queue_time
from sim.loop.queue_time import (
    HistogramTotals,
    Scrape,
    bucket_quantile,
    deltas,
    parse_histogram,
    queue_time_minutes,
    queue_time_total,
)
from sim.replica.metrics import QUEUE_BUCKETS, ReplicaMetrics

INF = float("inf")


def hist(*observed: float) -> HistogramTotals:
    """The cumulative histogram of these observations on vLLM's queue-time buckets."""
    bounds = (*QUEUE_BUCKETS, INF)
    return HistogramTotals(
        sum(observed), float(len(observed)), tuple((le, float(sum(v <= le for v in observed))) for le in bounds)
    )


def test_parse_reads_the_replicas_own_exposition() -> None:
    metrics = ReplicaMetrics("m", running=lambda: 0, waiting=lambda: 0, kv_usage=lambda: 0)
    for v in (0.1, 0.4, 12.0):
        metrics.queue_time.observe(v)
    got = parse_histogram(metrics.render().decode())
    assert got is not None
    assert got.count == 3 and got.sum == pytest.approx(12.5)
    assert got.buckets == hist(0.1, 0.4, 12.0).buckets
    assert parse_histogram("# no histogram here\nfoo 1\n") is None


def test_parse_sums_the_engines_of_one_replica() -> None:
    text = (
        "\n".join(
            [
                "# TYPE vllm:request_queue_time_seconds histogram",
                *(
                    f'vllm:request_queue_time_seconds_bucket{{engine="{e}",le="{le}"}} {n}'
                    for e in ("0", "1")
                    for le, n in (("0.3", 1), ("+Inf", 2))
                ),
                'vllm:request_queue_time_seconds_sum{engine="0"} 1.5',
                'vllm:request_queue_time_seconds_count{engine="0"} 2',
                'vllm:request_queue_time_seconds_sum{engine="1"} 0.5',
                'vllm:request_queue_time_seconds_count{engine="1"} 2',
            ]
        )
        + "\n"
    )
    assert parse_histogram(text) == HistogramTotals(2.0, 4.0, ((0.3, 2.0), (INF, 4.0)))


def test_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    buckets = ((1.0, 50.0), (2.0, 100.0), (INF, 100.0))
    assert bucket_quantile(0.5, buckets) == pytest.approx(1.0)
    assert bucket_quantile(0.95, buckets) == pytest.approx(1.9)
    assert bucket_quantile(0.25, buckets) == pytest.approx(0.5)  # the first bucket starts at 0
    assert bucket_quantile(0.95, ((1.0, 1.0), (INF, 10.0))) == 1.0  # in +Inf: the last finite bound
    assert bucket_quantile(0.95, ((1.0, 0.0), (INF, 0.0))) is None


def test_pods_appearing_and_disappearing_add_their_own_deltas() -> None:
    a1, a2 = hist(1.0), hist(1.0, 3.0, 3.0)  # pod a: one request before minute 1, two in it
    b1 = hist(0.2, 0.2)  # pod b: first seen in minute 1, two requests
    scrapes = [
        Scrape(-5, "a", hist()),  # the baseline, before the segment: in no minute
        Scrape(30, "a", a1),
        Scrape(70, "a", a2),
        Scrape(75, "b", b1),
        Scrape(130, "b", hist(0.2, 0.2, 0.6)),  # a is gone (scaled down); b served one more
    ]
    rows = queue_time_minutes(scrapes, 3)
    # p95 on vLLM's buckets: 1.0 s lies in (0.8, 1.0], so 0.8 + 0.2 x 0.95
    assert rows[0] == {"mean": 1.0, "p95": pytest.approx(0.99), "requests": 1}
    # a's two 3 s since its last scrape plus b's first scrape counted from zero; rank 3.8 of 4
    # falls in (2.5, 5.0], which holds the last two
    assert rows[1] == {"mean": pytest.approx(1.6), "p95": pytest.approx(2.5 + 2.5 * 1.8 / 2), "requests": 4}
    assert rows[2] == {"mean": 0.6, "p95": pytest.approx(0.5 + 0.3 * 0.95), "requests": 1}
    total = queue_time_total(scrapes)
    assert total["requests"] == 6 and total["mean"] == pytest.approx(8.0 / 6, abs=1e-4)


def test_a_restarted_container_counts_from_zero_not_negative() -> None:
    scrapes = [Scrape(10, "a", hist(1.0, 1.0, 1.0)), Scrape(20, "a", hist(2.0))]  # restart: 3 -> 1
    (_, first), (_, second) = deltas(scrapes)
    assert first.count == 3 and second == hist(2.0)
    # 1, 1, 1, 2: rank 3.8 of 4 in (1.5, 2.0]
    assert queue_time_total(scrapes) == {"mean": 1.25, "p95": pytest.approx(1.5 + 0.5 * 0.8), "requests": 4}


def test_minutes_without_observations_say_none() -> None:
    assert queue_time_minutes([], 2) == [{"mean": None, "p95": None, "requests": 0}] * 2
    steady = [Scrape(10, "a", hist(1.0)), Scrape(70, "a", hist(1.0))]
    assert queue_time_minutes(steady, 2)[1] == {"mean": None, "p95": None, "requests": 0}


def _pod(uid: str, ip: str | None, ready: bool, port: int | None = 8000) -> SimpleNamespace:
    ports = [SimpleNamespace(container_port=port)] if port else None
    return SimpleNamespace(
        metadata=SimpleNamespace(uid=uid),
        spec=SimpleNamespace(containers=[SimpleNamespace(ports=ports)]),
        status=SimpleNamespace(pod_ip=ip, conditions=[SimpleNamespace(type="Ready", status=str(ready))]),
    )


def test_only_ready_pods_with_an_ip_are_scraped_on_their_container_port() -> None:
    pods = [
        _pod("a", "127.0.1.2", True, 9000),
        _pod("b", "127.0.1.3", False),
        _pod("c", None, True),
        _pod("d", "127.0.1.5", True, None),
    ]
    assert metrics_targets(pods) == [("a", "http://127.0.1.2:9000/metrics"), ("d", "http://127.0.1.5:8000/metrics")]


def test_failed_scrapes_are_counted_not_raised() -> None:
    metrics = ReplicaMetrics("m", running=lambda: 0, waiting=lambda: 0, kv_usage=lambda: 0)
    metrics.queue_time.observe(0.5)

    def answer(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host == "10.0.0.1":
            return httpx.Response(200, content=metrics.render())
        if host == "10.0.0.2":
            raise httpx.ConnectError("refused", request=request)
        if host == "10.0.0.3":
            return httpx.Response(503)
        return httpx.Response(200, text="vllm:num_requests_running 0\n")  # no queue histogram

    targets = [(f"p{i}", f"http://10.0.0.{i}:8000/metrics") for i in range(1, 5)]
    with httpx.Client(transport=httpx.MockTransport(answer)) as http:
        scrapes, errors = scrape_queue_time(http, targets, 42.0)
    assert [(s.pod, s.t_s, s.hist.count) for s in scrapes] == [("p1", 42.0, 1.0)]
    assert len(errors) == 3 and "ConnectError" in errors[0] and "503" in errors[1] and "no vllm:" in errors[2]
