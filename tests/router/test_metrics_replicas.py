"""The per-replica series of the router's ``/metrics`` text (no services): each exposed once, and
gone from it once discovery removed the replica, in one process and under ``--workers N``
(prometheus_client's multiprocess mode, router/observe/metrics_shared.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import values

from router import ReplicaSpec
from router.discovery import DiscoveredReplica, apply
from router.dispatch import Weights
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from router.observe.metrics import RouterMetrics
from router.observe.metrics_shared import ENV, forget

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
ROOT = Path(__file__).resolve().parents[2]


def discovered(*urls: str) -> list[DiscoveredReplica]:
    return [DiscoveredReplica(ReplicaSpec(url=url, model="m")) for url in urls]


def samples(metrics: RouterMetrics, url: str) -> list[str]:
    """The sample lines of the exposition labelled with replica ``url``."""
    return [
        line
        for line in metrics.render().decode().splitlines()
        if not line.startswith("#") and f'replica="{url}"' in line
    ]


@pytest.fixture(params=["one process", "workers"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """Run the test in one process, or as a worker of ``--workers N`` (the supervisor's
    environment, and the file-backed values prometheus_client picks at import in a worker)."""
    if request.param == "workers":
        monkeypatch.setenv(ENV, str(tmp_path))
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    yield request.param


def test_each_replica_series_is_exposed_once() -> None:
    # The replica gauges' collector was registered twice in one process: every sample of
    # replica_up, _score, _inflight, scrape_age twice in one scrape (a duplicate series to Prometheus).
    pools = Pools((), HealthConfig())
    apply(pools, discovered(A))
    lines = samples(RouterMetrics(pools, Weights()), A)
    assert lines and len(lines) == len(set(lines)), lines


def test_a_removed_replicas_series_leave_the_exposition(mode: str) -> None:
    pools = Pools((), HealthConfig())
    metrics = RouterMetrics(pools, Weights())
    apply(pools, discovered(A, B))
    metrics.observe_request("m", B, 200, "miss", 0.1, 0.05)
    assert any(line.startswith("promptedge_router_requests_total{") for line in samples(metrics, B))
    metrics.forget_replicas(apply(pools, discovered(A)).removed)  # as the app does (router/app.py)
    assert samples(metrics, B) == [] and samples(metrics, A) != []


def test_a_worker_started_after_a_removal_does_not_show_the_removed_replica(mode: str) -> None:
    # Under --workers N a removed replica's values stay in the shared files (prometheus_client
    # cannot remove them), and only the workers that saw the removal left them out: a worker
    # started later (one replaced after dying, SIGHUP's rolling restart) showed them again, so
    # /metrics grew again with every Pod that ever served.
    pools = Pools((), HealthConfig())
    first = RouterMetrics(pools, Weights())
    apply(pools, discovered(A, B))
    first.observe_request("m", B, 200, "miss", 0.1, 0.05)
    assert samples(first, B) != []  # published (in the files when shared)
    first.forget_replicas(apply(pools, discovered(A)).removed)
    later_pools = Pools((), HealthConfig())
    later = RouterMetrics(later_pools, Weights())
    apply(later_pools, discovered(A))  # the set discovery gives it at start
    later.observe_request("m", "", 200, "exact", 0.01, None)  # a cache hit: no replica
    assert samples(later, B) == [] and samples(later, A) != [] and samples(later, "") != []
    apply(later_pools, discovered(A, B))  # B is back: shown again
    assert samples(later, B) != []


# One worker of ``--workers N`` in its own process over the shared directory: each stdin line is
# the replica set its discovery gives it now (JSON list of URLs); it applies it as the app does,
# counts one request to each of its replicas, answers a scrape and prints the replicas the
# scrape's samples are labelled with.
WORKER = """
import json, sys
from router import ReplicaSpec
from router.discovery import DiscoveredReplica, apply
from router.dispatch import Weights
from router.fleet.health import HealthConfig
from router.observe.metrics import RouterMetrics
from router.fleet.replicas import Pools

pools = Pools((), HealthConfig())
metrics = RouterMetrics(pools, Weights())
for line in sys.stdin:
    urls = json.loads(line)
    metrics.forget_replicas(apply(pools, [DiscoveredReplica(ReplicaSpec(url=u, model="m")) for u in urls]).removed)
    for url in urls:
        metrics.observe_request("m", url, 200, "miss", 0.1, 0.05)
    text = metrics.render().decode()
    print(json.dumps(sorted({part.split('"')[1] for part in text.split('replica=')[1:]})), flush=True)
"""


class Worker:
    """A worker process (:data:`WORKER`) over the multiprocess directory ``shared``."""

    def __init__(self, shared: Path) -> None:
        env = {**os.environ, ENV: str(shared)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER], cwd=ROOT, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def discovers(self, *urls: str) -> set[str]:
        """Give the worker the replica set ``urls``; the replicas its ``/metrics`` answer shows."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(urls) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"worker exited {self.proc.wait()}"
        return set(json.loads(line))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_a_worker_with_no_replicas_does_not_hide_the_other_workers_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each worker left out every series of a replica that it did not discover itself: a worker
    # whose discovery was empty (just started, its source failing) answered its scrapes with no
    # per-replica series at all, the other workers' live ones included.
    one, two = Worker(tmp_path), Worker(tmp_path)
    try:
        assert one.discovers(A, B) == {A, B}
        assert two.discovers() == {A, B}  # two sees nothing: one's replicas are still shown
        assert one.discovers(A) == {A}  # B left the only worker that had it: gone for all
        assert two.discovers() == {A}
        assert two.discovers(B) == {A, B}  # B is back, in another worker
        assert one.discovers() == {B} and two.discovers(B) == {B}  # A left every worker
        assert one.discovers(A) == {A, B}
        one.stop()
        monkeypatch.setenv(ENV, str(tmp_path))  # as the supervisor has it
        forget([one.proc.pid])  # the supervisor, when a worker is gone: its replicas with it
        assert two.discovers(B) == {B}
    finally:
        one.stop()
        two.stop()
