"""Router overhead: added latency and max throughput of proxies in front of one fast backend.

    python bench/router_overhead.py [--json PATH] [--duration S] [--repeat N] [--systems a,b,...] [--workers 1,2,4]
    python bench/router_overhead.py scrape-cost [--replicas 4] [--seconds 20]   # CPU of /metrics polling

Every system runs as its own process in front of the same minimal OpenAI-compatible backend
(an asyncio + httptools server answering a fixed chat.completion in microseconds), loaded by
wrk (non-stream chat completions, keep-alive) at concurrency 1 and 32:

- ``direct``: wrk -> backend (the baseline every "added" number is relative to);
- ``promptedge``: the router, proxy path (every request a cache miss: unique bodies), exact
  cache lookup + store and load-aware dispatch on, httpx on the aiohttp transport, semantic
  cache off;
- ``promptedge_semantic``: the same with the semantic cache on (an embedding per miss);
- ``promptedge_httpx_transport``: the same with httpx's own transport;
- ``promptedge_no_cache``: the proxy path with the cache switched off (diagnosis);
- ``promptedge_no_store``: the proxy path, every request sent with ``Cache-Control: no-store``:
  looked up but not stored (diagnosis: against ``promptedge``, what the store costs; against
  ``promptedge_no_cache``, what the lookup costs);
- ``promptedge_wN`` (``--workers 1,N,...``, when ``promptedge`` is measured): the proxy path
  served by ``router serve --workers N``; CPU is summed over the supervisor and its N workers,
  which are started and quiet before the first run (:func:`wait_settled`);
- ``promptedge_hit_path``: the router answering one cached request from Redis;
- ``nginx``: Debian's nginx as a plain reverse proxy (1 worker, upstream keep-alive);
- ``aiohttp_passthrough``: FastAPI on uvicorn (uvloop, httptools) forwarding with one
  aiohttp ClientSession, nothing else;
- ``httpx_passthrough``: the same with httpx's API on the router's transport (httpx-aiohttp):
  what keeping httpx's API costs before the router does anything;
- ``litellm``: LiteLLM's proxy (``litellm --config``), if ``--litellm BIN`` exists.

Added latency = system p50/p99 minus direct p50/p99 at the same concurrency (wrk's HdrHistogram,
microsecond resolution). CPU ms/request = user + system CPU time the system's processes (and
their children) spent during the run, per request: unlike latency it barely depends on how
busy the rest of the machine is. Needs ``wrk`` (and ``nginx`` for its row) on PATH and a Redis (``--redis-url``).
Writes one JSON object per system: added_p50_ms, added_p99_ms, max_rps, and the raw runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import typer
import uvicorn
from fastapi import FastAPI, Request, Response

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MODEL = "bench-model"
BENCH_KEY = "sk-bench-0123456789abcdef0123456789abcdef"  # LiteLLM's proxy refuses to start without one
app = typer.Typer(add_completion=False, no_args_is_help=False)

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Paris is the capital of France."},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }
).encode()
METRICS = (
    b'vllm:num_requests_running{model_name="bench-model"} 0.0\n'
    b'vllm:num_requests_waiting{model_name="bench-model"} 0.0\n'
    b'vllm:kv_cache_usage_perc{model_name="bench-model"} 0.0\n'
)

# wrk script: unique bodies (cache misses) unless HIT is set; prints percentiles as JSON.
WRK_LUA = """
local counter = 0
-- set per run by run_wrk: LuaJIT's math.random is not seeded, so a random id repeated itself in
-- every run and a "miss" run replayed the bodies its warm-up had just stored (cache hits)
local tid = os.getenv("BENCH_RUN")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench-0123456789abcdef0123456789abcdef"
local cache_control = os.getenv("BENCH_CACHE_CONTROL")
if cache_control ~= nil and cache_control ~= "" then wrk.headers["Cache-Control"] = cache_control end
local hit = os.getenv("BENCH_HIT") == "1"
request = function()
  counter = counter + 1
  local q = hit and "What is the capital of France?" or ("What is the capital of France? #" .. tid .. "-" .. counter)
  return wrk.format(nil, nil, nil,
    '{"model":"bench-model","messages":[{"role":"user","content":"' .. q .. '"}],"max_tokens":16}')
