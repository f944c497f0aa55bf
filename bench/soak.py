"""Soak: the real stack on loopback under a fixed request rate, with faults on a schedule.

    python bench/soak.py [--minutes 3] [--rate 5] [--replicas 3] [--router-workers 2]
                         [--json out/soak.json] [--no-semantic]

Starts a ``redis-server`` on a free port, ``--replicas`` simulated replicas (``python -m sim
serve``, a100 profile; the last one behind ``python -m sim.front``, which answers ``/health``
itself as vLLM's API server does for its engine), ``python -m router serve --workers N`` and the
forecaster daemon (``python -m forecaster daemon``, dry-run, reading the router's counters in
this Redis), all as child processes on 127.0.0.1; sends non-stream ``/v1/completions`` at
``--rate`` requests per second (open loop: a request is sent on schedule whether or not earlier
ones have answered) for ``--minutes``. Every fault is scheduled as a fraction of the run, so a
3-minute run has each of them (seconds for 3 minutes in brackets):

1. ``redis_down``: Redis SIGKILLed, restarted on the same port 6 % later (22 s, 11 s);
2. ``replica_killed``: replica 0 SIGKILLed while idle (the kill waits, at most 5 s, for a
   ``/metrics`` page with no running or waiting request), restarted 6 % later (47 s, 11 s);
3. ``replica_hung``: replica 1 holds its requests (``POST /sim/faults {"hang": true}``),
   released 7 % later (72 s, 13 s);
4. ``engine_stopped``: the last replica's engine SIGSTOPped while generating (the stop waits, at
   most 10 s, for a running request), its front still answering ``/health`` and serving the last
   ``/metrics`` page; SIGCONT 8 % later (99 s, 14 s);
5. ``forecaster_down``: the forecaster SIGKILLed and started again 3 % later (126 s, 5 s);
6. ``router_worker_killed``: one router worker (a child of the uvicorn supervisor) restarted as a
   rolling restart does it, with SIGTERM: it stops accepting, finishes what it has in flight and
   exits, and the supervisor starts another (136 s; its pid and when it appeared are in the fault
   record). A request lost there is counted apart too (``totals.lost_at_worker_kill``: sent
   before the signal, ended by a connection error within 2 s of it). A SIGKILLed worker would
   lose what it had in flight, with no process left to answer it: that is a crash, not a
   restart, and ``--worker-signal KILL`` shows it;
7. all along, oversized requests (a 16 MB header, a 20 MB body, alternately every max(15 s,
   run / 12), and one 200 MB body streamed from a generator at half time) that must each get
   431 / 413 with the OpenAI error naming the limit: counted per phase as ``refused`` (expected,
   not failures); another status or body counts as ``wrong``, no answer as ``lost``.

Each request is counted in the phase it was sent in (``warmup``: the first 5 % of the run, at
most 10 s, while the processes' first requests warm their caches; ``baseline``; each fault; and
the time after each fault until the next one), so every fault has a before, a during and an after.
Per phase: requests sent, answered (200), failed by status, **lost** (no HTTP answer at all
within the client's 30 s: a connection error or timeout), **wrong** (a 200 whose answer is not
the one for its own question, a refusal without its 431/413 error, or a forecaster decision that
breaks the restart rule below), expected refusals, exact and semantic cache hits, and p50/p99
latency of the answered ones. The baseline phase is the comparison point: ``p99_x`` is a
phase's p99 over the baseline's.

Wrong answers: prompts are random word sequences with a serial number, 40 % of them repeats of
50 popular ones (exact cache hits), the rest fresh (misses); each asks ``"echo": true`` with ``max_tokens`` chosen by the prompt; the
simulated replica answers ``prompt + max_tokens filler words`` deterministically (sim/README.md,
Echo), so an answer for any other request, from a replica or the cache, is detected.

Forecaster: the router and the forecaster share a clock ``CLOCK_SCALE`` (10) times faster than
the wall (a decision every 6 wall s, a counter minute every 6 wall s) and the pool's capacity is
set so that the steady load needs more than ``FORECAST_MAX`` replicas: every sound decision is
``FORECAST_MAX``; one below it reads a partial or missing minute as a demand drop. Each
decision line of each forecaster process's log is read back; a **wrong decision** is one by the
restarted process, within one scale-down stabilisation window (``down_cooldown_s``, 300
simulated s) of its start, below the last decision of the process it replaced. Every decision
below the maximum, whichever process and phase, is listed in the report (``forecaster``).

The router runs with ``PROMPTEDGE_ROUTER_TIMEOUTS`` P1 ``ttfb_s`` 10 s (a hung replica's
requests become 504 after 10 s instead of the default 120 s, which would outlast a short
soak) and ``stuck_after_s`` 3 s (the stopped engine leaves rotation within a short run's
fault). Process logs go to ``--log-dir``. Loops are bounded: requests = rate x duration;
at most 512 in flight (more are counted as ``skipped``, never queued without bound).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.replica.tokens import filler  # noqa: E402
from sim.stack import Child, RedisServer, Stack, StackError, free_port  # noqa: E402

MODEL = "sim-llama-8b"
POPULAR = 50
CLIENT_TIMEOUT_S = 30.0
MAX_IN_FLIGHT = 512
WORDS = (
    "amber basil cedar delta ember fjord garnet harbor iris juniper kelp lumen marble nectar onyx "
    "prism quartz raven sable tundra umber violet willow xenon yarrow zephyr anvil bramble cobalt "
    "dune falcon glacier hazel indigo jasper kestrel lotus meadow nimbus orchid pebble"
).split()
MB = 1024 * 1024
# the router's request limits, set explicitly (the defaults) so the refusals' messages can be checked
MAX_BODY_BYTES, MAX_HEADER_BYTES = 8 * MB, 32 * 1024
OVERSIZE = {
    "header_16mb": (431, "headers_too_large", MAX_HEADER_BYTES),
    "body_20mb": (413, "body_too_large", MAX_BODY_BYTES),
    "body_200mb_streamed": (413, "body_too_large", MAX_BODY_BYTES),
}
STUCK_AFTER_S = 3.0
ROUTER_TTFB_S = 10.0
# The forecaster's clock runs this many times faster than the wall (the router's counters too).
CLOCK_SCALE = 10.0
FORECAST_MAX = 8
FORECAST_DOWN_COOLDOWN_S = 300.0  # simulated s: the scale-down stabilisation window (its default)
DECISION_LINE = re.compile(r"^decision (\d+) \(([\w-]+), exit (\d+)\) at ([\d.]+)")

app = typer.Typer(add_completion=False)


@dataclass
class Outcome:
    """One request: when it was sent (s since start), its phase, and what came back. ``kind``:
    "" for the regular load, else the OVERSIZE entry (an expected 431/413)."""

    sent_at: float
    phase: str
    status: int | None = None  # None: lost (no HTTP answer)
    latency_s: float | None = None
    wrong: bool = False
    cache: str = ""
    error: str = ""
    kind: str = ""
    detail: str = ""  # a failed answer's body (first 300 characters)
    ended_at: float | None = None  # s since start, set by run_load when the request ended


@dataclass
class Schedule:
    """Fault times in seconds since the start of the load, from fractions of the run."""

    duration_s: float
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (at, action, phase it opens)

    @classmethod
    def of(cls, duration_s: float) -> Schedule:
        d = duration_s
        return cls(
            d,
            [
                (min(10.0, 0.05 * d), "", "baseline"),
                (0.12 * d, "kill_redis", "redis_down"),
                (0.18 * d, "start_redis", "after_redis"),
                (0.26 * d, "kill_replica", "replica_killed"),
                (0.32 * d, "start_replica", "after_replica_restart"),
                (0.40 * d, "hang_replica", "replica_hung"),
                (0.47 * d, "release_replica", "after_hang_released"),
                (0.55 * d, "stop_engine", "engine_stopped"),
                (0.63 * d, "resume_engine", "after_engine_resumed"),
                (0.70 * d, "kill_forecaster", "forecaster_down"),
                (0.73 * d, "start_forecaster", "after_forecaster_restart"),
                (0.76 * d, "kill_router_worker", "router_worker_killed"),
                (0.84 * d, "", "after_router_worker"),
            ],
        )

    def phase_at(self, t: float) -> str:
        phase = "warmup"
        for at, _, opens in self.events:
            if t >= at:
                phase = opens
        return phase

    def phases(self) -> list[str]:
        return ["warmup", *(opens for _, _, opens in self.events)]

    def oversized(self) -> list[tuple[float, str]]:
        """(at, OVERSIZE kind): a 16 MB header and a 20 MB body in turn every max(15 s, run / 12)
        from the end of the warm-up, and the 200 MB streamed body once at half time."""
        every = max(15.0, self.duration_s / 12)
        start = self.events[0][0] + every / 2
        n = max(0, int((self.duration_s - start) // every))
        sends = [(start + i * every, ("header_16mb", "body_20mb")[i % 2]) for i in range(n)]
        return sorted([*sends, (0.5 * self.duration_s, "body_200mb_streamed")])


class Prompts:
    """The prompts of the run: 40 % repeat one of POPULAR prompts (exact cache hits after their
    first answer), 60 % are fresh (cache misses that reach a replica). Each prompt is 8 random
    words plus a serial number, with its own max_tokens (4..19)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.popular = [self._fresh(i) for i in range(POPULAR)]
        self.serial = POPULAR

    def _fresh(self, serial: int) -> tuple[str, int]:
        words = " ".join(self.rng.choice(WORDS) for _ in range(8))
        return f"{words} #{serial}", 4 + serial % 16

    def next(self) -> tuple[str, int]:
        if self.rng.random() < 0.4:
            return self.popular[self.rng.randrange(POPULAR)]
        self.serial += 1
        return self._fresh(self.serial)


