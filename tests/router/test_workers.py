"""``python -m router serve --workers 2`` as real processes in front of a simulated replica and a
real Redis: both workers answer on the one port, an exact-cache entry stored through one worker
is a hit through the other (and a semantic one, once the other's index copy has followed the
Redis stream), every log line is one JSON object naming the process that wrote it,
and SIGTERM leaves no process behind. Which worker answered is read from the log: the router's
access line carries the request's id and the writing worker's ``pid``."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from uvicorn.config import STARTUP_FAILURE

from router.process.launch import WorkerConfig
from tests.router.router_process import MODEL, RouterProcess, start_replica, start_router

WORKERS = 2
ROUNDS = 12  # bounded tries for the kernel to hand connections to each worker


def wait_until_serving(router: RouterProcess, workers: int, within_s: float = 240.0) -> set[int]:
    """The worker pids once ``workers`` workers have finished their start-up (each loads the
    embedding model: slow on a loaded machine, so a generous bound, not a measurement)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and router.proc.poll() is None:
        text = router.log_text()
        if text.count("Application startup complete.") >= workers:
            return {int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", text)}
        time.sleep(0.5)
    raise AssertionError(f"{workers} workers did not start:\n{router.log_text()[-5000:]}")


def log_lines(router: RouterProcess) -> list[dict]:
    return [json.loads(line) for line in router.log_text().splitlines() if line.strip()]


def answered_by(router: RouterProcess, request_id: str, within_s: float = 30.0) -> int:
    """The pid of the worker whose access line logged ``request_id`` (written after the answer)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for line in log_lines(router):
            if line.get("logger") == "router.access" and line.get("request_id") == request_id:
                return int(line["pid"])
        time.sleep(0.2)
    raise AssertionError(f"no access line for {request_id}")


def chat(router: RouterProcess, content: str, headers: dict[str, str] | None = None) -> tuple[str, str, int]:
    """One chat completion on a new connection: (x-cache, request id, status)."""
    request_id = uuid.uuid4().hex
    response = httpx.post(
        router.url + "/v1/chat/completions",
        timeout=60,
        headers={"x-request-id": request_id, **(headers or {})},
        json={"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4},
    )
    return response.headers.get("x-cache", ""), request_id, response.status_code


def burst(router: RouterProcess, contents: list[str], headers: dict[str, str] | None = None) -> list[tuple[str, int]]:
    """``contents`` sent at once, each on its own connection: [(x-cache, answering pid)]."""
    with ThreadPoolExecutor(len(contents)) as pool:
        results = list(pool.map(lambda c: chat(router, c, headers), contents))
    assert all(status == 200 for _, _, status in results), results
    return [(cache, answered_by(router, request_id)) for cache, request_id, _ in results]


def test_a_worker_that_fails_its_start_up_checks_exits_with_startup_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # exit 3 makes uvicorn's supervisor stop the router instead of restarting the worker forever
    monkeypatch.setenv("PROMPTEDGE_REDIS_URL", "redis://127.0.0.1:6379/0?socket_timeout=abc")
    config = WorkerConfig(host="127.0.0.1", port=0, workers=2, log_format="json", log_level="info", keepalive_s=5.0)
    root = logging.getLogger()
    handlers, level, on_hangup = list(root.handlers), root.level, signal.getsignal(signal.SIGHUP)
    try:
        with pytest.raises(SystemExit) as exit_:
            config.load()
        err = capsys.readouterr().err
    finally:  # load() configured this process's logging as a worker's
        root.handlers[:] = handlers
        root.setLevel(level)
        signal.signal(signal.SIGHUP, on_hangup)
        logging.captureWarnings(False)
    assert exit_.value.code == STARTUP_FAILURE and not config.loaded
    # said as the log's one JSON line, naming the setting (the supervisor's log is all JSON)
    line = json.loads(err.strip())
    assert "cannot start" in line["message"] and "PROMPTEDGE_REDIS_URL" in line["message"]


@pytest.mark.slow
def test_two_workers_share_the_port_and_the_cache_and_stop_together(tmp_path: Path, redis_url: str) -> None:
    replica, replica_url = start_replica(tmp_path)
    try:
        router = start_router(
            tmp_path,
            env={
                "PROMPTEDGE_REDIS_URL": redis_url,
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": replica_url, "model": MODEL}]),
                "PROMPTEDGE_ROUTER_ANONYMOUS_CACHE": "semantic",
            },
            args=("--workers", str(WORKERS)),
        )
    except BaseException:
        replica.terminate()
        replica.wait(timeout=30)
        raise
    try:
        workers = wait_until_serving(router, WORKERS)
        assert len(workers) == WORKERS and router.proc.pid not in workers
        family = psutil.Process(router.proc.pid).children(recursive=True)
        assert workers <= {p.pid for p in family}

        # both workers answer on the one port
        seen: set[int] = set()
        for round_ in range(ROUNDS):
            seen |= {pid for _, pid in burst(router, [f"spread {round_} {i}" for i in range(8)])}
            if seen == workers:
                break
        assert seen == workers

        # an exact entry stored through one worker is a hit through the other
        first = "How do I turn on the lights in the kitchen?"
        cache, request_id, _ = chat(router, first)
        assert cache == "miss"
        storer = answered_by(router, request_id)
        stored = False  # the store lands after the answer: wait for the storing worker's own hit
        for _ in range(ROUNDS):
            answers = burst(router, [first] * 8)
            stored = stored or any(c == "exact" and pid == storer for c, pid in answers)
            if stored and any(pid != storer for _, pid in answers):
                break
        assert stored, "the first answer was never served from the cache"
        others = [cache for cache, pid in burst(router, [first] * 8) if pid != storer]
        for _ in range(ROUNDS):
            if others:
                break
            others = [cache for cache, pid in burst(router, [first] * 8) if pid != storer]
        assert others and all(cache == "exact" for cache in others), others

        # and its semantic entry reaches the other worker's index copy through the Redis stream
        paraphrase, no_store = "How can I turn on the kitchen lights?", {"cache-control": "no-store"}
        semantic_elsewhere = False
        for _ in range(ROUNDS):
            answers = burst(router, [paraphrase] * 8, no_store)
            semantic_elsewhere = any(c == "semantic" and pid != storer for c, pid in answers)
            if semantic_elsewhere:
                break
        assert semantic_elsewhere

        # a hang-up that reaches the workers (sent to the whole process group) is not theirs:
        # they keep serving; before, each exited at once and the supervisor replaced them
        for pid in workers:
            os.kill(pid, signal.SIGHUP)
        time.sleep(2.0)
        assert all(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in workers)
        assert chat(router, "still there after a hang-up?")[2] == 200

        # SIGTERM to the supervisor stops every worker (and the resource tracker) with it
        family = psutil.Process(router.proc.pid).children(recursive=True)
        router.proc.send_signal(signal.SIGTERM)
        assert router.proc.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(family, timeout=30)
        assert alive == []
    finally:
        router.stop()
        replica.terminate()
        replica.wait(timeout=30)

    # one JSON object per line, each naming its process: the supervisor's and both workers'
    lines = log_lines(router)  # json.loads fails on any other line (a plain-text warning, a traceback)
    assert {line["pid"] for line in lines} == workers | {router.proc.pid}
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]  # access_log is off
    assert sum("Application shutdown complete." in line["message"] for line in lines) == WORKERS


def scrape(router: RouterProcess) -> dict[str, float]:
    """One /metrics scrape on a new connection: sample name (with its labels) -> value."""
    text = httpx.get(router.url + "/metrics", timeout=30).text
    return {
        f"{sample.name}{sorted(sample.labels.items())}": sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[str, float], name: str) -> float:
    return sum(value for key, value in samples.items() if key.startswith(name + "["))


@pytest.mark.slow
def test_metrics_of_two_workers_count_every_workers_requests_on_every_scrape(tmp_path: Path) -> None:
    # Regression: each worker answered /metrics with its own counters only, so one scrape saw one
    # worker's count and the next another's: rate() over them (deploy/ alerts) was garbage.
    router = start_router(
        tmp_path, env={"PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false"}, args=("--workers", str(WORKERS))
    )
    try:
        workers = wait_until_serving(router, WORKERS)
        sent, seen = 0, set()  # requests answered (503: the pool's only replica is the discard port)
        for _round in range(ROUNDS):
            ids = [uuid.uuid4().hex for _ in range(8)]
            with ThreadPoolExecutor(len(ids)) as pool:
                statuses = list(
                    pool.map(
                        lambda i: (
                            httpx.post(
                                router.url + "/v1/chat/completions",
                                headers={"x-request-id": i},
                                timeout=60,
                                json={"model": MODEL, "messages": [{"role": "user", "content": f"count {i}"}]},
                            ).status_code
                        ),
                        ids,
                    )
                )
            assert all(status in (200, 503) for status in statuses), statuses
            sent += len(ids)
            seen |= {answered_by(router, i) for i in ids}
            if seen == workers:
                break
        assert seen == workers  # each worker counted some of them
        for _ in range(8):  # each scrape on a new connection: any worker answers it
            samples = scrape(router)
            assert total(samples, "promptedge_router_requests_total") == sent
            assert total(samples, "promptedge_router_request_seconds_count") == sent
            assert samples["promptedge_router_cache_up[]"] == 1.0  # a gauge: once, not per worker
            assert total(samples, "promptedge_router_replica_up") in (0.0, 1.0)

        # a killed worker's counts stay in the total (a counter never goes down); its live
        # gauges leave with it, and its replacement counts on
        victim = min(workers)
        shared_dir = Path(psutil.Process(victim).environ()["PROMETHEUS_MULTIPROC_DIR"])
        assert shared_dir.is_dir() and "PROMETHEUS_MULTIPROC_DIR" not in os.environ
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 240
        while router.log_text().count("Application startup complete.") < WORKERS + 1:
            assert time.monotonic() < deadline, router.log_text()[-3000:]
            time.sleep(0.5)
        assert not list(shared_dir.glob(f"gauge_live*_{victim}.db"))
        assert list(shared_dir.glob(f"counter_{victim}.db"))
        for _ in range(4):
            samples = scrape(router)
            assert total(samples, "promptedge_router_requests_total") == sent
            assert samples["promptedge_router_cache_up[]"] == 1.0
    finally:
        router.stop()
    assert router.proc.returncode == 0
    assert not shared_dir.exists()  # the supervisor removed it at exit


def metrics_dir(worker: int) -> Path:
    """The shared metrics directory a worker process writes into."""
    return Path(psutil.Process(worker).environ()["PROMETHEUS_MULTIPROC_DIR"])


@pytest.mark.slow
def test_a_sigkilled_supervisors_metrics_directory_is_removed_by_a_later_one_once_unused(tmp_path: Path) -> None:
    # Regression: a supervisor killed with SIGKILL cannot remove its /tmp/promptedge-metrics-*
    # directory, and nothing else ever did (in Kubernetes /tmp is an emptyDir that outlives the
    # container's restarts). Its workers outlive it (router/README.md): while they run, it stays.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false"}
    routers: list[RouterProcess] = []
    orphans: list[psutil.Process] = []
    try:
        killed = start_router(tmp_path, env=env, args=("--workers", str(WORKERS)))
        routers.append(killed)
        orphans = [psutil.Process(pid) for pid in wait_until_serving(killed, WORKERS)]
        killed_dir = metrics_dir(orphans[0].pid)
        assert killed_dir.parent == tmp
        deadline = time.monotonic() + 30  # each worker publishes its gauges every second
        while not all(list(killed_dir.glob(f"*_{p.pid}.db")) for p in orphans):
            assert time.monotonic() < deadline, sorted(killed_dir.iterdir())
            time.sleep(0.2)
        killed.proc.kill()
        killed.proc.wait(timeout=30)
        assert all(p.is_running() for p in orphans)

        live = start_router(tmp_path, env=env, args=("--workers", str(WORKERS)))
        routers.append(live)
        live_dir = metrics_dir(min(wait_until_serving(live, WORKERS)))
        assert killed_dir.is_dir()  # its orphaned workers still serve and write into it

        for orphan in orphans:
            orphan.kill()
        assert psutil.wait_procs(orphans, timeout=30)[1] == []
        later = start_router(tmp_path, env=env, args=("--workers", str(WORKERS)))
        routers.append(later)
        wait_until_serving(later, WORKERS)
        assert not killed_dir.exists()  # every process that used it is gone
        assert live_dir.is_dir()  # a running router's is never touched
    finally:
        for router in routers:
            router.stop()
        for orphan in orphans:
            if orphan.is_running():
                orphan.kill()
    assert list(tmp.glob("promptedge-metrics-*")) == []  # the others removed their own at exit