end
done = function(summary, latency, requests)
  io.write(string.format('\\nRESULT {"p50_us":%d,"p99_us":%d,"requests":%d,"duration_us":%d,'
    .. '"errors":%d,"non2xx":%d}\\n', latency:percentile(50), latency:percentile(99), summary.requests,
    summary.duration, summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout, summary.errors.status))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the backend and the baseline


class _Backend(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import httptools

        self.transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        if self.url.startswith(b"/metrics"):
            body, kind = METRICS, b"text/plain"
        elif self.url.startswith(b"/health"):
            body, kind = b'{"status":"ok"}', b"application/json"
        elif self.url.startswith(b"/v1/models"):
            body, kind = b'{"object":"list","data":[{"id":"bench-model","object":"model"}]}', b"application/json"
        else:
            body, kind = ANSWER, b"application/json"
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"  # type: ignore
            % (kind, len(body), body)
        )


@app.command(hidden=True)
def backend(port: int) -> None:
    """Serve the minimal OpenAI-compatible backend on PORT."""
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Backend, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    uvloop.run(main())


@app.command(hidden=True)
def passthrough(port: int, upstream: str, client: str = "aiohttp") -> None:
    """Serve a FastAPI pass-through on PORT: ``aiohttp`` forwards with one aiohttp ClientSession;
    ``httpx`` with httpx's API on the same aiohttp transport the router uses (httpx-aiohttp,
    requests handed straight to the transport as in router/forward/upstream.py)."""
    from httpx_aiohttp import AiohttpTransport

    @asynccontextmanager
    async def lifespan(application: FastAPI):  # type: ignore[no-untyped-def]
        application.state.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000))
        application.state.transport = AiohttpTransport(limits=httpx.Limits(max_connections=1000))
        yield
        await application.state.session.close()
        await application.state.transport.aclose()

    web = FastAPI(lifespan=lifespan)
    target = httpx.URL(upstream + "/v1/chat/completions")

    @web.post("/v1/chat/completions")
    async def forward(request: Request) -> Response:
        if client == "httpx":
            answer = await request.app.state.transport.handle_async_request(
                httpx.Request(
                    "POST", target, content=await request.body(), headers={"content-type": "application/json"}
                )
            )
            try:
                return Response(await answer.aread(), status_code=answer.status_code, media_type="application/json")
            finally:
                await answer.aclose()
        async with request.app.state.session.post(
            upstream + "/v1/chat/completions", data=await request.body(), headers={"content-type": "application/json"}
        ) as r:
            return Response(await r.read(), status_code=r.status, media_type="application/json")

    @web.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(
        web, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False
    )