def check(answer: dict[str, Any], prompt: str, max_tokens: int) -> bool:
    """True when ``answer`` is the sim's answer to exactly this prompt and max_tokens."""
    try:
        return (
            answer["model"] == MODEL
            and answer["choices"][0]["text"] == prompt + filler(0, max_tokens)
            and answer["usage"]["completion_tokens"] == max_tokens
        )
    except (KeyError, IndexError, TypeError):
        return False


def check_refusal(kind: str, status: int, body: bytes) -> bool:
    """True when an oversized request of ``kind`` (OVERSIZE) got its status and an OpenAI error
    ``{"error": {"message", "type", "param", "code"}}`` whose message names the limit in bytes."""
    want_status, code, limit = OVERSIZE[kind]
    try:
        error = json.loads(body)["error"]
        return (
            status == want_status
            and error["code"] == code
            and error["type"] == "invalid_request_error"
            and f"{limit} bytes" in error["message"]
        )
    except (ValueError, KeyError, TypeError):
        return False


@dataclass(frozen=True)
class ForecastDecision:
    """One decision line of a forecaster log: which process (its start order), wall Unix s of the
    line, simulated Unix s it decided at, replicas, action."""

    process: int
    wall: float
    at: float
    replicas: int
    action: str


def read_decisions(log: Path, process: int) -> list[ForecastDecision]:
    """The decisions in one forecaster process's JSON log (``forecaster.live`` lines "decision N
    (action, exit C) at T ..."); lines that are not JSON or not decisions are skipped."""
    from datetime import datetime

    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        try:
            record = json.loads(line)
            match = DECISION_LINE.match(record.get("message", ""))
        except (ValueError, AttributeError):
            continue
        if match:
            wall = datetime.fromisoformat(record["timestamp"]).timestamp()
            out.append(ForecastDecision(process, wall, float(match[4]), int(match[1]), match[2]))
    return out


