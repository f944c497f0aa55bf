"""Every query of the Grafana dashboard returns data from a real Prometheus (Debian's
``prometheus``) scraping a running router (``python -m router serve``), a simulated vLLM
replica (``python -m sim serve``) and the forecaster's metrics, while requests flow; so does
the forecaster's default Prometheus query. A query
that returns nothing here would show "No data" on every real deployment too (a label the code
does not set, a ratio whose numerator has no series yet)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from prometheus_client import start_http_server

from forecaster import ForecasterSettings, run_once
from forecaster.series import Traffic
from tests.deploy.test_deploy_monitoring import panel_exprs
from tests.forecaster.test_run_metrics import Fixed
from tests.router.router_process import free_port, start_router
from tests.sim.replica_process import start_replica

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="no prometheus on PATH (Debian: apt-get install prometheus)"
)

# Queries that cannot have data in a test of seconds, and why.
NO_DATA_HERE = {
    "offset 5m": "reads the forecast made one lead time (5 min) before now",
    "vllm:time_per_output_token_seconds_bucket": "vLLM's inter-token latency histogram: sim/ does not export it",
}
DEADLINE_S = 40.0


def expected_to_have_data(expr: str) -> bool:
    return not any(marker in expr for marker in NO_DATA_HERE)


@pytest.fixture
def forecaster_metrics() -> Iterator[int]:
    """The forecaster's series (default registry) after one hold and one planned run, served
    on a free port as the daemon serves them."""
    from forecaster.actuate import ActuationResult
    from forecaster.advisory.observe import record_cycle

    settings = ForecasterSettings(redis_url="redis://127.0.0.1:1/0", models=["last_value"])
    run_once(settings, Fixed(None), now=6000.0)
    result = run_once(settings, Fixed(Traffic(0.0, 60.0, np.full(30, 3.0))), now=1800.0)
    # the daemon's cycle also sets the desired-against-actual gauges (advisory mode, the
    # default, reading a Deployment with 2 replicas, 1 Ready); run alone, without the daemon's
    # module imported, their panels had no series
    seen = ActuationResult("advisory", "vllm", result.decision.replicas, 2, "none", "advisory", ready=1)
    record_cycle(result, seen, "req/s", None)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    yield port
    server.shutdown()
    thread.join(timeout=5)


def _prometheus(tmp_path: Path, targets: dict[str, tuple[int, dict[str, str]]]) -> tuple[subprocess.Popen[bytes], str]:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}]}
            for job, (port, labels) in targets.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"prometheus did not start: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")


def _traffic(router_url: str, stop: threading.Event) -> None:
    """Requests until ``stop``: one prompt again and again (exact hits) and new ones (misses)."""
    with httpx.Client(base_url=router_url, timeout=30) as client:
        i = 0
        while not stop.is_set():
            text = "same question" if i % 2 else f"question {i}"
            client.post(
                "/v1/chat/completions",
                json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]},
            )
            i += 1


def test_every_dashboard_query_returns_data(tmp_path: Path, redis_url: str, forecaster_metrics: int) -> None:
    replica_port = free_port()
    replica = start_replica(replica_port, "--model", "m", "--time-scale", "50")
    router = None
    prometheus = None
    stop = threading.Event()
    try:
        router = start_router(
            tmp_path,
            {
                "PROMPTEDGE_REDIS_URL": redis_url,
                "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
                "PROMPTEDGE_ROUTER_HEALTH_INTERVAL_S": "0.5",
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": f"http://127.0.0.1:{replica_port}", "model": "m"}]),
            },
        )
        prometheus, url = _prometheus(
            tmp_path,
            {
                "promptedge-router": (router.port, {"pod": "router-0"}),
                "promptedge-vllm": (replica_port, {"pod": "vllm-0", "pool": "m"}),
                "promptedge-forecaster": (forecaster_metrics, {}),
            },
        )
        sender = threading.Thread(target=_traffic, args=(router.url, stop), daemon=True)
        sender.start()
        # ... and the forecaster's default Prometheus source query (vLLM's request counter).
        forecaster_query = ForecasterSettings.model_fields["prometheus_query"].default
        queries = [e for e in panel_exprs() if expected_to_have_data(e)] + [forecaster_query]
        empty = set(queries)
        deadline = time.monotonic() + DEADLINE_S
        while empty and time.monotonic() < deadline:
            for expr in sorted(empty):
                answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
                assert answer["status"] == "success", answer
                if answer["data"]["result"]:
                    empty.discard(expr)
            time.sleep(1.0)
        assert not empty, f"no data from {len(empty)} of {len(queries)} queries: {sorted(empty)}"
        assert len(queries) >= len(panel_exprs()) - 2
    finally:
        stop.set()
        for proc in (prometheus, replica):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        if router is not None:
            router.stop()