# ---------------------------------------------------------------- systems under test


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def start_system(
    name: str, backend_url: str, tmp: Path, redis_url: str, litellm: str
) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """Start a system; returns its base URL and processes."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": open(tmp / f"{name}.log", "wb")}
    if name.startswith("promptedge"):
        workers = int(name.rsplit("_w", 1)[1]) if re.search(r"_w\d+$", name) else 1
        env = {
            **os.environ,
            "PROMPTEDGE_REDIS_URL": redis_url,
            "PROMPTEDGE_ROUTER_REPLICAS": json.dumps([{"url": backend_url, "model": MODEL}]),
            "PROMPTEDGE_ROUTER_UPSTREAM_TRANSPORT": "httpx" if name.endswith("httpx_transport") else "aiohttp",
            "PROMPTEDGE_CACHE_KEY_PREFIX": f"promptedge:bench:{os.getpid()}",
            "PROMPTEDGE_CACHE_ENABLED": "false" if name.endswith("no_cache") else "true",
            "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "true" if name.endswith("semantic") else "false",
        }
        proc = subprocess.Popen(
            [PY, "-m", "router", "serve", "--port", str(port), "--log-level", "warning", "--workers", str(workers)],
            cwd=ROOT,
            env=env,
            **quiet,
        )  # type: ignore[call-overload]
        _wait_ready(url + "/health", proc)
        wait_settled(proc.pid, workers)
        return url, [proc]
    if name in ("aiohttp_passthrough", "httpx_passthrough"):
        proc = subprocess.Popen(
            [PY, __file__, "passthrough", str(port), backend_url, "--client", name.split("_")[0]], **quiet
        )  # type: ignore
        _wait_ready(url + "/health", proc)
        return url, [proc]
    if name == "nginx":
        conf = tmp / "nginx.conf"
        conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};
  fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  upstream backend {{ server {backend_url.removeprefix("http://")}; keepalive 128; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }} }}
}}""")
        proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(tmp)], **quiet)  # type: ignore
        _wait_ready(url + "/health", proc)
        return url, [proc]
    if name == "litellm":
        conf = tmp / "litellm.yaml"
        conf.write_text(
            f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
            f"      api_base: {backend_url}/v1\n      api_key: none\n"
        )
        env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": BENCH_KEY}
        proc = subprocess.Popen(
            [litellm, "--config", str(conf), "--port", str(port), "--host", "127.0.0.1"], env=env, **quiet
        )  # type: ignore[call-overload]
        _wait_ready(url + "/health/liveliness", proc, timeout_s=180)
        return url, [proc]
    raise typer.BadParameter(f"unknown system {name!r}")


def wait_settled(pid: int, workers: int, timeout_s: float = 180.0) -> None:
    """Wait until the router started as ``pid`` has ``workers`` worker processes (for N > 1:
    children spawned by multiprocessing) and its process tree is quiet (under 0.25 core over
    1 s): every worker has finished its start-up, so no measurement catches one importing.
    Raises RuntimeError after ``timeout_s``."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spawned = [p for p in psutil.Process(pid).children() if "spawn_main" in " ".join(p.cmdline())]
        if workers == 1 or len(spawned) >= workers:
            before = cpu_seconds([pid])
            time.sleep(1.0)
            if cpu_seconds([pid]) - before < 0.25:
                return
        else:
            time.sleep(0.5)
    raise RuntimeError(f"router {pid}: {workers} workers not settled after {timeout_s} s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their children (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    tree, frontier = set(pids), list(pids)
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in stats.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return sum(stats[pid][1] for pid in tree if pid in stats) / tick


def cache_outcomes(url: str, name: str) -> dict[str, int] | None:
    """The router's cache counters (exact_hits, semantic_hits, misses) from ``/cache/stats``;
    None for a system that is not a PromptEdge router with its cache on. The bench checks with
    them that a miss run missed and a hit run hit."""
    if not name.startswith("promptedge") or name.endswith("no_cache"):
        return None
    for _ in range(30):  # 503 for a second after a lookup timed out under load (cache/README.md, Faults)
        answer = httpx.get(url + "/cache/stats", timeout=10.0)
        if answer.status_code == 200:
            stats = answer.json()
            return {k: int(stats[k]) for k in ("exact_hits", "semantic_hits", "misses")}
        time.sleep(0.1)
    raise RuntimeError(f"{name}: /cache/stats answers {answer.status_code}: {answer.text[:200]}")


def run_wrk(
    url: str,
    concurrency: int,
    duration_s: int,
    lua: Path,
    hit: bool,
    pids: list[int] | None = None,
    cache_control: str = "",
) -> dict[str, float]:
    """One wrk run; with ``pids``, also the CPU milliseconds those processes spent per request.
    cache_control: the requests' ``Cache-Control`` header ("" = none)."""
    env = {
        **os.environ,
        "BENCH_HIT": "1" if hit else "0",
        "BENCH_RUN": uuid.uuid4().hex,
        "BENCH_CACHE_CONTROL": cache_control,
    }
    cpu_before = cpu_seconds(pids) if pids else 0.0
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{duration_s}s",
            "--timeout",
            "10s",
            "-s",
            str(lua),
            url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    result = json.loads(out.split("RESULT ", 1)[1])
    run = {
        "p50_ms": result["p50_us"] / 1000,
        "p99_ms": result["p99_us"] / 1000,
        "rps": result["requests"] / (result["duration_us"] / 1e6),
        "errors": result["errors"] + result["non2xx"],
    }
    if pids:
        run["cpu_ms_per_request"] = round((cpu_seconds(pids) - cpu_before) * 1000 / max(1, result["requests"]), 3)
    return run