def restart_violations(
    before: list[ForecastDecision], after: list[ForecastDecision], window_s: float
) -> list[ForecastDecision]:
    """The decisions of a restarted forecaster (``after``, in order) made within ``window_s``
    simulated seconds of its first one that are below the last decision of the process before it
    (``before``): a restart read as a demand drop. Empty when either list is."""
    if not before or not after:
        return []
    had, first = before[-1].replicas, after[0].at
    return [d for d in after if d.at - first <= window_s and d.replicas < had]


def _wait_200(url: str, timeout_s: float) -> None:
    """Poll ``GET url`` until it answers 200; StackError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise StackError(f"{url} did not answer 200 within {timeout_s:.0f} s")
        time.sleep(0.2)


class SoakStack:
    """Redis, the replicas (the last behind a front), the router, the forecaster as child
    processes; the fault actions."""

    def __init__(self, stack: Stack, replicas: int, semantic: bool, workers: int, rate: float) -> None:
        self.stack = stack
        self.redis = RedisServer()
        self.replica_ports = [free_port() for _ in range(replicas)]
        self.front_port = free_port()
        self.replica_children: dict[int, Child] = {}
        self.router_port = free_port()
        self.semantic = semantic
        self.workers = workers
        self.worker_signal = signal.SIGTERM
        self.rate = rate
        self.router: Child | None = None
        self.forecasters: list[Child] = []
        self.clock_origin = time.time()
        self.engine_stopped = False

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def engine(self) -> int:
        """The replica whose engine is stopped: the last, behind the front."""
        return len(self.replica_ports) - 1

    def replica_url(self, i: int) -> str:
        """The replica's own server (for the engine replica: the engine, not its front)."""
        return f"http://127.0.0.1:{self.replica_ports[i]}"

    def routed_url(self, i: int) -> str:
        """What the router is given for replica ``i``."""
        return f"http://127.0.0.1:{self.front_port}" if i == self.engine else self.replica_url(i)

    def start_replica(self, i: int) -> None:
        self.replica_children[i] = self.stack.spawn(
            f"replica-{i}", ["sim", "serve", "--port", str(self.replica_ports[i]), "--model", MODEL]
        )

    def _clock_env(self, service: str) -> dict[str, str]:
        return {
            f"PROMPTEDGE_{service}_CLOCK_ORIGIN": repr(self.clock_origin),
            f"PROMPTEDGE_{service}_CLOCK_SCALE": repr(CLOCK_SCALE),
        }

    def start_forecaster(self) -> None:
        # capacity: the steady load (rate x 60 % misses per wall s, i.e. / CLOCK_SCALE per
        # simulated s, with 20 % headroom) needs 1.5 x FORECAST_MAX replicas: every sound
        # decision is the maximum
        capacity = self.rate * 0.6 / CLOCK_SCALE * 1.2 / (1.5 * FORECAST_MAX)
        env = {
            **self._clock_env("FORECASTER"),
            "PROMPTEDGE_REDIS_URL": self.redis.url,
            "PROMPTEDGE_FORECASTER_SOURCE": "redis",
            "PROMPTEDGE_FORECASTER_MODEL_NAME": MODEL,
            "PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA": repr(capacity),
            "PROMPTEDGE_FORECASTER_MIN_REPLICAS": "1",
            "PROMPTEDGE_FORECASTER_MAX_REPLICAS": str(FORECAST_MAX),
            "PROMPTEDGE_FORECASTER_DOWN_COOLDOWN_S": repr(FORECAST_DOWN_COOLDOWN_S),
            "PROMPTEDGE_FORECASTER_DAEMON_INTERVAL_S": "60",
            "PROMPTEDGE_FORECASTER_TIME_BUDGET_S": "1",
            "PROMPTEDGE_FORECASTER_METRICS_PORT": "0",
            "PROMPTEDGE_ACTUATOR_MODE": "dry-run",
        }
        self.forecasters.append(
            self.stack.spawn(f"forecaster-{len(self.forecasters)}", ["forecaster", "daemon"], env=env, nice=5)
        )

    def start(self) -> None:
        self.redis.start()
        for i in range(len(self.replica_ports)):
            self.start_replica(i)
        self.stack.spawn(
            "front", ["sim.front", "--port", str(self.front_port), "--upstream", self.replica_url(self.engine)]
        )
        replicas = [{"url": self.routed_url(i), "model": MODEL} for i in range(len(self.replica_ports))]
        env = {
            **self._clock_env("ROUTER"),
            "PROMPTEDGE_REDIS_URL": self.redis.url,
            "PROMPTEDGE_ROUTER_REPLICAS": json.dumps(replicas),
            "PROMPTEDGE_ROUTER_PORT": str(self.router_port),
            "PROMPTEDGE_ROUTER_LOG_REQUESTS": "false",
            "PROMPTEDGE_ROUTER_TIMEOUTS": json.dumps({"P1": {"connect_s": 1, "ttfb_s": ROUTER_TTFB_S, "idle_s": 10}}),
            "PROMPTEDGE_ROUTER_STUCK_AFTER_S": repr(STUCK_AFTER_S),
            "PROMPTEDGE_ROUTER_LIMITS": json.dumps(
                {"max_body_bytes": MAX_BODY_BYTES, "max_header_bytes": MAX_HEADER_BYTES}
            ),
            "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "true" if self.semantic else "false",
        }
        self.router = self.stack.spawn(
            "router", ["router", "serve", "--log-level", "warning", "--workers", str(self.workers)], env=env
        )
        self.stack.wait_healthy(
            {
                "router": self.router_url,
                **{f"replica-{i}": self.replica_url(i) for i in range(len(self.replica_ports))},
            },
            timeout_s=180,
        )
        _wait_200(f"{self.routed_url(self.engine)}/health", 30)  # the front answers 200 with no body
        self.start_forecaster()
        # the load starts once the forecaster has decided (its imports take seconds): its first
        # decisions then see the baseline, not the Redis fault
        deadline = time.monotonic() + 120
        while not read_decisions(self.forecasters[0].log, 0):
            if self.forecasters[0].process.poll() is not None or time.monotonic() > deadline:
                raise StackError(f"the forecaster made no decision:\n{self.forecasters[0].log_tail()}")
            time.sleep(0.2)

    def router_workers(self) -> list[int]:
        """Pids of the router's worker processes (the supervisor's children that multiprocessing
        spawned; not its resource tracker)."""
        assert self.router is not None
        try:
            children = psutil.Process(self.router.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        pids = []
        for child in children:
            try:
                cmdline = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
                pids.append(child.pid)
        return sorted(pids)

    async def _running(self, client: httpx.AsyncClient, i: int) -> float | None:
        """Running + waiting requests on replica ``i``'s own /metrics (None: no answer)."""
        try:
            page = (await client.get(f"{self.replica_url(i)}/metrics", timeout=0.5)).text
        except httpx.HTTPError:
            return None
        total = 0.0
        for line in page.splitlines():
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def act(self, action: str, client: httpx.AsyncClient) -> dict[str, Any]:
        """Run one fault action (the blocking ones in a thread: the load keeps its schedule);
        returns what the fault record should say beyond the action and its time."""
        note: dict[str, Any] = {}
        if action == "kill_redis":
            self.redis.kill()
        elif action == "start_redis":
            await asyncio.to_thread(self.redis.start)
        elif action == "kill_replica":  # while idle: no running or waiting request on its own page
            deadline = time.monotonic() + 5.0
            while (busy := await self._running(client, 0)) != 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            note["idle_at_kill"] = busy == 0
            os.killpg(self.replica_children[0].process.pid, signal.SIGKILL)
            await asyncio.to_thread(self.replica_children[0].process.wait)
        elif action == "start_replica":
            self.start_replica(0)
        elif action in ("hang_replica", "release_replica"):
            await client.post(f"{self.replica_url(1)}/sim/faults", json={"hang": action == "hang_replica"})
        elif action == "stop_engine":  # hung on generation: stopped while it has a running request
            deadline = time.monotonic() + 10.0
            while not (busy := await self._running(client, self.engine)) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            note["requests_on_engine_at_stop"] = busy
            os.killpg(self.replica_children[self.engine].process.pid, signal.SIGSTOP)
            self.engine_stopped = True
        elif action == "resume_engine":
            self.resume_engine()
        elif action == "kill_forecaster":
            child = self.forecasters[-1]
            note["pid"] = child.process.pid
            os.killpg(child.process.pid, signal.SIGKILL)
            await asyncio.to_thread(child.process.wait)
        elif action == "start_forecaster":
            self.start_forecaster()
        elif action == "kill_router_worker":
            workers = self.router_workers()
            note["workers_before"] = workers
            if workers:
                note["kill_after_s"] = 0.0
                os.kill(workers[0], self.worker_signal)
                note["killed_pid"] = workers[0]
                killed_at = time.monotonic()
                # the supervisor may take its worker health-check timeout (router/process/launch.py
                # WORKER_HEALTHCHECK_S, 30 s) to notice: a ping in flight when the worker died waits it out (measured: 30-35 s with the semantic stage on)
                deadline = killed_at + 90.0
                while time.monotonic() < deadline:
                    now = self.router_workers()
                    if len(now) == len(workers) and workers[0] not in now:
                        note["replaced_by"] = sorted(set(now) - set(workers))
                        note["replaced_after_s"] = round(time.monotonic() - killed_at, 2)
                        break
                    await asyncio.sleep(0.1)
                else:
                    note["replaced_by"] = None
        return note

    def resume_engine(self) -> None:
        """SIGCONT the stopped engine (idempotent; also before the stack stops it)."""
        if self.engine_stopped:
            self.engine_stopped = False
            try:
                os.killpg(self.replica_children[self.engine].process.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def decisions(self) -> list[ForecastDecision]:
        """Every forecaster process's decisions, in start order."""
        return [d for i, child in enumerate(self.forecasters) for d in read_decisions(child.log, i)]

    def stop(self) -> None:
        self.resume_engine()
        self.stack.stop()
        self.redis.kill()


async def _one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, out: Outcome) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "echo": True}
    started = time.perf_counter()
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__
        return
    out.status = response.status_code
    out.latency_s = time.perf_counter() - started
    out.cache = response.headers.get("x-cache", "")
    if response.status_code != 200:
        out.detail = response.text[:300]
    if response.status_code == 200:
        try:
            out.wrong = not check(response.json(), prompt, max_tokens)
        except ValueError:
            out.wrong = True


async def _streamed_body(total: int) -> AsyncIterator[bytes]:
    """A completion request of exactly ``total`` bytes, made 1 MB at a time (never held whole)."""
    head = b'{"model":"%s","max_tokens":4,"prompt":"' % MODEL.encode()
    tail = b'"}'
    left = total - len(head) - len(tail)
    yield head
    block = b"x" * MB
    while left > 0:
        yield block[: min(left, MB)]
        left -= MB
    yield tail


async def _oversized(url: str, out: Outcome) -> None:
    """Send one oversized request of ``out.kind`` on a connection of its own (the router closes
    it after the refusal) and check the refusal."""
    started = time.perf_counter()
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    try:
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
            if out.kind == "header_16mb":
                response = await client.post(url, json=body, headers={"x-big": "a" * (16 * MB)})
            elif out.kind == "body_20mb":
                response = await client.post(url, json={**body, "prompt": "x" * (20 * MB)})
            else:
                total = 200 * MB
                response = await client.post(
                    url,
                    content=_streamed_body(total),
                    headers={"content-type": "application/json", "content-length": str(total)},
                )
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__
        return
    out.status = response.status_code
    out.latency_s = time.perf_counter() - started
    out.wrong = not check_refusal(out.kind, response.status_code, response.content)


async def _ended(request: Any, out: Outcome, start: float) -> None:
    await request
    out.ended_at = time.monotonic() - start