def measure_system(
    name: str,
    backend_url: str,
    backend_proc: subprocess.Popen[bytes],
    tmp: Path,
    redis_url: str,
    litellm: str,
    lua: Path,
    duration: int,
    label: str,
) -> dict[str, dict[str, Any]] | None:
    """Start one system, measure it at concurrency 1 and 32 (after a 1 s warm-up each), stop
    it; None when it does not start."""
    try:
        url, procs = (backend_url, []) if name == "direct" else start_system(name, backend_url, tmp, redis_url, litellm)
    except RuntimeError as exc:
        print(f"skipping {name}: {exc} (log: {tmp / (name + '.log')})", file=sys.stderr)
        print((tmp / f"{name}.log").read_text()[-2000:], file=sys.stderr)
        return None
    try:
        hit = name == "promptedge_hit_path"
        control = "no-store" if name == "promptedge_no_store" else ""
        runs: dict[str, dict[str, Any]] = {}
        for c in (1, 32):
            run_wrk(url, c, 1, lua, hit, cache_control=control)  # warm-up: connections, caches, lazy imports
            pids = [p.pid for p in procs] or [backend_proc.pid]
            before = cache_outcomes(url, name)
            run = runs[f"c{c}"] = run_wrk(url, c, duration, lua, hit, pids, cache_control=control)
            if before is not None:
                run["cache_outcomes"] = outcomes = {
                    k: v - before[k] for k, v in (cache_outcomes(url, name) or before).items()
                }
                expected = "exact_hits" if hit else "misses"
                if outcomes[expected] != sum(outcomes.values()):
                    print(f"warning: {name} c={c} is not all {expected}: {outcomes}", file=sys.stderr)
            print(
                f"{label} {name:28s} c={c:<3d} p50 {run['p50_ms']:8.3f} ms  p99 {run['p99_ms']:8.3f} ms  "
                f"{run['rps']:9.0f} req/s  errors {run['errors']}  cpu {run.get('cpu_ms_per_request')} ms/req",
                file=sys.stderr,
            )
        return runs
    finally:
        stop(procs)