def lost_at_worker_kill(outcomes: list[Outcome], faults: list[dict], within_s: float = 2.0) -> list[Outcome]:
    """The lost requests that were in flight on the router worker when it was SIGKILLed: sent
    before the kill, ended by a connection error within ``within_s`` of it (nothing can answer
    them: the process holding them is gone; only a client's retry can)."""
    kills = [f["at_s"] + f.get("kill_after_s", 0.0) for f in faults if f["action"] == "kill_router_worker"]
    return [
        o
        for o in outcomes
        if o.status is None
        and o.error not in ("", "skipped")
        and o.ended_at is not None
        and any(o.sent_at <= k <= o.ended_at <= k + within_s for k in kills)
    ]


async def run_load(soak: SoakStack, schedule: Schedule, rate: float, seed: int) -> tuple[list[Outcome], list[dict]]:
    """Send rate x duration requests on schedule, the oversized ones at their times, run the
    fault actions at theirs."""
    prompts = Prompts(seed)
    outcomes: list[Outcome] = []
    faults: list[dict] = []
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)
    url = f"{soak.router_url}/v1/completions"

    async def faults_on_schedule(start: float) -> None:
        for event_at, action, _ in schedule.events:
            await asyncio.sleep(max(0.0, start + event_at - time.monotonic()))
            if not action:  # a phase boundary without a fault (end of warm-up)
                continue
            t0 = time.monotonic() - start
            note = await soak.act(action, client)
            faults.append(
                {"action": action, "at_s": round(t0, 2), "took_s": round(time.monotonic() - start - t0, 2), **note}
            )

    async def oversized_on_schedule(start: float) -> None:
        for at, kind in schedule.oversized():
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            out = Outcome(sent_at=time.monotonic() - start, phase=schedule.phase_at(at), kind=kind)
            outcomes.append(out)
            task = asyncio.create_task(_ended(_oversized(url, out), out, start))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        start = time.monotonic()
        side = [asyncio.create_task(faults_on_schedule(start)), asyncio.create_task(oversized_on_schedule(start))]
        total = int(rate * schedule.duration_s)
        for i in range(total):
            at = i / rate
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            out = Outcome(sent_at=time.monotonic() - start, phase=schedule.phase_at(at))
            outcomes.append(out)
            if len(tasks) >= MAX_IN_FLIGHT:
                out.error = "skipped"
                continue
            prompt, max_tokens = prompts.next()
            task = asyncio.create_task(_ended(_one(client, url, prompt, max_tokens, out), out, start))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*side)
        while tasks:
            await asyncio.gather(*list(tasks))
    return outcomes, faults


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def forecaster_report(
    decisions: list[ForecastDecision], faults: list[dict], schedule: Schedule, start_wall: float
) -> dict[str, Any]:
    """The forecaster's part of the report: decisions per process, the restart's violations
    (wrong decisions, with the phase they fall in) and every decision below the maximum."""
    by_process: dict[int, list[ForecastDecision]] = {}
    for d in decisions:
        by_process.setdefault(d.process, []).append(d)
    violations = []
    for process in sorted(by_process)[1:]:
        for d in restart_violations(by_process.get(process - 1, []), by_process[process], FORECAST_DOWN_COOLDOWN_S):
            violations.append(
                {
                    "process": d.process,
                    "replicas": d.replicas,
                    "had": by_process[process - 1][-1].replicas,
                    "at_s": round(d.wall - start_wall, 1),
                    "phase": schedule.phase_at(d.wall - start_wall),
                }
            )
    return {
        "max_replicas": FORECAST_MAX,
        "clock_scale": CLOCK_SCALE,
        "down_cooldown_s": FORECAST_DOWN_COOLDOWN_S,
        "decisions_per_process": {str(p): len(ds) for p, ds in sorted(by_process.items())},
        "last_before_restart": {str(p): ds[-1].replicas for p, ds in sorted(by_process.items())},
        "first_after_restart": {str(p): ds[0].replicas for p, ds in sorted(by_process.items()) if p > 0},
        "violations": violations,
        "below_max": [
            {
                "process": d.process,
                "replicas": d.replicas,
                "action": d.action,
                "at_s": round(d.wall - start_wall, 1),
                "phase": schedule.phase_at(d.wall - start_wall),
            }
            for d in decisions
            if d.replicas < FORECAST_MAX
        ],
    }


def summarise(
    outcomes: list[Outcome], schedule: Schedule, wrong_decisions: Counter[str] | None = None
) -> list[dict[str, Any]]:
    """One row per phase, in schedule order. ``wrong_decisions``: phase -> forecaster decisions
    that broke the restart rule (added to the phase's ``wrong``)."""
    wrong_decisions = wrong_decisions or Counter()
    rows = []
    for phase in schedule.phases():
        mine = [o for o in outcomes if o.phase == phase and not o.kind]
        big = [o for o in outcomes if o.phase == phase and o.kind]
        answered = [o for o in mine if o.status == 200]
        latencies = [o.latency_s for o in answered if o.latency_s is not None]
        failed = Counter(str(o.status) for o in mine if o.status is not None and o.status != 200)
        lost = [o for o in [*mine, *big] if o.status is None and o.error != "skipped"]
        rows.append(
            {
                "phase": phase,
                "sent": sum(o.error != "skipped" for o in mine),
                "skipped": sum(o.error == "skipped" for o in mine),
                "answered": len(answered),
                "failed_by_status": dict(sorted(failed.items())),
                "lost": len(lost),
                "lost_errors": dict(Counter(o.error + (f" ({o.kind})" if o.kind else "") for o in lost)),
                "wrong": sum(o.wrong for o in answered)
                + sum(o.wrong for o in big if o.status is not None)
                + wrong_decisions[phase],
                "wrong_decisions": wrong_decisions[phase],
                "oversized_sent": len(big),
                "refused": sum(o.status is not None and not o.wrong for o in big),
                "exact_hits": sum(o.cache == "exact" for o in answered),
                "semantic_hits": sum(o.cache == "semantic" for o in answered),
                "p50_ms": None if not latencies else round(1000 * statistics.median(latencies), 1),
                "p99_ms": None if not latencies else round(1000 * (_pct(latencies, 0.99) or 0), 1),
            }
        )
    base = next(row["p99_ms"] for row in rows if row["phase"] == "baseline")
    for row in rows:
        row["p99_x"] = None if not base or row["p99_ms"] is None else round(row["p99_ms"] / base, 2)
    return rows