def median_runs(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per concurrency, the median of each number over the rounds (errors: the sum)."""
    out: dict[str, dict[str, Any]] = {}
    for cell in rounds[0]:
        runs = [r[cell] for r in rounds]
        out[cell] = {
            k: round(statistics.median(r[k] for r in runs), 3)
            for k in ("p50_ms", "p99_ms", "rps", "cpu_ms_per_request")
            if k in runs[0]
        }
        out[cell]["errors"] = sum(r["errors"] for r in runs)
    return out


@app.command()
def main(
    json_path: Path = typer.Option(None, "--json", help="Write the results here."),
    duration: int = typer.Option(5, help="Seconds per wrk run (after a 1 s warm-up run)."),
    repeat: int = typer.Option(3, min=1, help="Rounds over all systems; the table shows each one's median."),
    systems: str = typer.Option(
        "promptedge,promptedge_hit_path,promptedge_httpx_transport,promptedge_semantic,"
        "nginx,aiohttp_passthrough,httpx_passthrough,litellm",
        help="Comma-separated systems besides direct.",
    ),
    redis_url: str = typer.Option("redis://127.0.0.1:6379/14", help="Redis for the router's cache."),
    litellm: str = typer.Option("/work/litellm-venv/bin/litellm", help="LiteLLM proxy binary (skipped if absent)."),
    workers: str = typer.Option(
        "1",
        help="Worker counts for the promptedge row, e.g. 1,2,4: each N > 1 adds a "
        "row promptedge_wN (router serve --workers N) next to it.",
    ),
) -> None:
    """Measure every system at concurrency 1 and 32; print a table, write JSON."""
    for tool in ("wrk", "nginx") if "nginx" in systems.split(",") else ("wrk",):
        if shutil.which(tool) is None:
            raise typer.BadParameter(f"{tool} not found on PATH (apt-get install -y {tool})")
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmpdir:
        tmp = Path(tmpdir)
        lua = tmp / "bench.lua"
        lua.write_text(WRK_LUA)
        port = free_port()
        backend_proc = subprocess.Popen([PY, __file__, "backend", str(port)])
        backend_url = f"http://127.0.0.1:{port}"
        results: dict[str, dict[str, object]] = {}
        try:
            _wait_ready(backend_url + "/health", backend_proc)
            names = ["direct"] + [s for s in systems.split(",") if s]
            if "promptedge" in names:
                at = names.index("promptedge") + 1
                names[at:at] = [f"promptedge_w{n}" for n in sorted({int(n) for n in workers.split(",") if n}) if n > 1]
            if "litellm" in names and not Path(litellm).exists():
                print(f"skipping litellm: {litellm} not found", file=sys.stderr)
                names.remove("litellm")
            rounds: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in names}
            # whole rounds, every system once per round: a neighbour's burst then moves one
            # round of every system, and the median round of each is compared
            for round_no in range(repeat):
                for name in names:
                    runs = measure_system(
                        name,
                        backend_url,
                        backend_proc,
                        tmp,
                        redis_url,
                        litellm,
                        lua,
                        duration,
                        f"round {round_no + 1}/{repeat}",
                    )
                    if runs is not None:
                        rounds[name].append(runs)
            for name, measured in rounds.items():
                if measured:
                    results[name] = {
                        "runs": median_runs(measured),
                        "rounds": measured,
                        "load_1m": round(os.getloadavg()[0], 2),
                    }
        finally:
            stop([backend_proc])
    base = results["direct"]["runs"]
    for entry in results.values():
        runs = entry["runs"]  # type: ignore[assignment]
        entry["added_p50_ms"] = round(runs["c1"]["p50_ms"] - base["c1"]["p50_ms"], 3)  # type: ignore[index]
        entry["added_p99_ms"] = round(runs["c1"]["p99_ms"] - base["c1"]["p99_ms"], 3)  # type: ignore[index]
        entry["added_p50_ms_c32"] = round(runs["c32"]["p50_ms"] - base["c32"]["p50_ms"], 3)  # type: ignore[index]
        entry["max_rps"] = round(max(runs["c1"]["rps"], runs["c32"]["rps"]))  # type: ignore[index]
        entry["cpu_ms_per_request_c32"] = runs["c32"].get("cpu_ms_per_request")  # type: ignore[index]
    print_table(results)
    print_workers(results)
    print_targets(results)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2))


@app.command(hidden=True)
def scrape_cost(replicas: int = 4, seconds: float = 20.0, interval_s: float = 0.25) -> None:
    """CPU the router spends polling ``replicas`` idle sim replicas (vLLM-shaped /metrics with
    histograms) every ``interval_s``, per replica: router CPU with scraping minus without."""
    ports = [free_port() for _ in range(replicas)]
    sims = [
        subprocess.Popen(
            [PY, "-m", "sim", "serve", "--port", str(p), "--model", MODEL],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        for port, proc in zip(ports, sims, strict=True):
            _wait_ready(f"http://127.0.0.1:{port}/health", proc)
        size = len(httpx.get(f"http://127.0.0.1:{ports[0]}/metrics").content)
        cpu = {}
        for label, interval in (("scraping", interval_s), ("idle", 3600.0)):
            port = free_port()
            env = {
                **os.environ,
                "PROMPTEDGE_ROUTER_REPLICAS": json.dumps(
                    [{"url": f"http://127.0.0.1:{p}", "model": MODEL} for p in ports]
                ),
                "PROMPTEDGE_ROUTER_SCRAPE_INTERVAL_S": str(interval),
                "PROMPTEDGE_ROUTER_HEALTH_INTERVAL_S": "3600",
                "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "false",
            }
            router = subprocess.Popen(
                [PY, "-m", "router", "serve", "--port", str(port), "--log-level", "warning"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                _wait_ready(f"http://127.0.0.1:{port}/health", router)
                time.sleep(2.0)
                before = cpu_seconds([router.pid])
                time.sleep(seconds)
                cpu[label] = (cpu_seconds([router.pid]) - before) / seconds
            finally:
                stop([router])
        per_replica = (cpu["scraping"] - cpu["idle"]) / replicas
        print(
            f"/metrics page {size} bytes; router CPU {cpu['scraping'] * 100:.2f} % scraping "
            f"{replicas} replicas every {interval_s} s, {cpu['idle'] * 100:.2f} % without; "
            f"per replica {per_replica * 100:.3f} % of a core "
            f"({per_replica / (1 / interval_s) * 1000:.2f} ms CPU per scrape)"
        )
    finally:
        stop(sims)


def print_targets(results: dict[str, dict[str, object]]) -> None:
    """The issue-4 targets for the proxy path (``promptedge``): added p50 at c=1 <= 1 ms; req/s
    at c=32 >= 0.5x the aiohttp pass-through's and >= 10x LiteLLM's (from this run)."""
    entry = results.get("promptedge")
    if entry is None:
        return
    rps = entry["runs"]["c32"]["rps"]  # type: ignore[index]
    lines = [f"added p50 c=1 {entry['added_p50_ms']:.3f} ms (target <= 1 ms)"]
    for other, factor in (("aiohttp_passthrough", 0.5), ("litellm", 10.0)):
        if other in results:
            ratio = rps / results[other]["runs"]["c32"]["rps"]  # type: ignore[index]
            lines.append(f"req/s c=32 {ratio:.2f}x {other} (target >= {factor}x)")
    loads = ", ".join(f"{name} {e['load_1m']}" for name, e in results.items() if "load_1m" in e)
    print("promptedge: " + "; ".join(lines) + f"\nload average (1 min) after each system: {loads}")


def print_workers(results: dict[str, dict[str, object]]) -> None:
    """CPU per proxied miss against the number of router workers (rows promptedge, promptedge_wN)."""
    rows = [(1, results["promptedge"])] if "promptedge" in results else []
    rows += sorted(
        (int(name.rsplit("_w", 1)[1]), entry)
        for name, entry in results.items()
        if re.fullmatch(r"promptedge_w\d+", name)
    )
    if len(rows) < 2:
        return
    print("\n| workers | CPU ms/miss c=1 | CPU ms/miss c=32 | req/s c=32 | p50 c=32 (ms) |")
    print("|---|---|---|---|---|")
    for n, entry in rows:
        runs = entry["runs"]  # type: ignore[assignment]
        print(
            f"| {n} | {runs['c1'].get('cpu_ms_per_request')} | {runs['c32'].get('cpu_ms_per_request')} "  # type: ignore
            f"| {runs['c32']['rps']:.0f} | {runs['c32']['p50_ms']:.2f} |"
        )  # type: ignore


def print_table(results: dict[str, dict[str, object]]) -> None:
    header = (
        f"| {'system':27s} | added p50 c=1 (ms) | added p99 c=1 (ms) | req/s c=1 | added p50 c=32 (ms) "
        f"| req/s c=32 | CPU ms/req c=32 | errors |"
    )
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for name, entry in results.items():
        runs = entry["runs"]  # type: ignore[assignment]
        errors = runs["c1"]["errors"] + runs["c32"]["errors"]  # type: ignore[index]
        print(
            f"| {name:27s} | {entry['added_p50_ms']:18.3f} | {entry['added_p99_ms']:18.3f} "
            f"| {runs['c1']['rps']:9.0f} | {entry['added_p50_ms_c32']:19.3f} | {runs['c32']['rps']:10.0f} "  # type: ignore
            f"| {entry['cpu_ms_per_request_c32'] or 0:15.3f} | {errors:6d} |"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("backend", "passthrough", "scrape-cost"):
        app()
    else:
        typer.run(main)