def oversized_summary(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    """Per OVERSIZE kind: sent, refused as expected, wrong (another answer), lost, and the
    statuses and latencies seen."""
    out = {}
    for kind in OVERSIZE:
        mine = [o for o in outcomes if o.kind == kind]
        out[kind] = {
            "sent": len(mine),
            "refused": sum(o.status is not None and not o.wrong for o in mine),
            "wrong": sum(o.status is not None and o.wrong for o in mine),
            "lost": sum(o.status is None for o in mine),
            "statuses": dict(Counter(str(o.status if o.status is not None else o.error) for o in mine)),
            "max_latency_ms": max((round(1000 * o.latency_s, 1) for o in mine if o.latency_s), default=None),
        }
    return out


def render(rows: list[dict[str, Any]], faults: list[dict]) -> str:
    header = ("phase", "sent", "200", "failed", "lost", "wrong", "refused", "exact", "sem", "p50 ms", "p99 ms", "p99 x")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        failed = ", ".join(f"{k}: {v}" for k, v in r["failed_by_status"].items()) or "0"
        refused = f"{r['refused']}/{r['oversized_sent']}" if r["oversized_sent"] else "-"
        cells = (
            r["phase"],
            r["sent"],
            r["answered"],
            failed,
            r["lost"],
            r["wrong"],
            refused,
            r["exact_hits"],
            r["semantic_hits"],
            r["p50_ms"],
            r["p99_ms"],
            r["p99_x"],
        )
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    lines.append("faults: " + "; ".join(f"{f['action']} at {f['at_s']} s" for f in faults))
    return "\n".join(lines)


@app.command()
def main(
    minutes: float = typer.Option(3.0, min=0.5, max=60, help="Length of the load, minutes."),
    rate: float = typer.Option(5.0, min=0.5, max=200, help="Requests per second (open loop)."),
    replicas: int = typer.Option(3, min=3, max=8, help="Simulated replicas (three take faults)."),
    router_workers: int = typer.Option(2, min=2, max=8, help="Router worker processes (one is restarted)."),
    worker_signal: str = typer.Option(
        "TERM",
        help="Signal of the worker restart: TERM (graceful, a rolling "
        "restart) or KILL (a crash: its requests in flight are lost).",
    ),
    semantic: bool = typer.Option(True, "--semantic/--no-semantic", help="The router's semantic cache stage."),
    json_path: Path = typer.Option(None, "--json", help="Write the report as JSON here."),
    log_dir: Path = typer.Option(Path("out/soak-logs"), help="Folder for the processes' logs."),
    seed: int = typer.Option(0, help="Seed of the prompts and their mix."),
) -> None:
    """Run the soak and print one table row per phase; exit 1 when a request was lost or wrong."""
    schedule = Schedule.of(minutes * 60)
    with Stack(log_dir) as stack:
        soak = SoakStack(stack, replicas, semantic, router_workers, rate)
        if worker_signal.upper() not in ("TERM", "KILL"):
            raise typer.BadParameter(f"--worker-signal is TERM or KILL, not {worker_signal!r}")
        soak.worker_signal = signal.Signals["SIG" + worker_signal.upper()]
        try:
            soak.start()
            start_wall = time.time()
            outcomes, faults = asyncio.run(run_load(soak, schedule, rate, seed))
            decisions = soak.decisions()
        except StackError as exc:
            typer.echo(f"error: {exc}\n(logs in {log_dir})", err=True)
            raise typer.Exit(1) from None
        finally:
            soak.stop()
    forecaster = forecaster_report(decisions, faults, schedule, start_wall)
    rows = summarise(outcomes, schedule, Counter(v["phase"] for v in forecaster["violations"]))
    oversized = oversized_summary(outcomes)
    typer.echo(render(rows, faults))
    typer.echo(
        "oversized: "
        + "; ".join(
            f"{k}: {v['refused']}/{v['sent']} refused, {v['lost']} lost, {v['wrong']} wrong"
            for k, v in oversized.items()
        )
    )
    typer.echo(
        f"forecaster: decisions per process {forecaster['decisions_per_process']}, "
        f"{len(forecaster['violations'])} wrong after the restart, {len(forecaster['below_max'])} below "
        f"the maximum {FORECAST_MAX}"
    )
    totals = {
        "sent": sum(r["sent"] for r in rows),
        "lost": sum(r["lost"] for r in rows),
        "wrong": sum(r["wrong"] for r in rows),
        "failed": sum(sum(r["failed_by_status"].values()) for r in rows),
        "refused": sum(r["refused"] for r in rows),
        "oversized_sent": sum(r["oversized_sent"] for r in rows),
    }
    totals["lost_at_worker_kill"] = len(lost_at_worker_kill(outcomes, faults))
    typer.echo(f"totals: {totals}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "config": {
                "minutes": minutes,
                "rate": rate,
                "replicas": replicas,
                "router_workers": router_workers,
                "semantic": semantic,
                "seed": seed,
                "popular_prompts": POPULAR,
                "repeat_share": 0.4,
                "client_timeout_s": CLIENT_TIMEOUT_S,
                "router_p1_ttfb_s": ROUTER_TTFB_S,
                "router_stuck_after_s": STUCK_AFTER_S,
                "max_body_bytes": MAX_BODY_BYTES,
                "max_header_bytes": MAX_HEADER_BYTES,
            },
            "faults": faults,
            "phases": rows,
            "failures": [
                {
                    "sent_at_s": round(o.sent_at, 2),
                    "phase": o.phase,
                    "kind": o.kind or "completion",
                    "status": o.status,
                    "error": o.error,
                    "detail": o.detail,
                    "ended_at_s": None if o.ended_at is None else round(o.ended_at, 2),
                }
                for o in outcomes
                if o.error != "skipped"
                and (o.status != 200 or o.wrong)
                and not (o.kind and o.status is not None and not o.wrong)
            ],
            "oversized": oversized,
            "forecaster": forecaster,
            "totals": totals,
        }
        json_path.write_text(json.dumps(report, indent=2))
        typer.echo(f"report written to {json_path}")
    if totals["lost"] or totals["wrong"]:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
