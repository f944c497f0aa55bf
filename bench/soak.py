"""Soak: the real stack on loopback under a fixed request rate, with faults on a schedule.

    python bench/soak.py [--minutes 3] [--rate 5] [--replicas 3] [--json out/soak.json] [--no-semantic]

Starts a ``redis-server`` on a free port, ``--replicas`` simulated replicas (``python -m sim
serve``, a100 profile) and ``python -m router serve``, all as child processes on 127.0.0.1;
sends non-stream ``/v1/completions`` at ``--rate`` requests per second (open loop: a request
is sent on schedule whether or not earlier ones have answered) for ``--minutes``; meanwhile:

1. Redis is killed (SIGKILL) and restarted on the same port 10 % of the run later;
2. replica 0 is killed (SIGKILL) and restarted on the same port 8 % later;
3. replica 1 hangs (``POST /sim/faults {"hang": true}``) and is released 11 % later.

Each request is counted in the phase it was sent in (``warmup``: the first 5 % of the run, at
most 10 s, while the processes' first requests warm their caches; ``baseline``; each fault; and
the time after each fault until the next one), so every fault has a before, a during and an after.
Per phase: requests sent, answered (200), failed by status, **lost** (no HTTP answer at all
within the client's 30 s: a connection error or timeout), **wrong** (a 200 whose answer is not
the one for its own question), exact and semantic cache hits, and p50/p99 latency of the
answered ones. The baseline phase is the comparison point: ``p99_x`` is a phase's p99 over the
baseline's.

Wrong answers: prompts are random word sequences with a serial number, 40 % of them repeats of
50 popular ones (exact cache hits), the rest fresh (misses); each asks ``"echo": true`` with ``max_tokens`` chosen by the prompt; the
simulated replica answers ``prompt + max_tokens filler words`` deterministically (sim/README.md,
Echo), so an answer for any other request, from a replica or the cache, is detected.

The router runs with ``PROMPTEDGE_ROUTER_TIMEOUTS`` P1 ``ttfb_s`` 10 s (a hung replica's
requests become 504 after 10 s instead of the default 120 s, which would outlast a short
soak). Process logs go to ``--log-dir``. Loops are bounded: requests = rate x duration;
at most 512 in flight (more are counted as ``skipped``, never queued without bound).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.replica.tokens import filler  # noqa: E402
from sim.stack import RedisServer, Stack, StackError, free_port  # noqa: E402

MODEL = "sim-llama-8b"
POPULAR = 50
CLIENT_TIMEOUT_S = 30.0
MAX_IN_FLIGHT = 512
WORDS = ("amber basil cedar delta ember fjord garnet harbor iris juniper kelp lumen marble nectar onyx "
         "prism quartz raven sable tundra umber violet willow xenon yarrow zephyr anvil bramble cobalt "
         "dune falcon glacier hazel indigo jasper kestrel lotus meadow nimbus orchid pebble").split()

app = typer.Typer(add_completion=False)


@dataclass
class Outcome:
    """One request: when it was sent (s since start), its phase, and what came back."""

    sent_at: float
    phase: str
    status: int | None = None  # None: lost (no HTTP answer)
    latency_s: float | None = None
    wrong: bool = False
    cache: str = ""
    error: str = ""


@dataclass
class Schedule:
    """Fault times in seconds since the start of the load, from fractions of the run."""

    duration_s: float
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (at, action, phase it opens)

    @classmethod
    def of(cls, duration_s: float) -> Schedule:
        d = duration_s
        return cls(d, [
            (min(10.0, 0.05 * d), "", "baseline"),
            (0.15 * d, "kill_redis", "redis_down"),
            (0.25 * d, "start_redis", "after_redis"),
            (0.40 * d, "kill_replica", "replica_killed"),
            (0.48 * d, "start_replica", "after_replica_restart"),
            (0.64 * d, "hang_replica", "replica_hung"),
            (0.75 * d, "release_replica", "after_hang_released"),
        ])

    def phase_at(self, t: float) -> str:
        phase = "warmup"
        for at, _, opens in self.events:
            if t >= at:
                phase = opens
        return phase

    def phases(self) -> list[str]:
        return ["warmup", *(opens for _, _, opens in self.events)]


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
        return (answer["model"] == MODEL and answer["choices"][0]["text"] == prompt + filler(0, max_tokens)
                and answer["usage"]["completion_tokens"] == max_tokens)
    except (KeyError, IndexError, TypeError):
        return False


class SoakStack:
    """Redis, the replicas and the router as child processes; the fault actions."""

    def __init__(self, stack: Stack, replicas: int, semantic: bool) -> None:
        self.stack = stack
        self.redis = RedisServer()
        self.replica_ports = [free_port() for _ in range(replicas)]
        self.replica_children: dict[int, Any] = {}
        self.router_port = free_port()
        self.semantic = semantic

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def replica_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.replica_ports[i]}"

    def start_replica(self, i: int) -> None:
        self.replica_children[i] = self.stack.spawn(
            f"replica-{i}", ["sim", "serve", "--port", str(self.replica_ports[i]), "--model", MODEL])

    def start(self) -> None:
        self.redis.start()
        for i in range(len(self.replica_ports)):
            self.start_replica(i)
        replicas = [{"url": self.replica_url(i), "model": MODEL} for i in range(len(self.replica_ports))]
        env = {
            "PROMPTEDGE_REDIS_URL": self.redis.url,
            "PROMPTEDGE_ROUTER_REPLICAS": json.dumps(replicas),
            "PROMPTEDGE_ROUTER_PORT": str(self.router_port),
            "PROMPTEDGE_ROUTER_LOG_REQUESTS": "false",
            "PROMPTEDGE_ROUTER_TIMEOUTS": json.dumps({"P1": {"connect_s": 1, "ttfb_s": 10, "idle_s": 10}}),
            "PROMPTEDGE_CACHE_SEMANTIC_ENABLED": "true" if self.semantic else "false",
        }
        self.stack.spawn("router", ["router", "serve", "--log-level", "warning"], env=env)
        self.stack.wait_healthy({"router": self.router_url, **{f"replica-{i}": self.replica_url(i)
                                                               for i in range(len(self.replica_ports))}},
                                timeout_s=180)

    async def act(self, action: str, client: httpx.AsyncClient) -> None:
        """Run one fault action (the blocking ones in a thread: the load keeps its schedule)."""
        if action == "kill_redis":
            self.redis.kill()
        elif action == "start_redis":
            await asyncio.to_thread(self.redis.start)
        elif action == "kill_replica":
            os.killpg(self.replica_children[0].process.pid, signal.SIGKILL)
            await asyncio.to_thread(self.replica_children[0].process.wait)
        elif action == "start_replica":
            self.start_replica(0)
        elif action in ("hang_replica", "release_replica"):
            await client.post(f"{self.replica_url(1)}/sim/faults", json={"hang": action == "hang_replica"})

    def stop(self) -> None:
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
    if response.status_code == 200:
        try:
            out.wrong = not check(response.json(), prompt, max_tokens)
        except ValueError:
            out.wrong = True


async def run_load(soak: SoakStack, schedule: Schedule, rate: float, seed: int) -> tuple[list[Outcome], list[dict]]:
    """Send rate x duration requests on schedule, run the fault actions at their times."""
    prompts = Prompts(seed)
    outcomes: list[Outcome] = []
    faults: list[dict] = []
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)
    url = f"{soak.router_url}/v1/completions"
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        start = time.monotonic()
        pending_events = list(schedule.events)
        total = int(rate * schedule.duration_s)
        for i in range(total):
            at = i / rate
            while pending_events and pending_events[0][0] <= at:
                event_at, action, _ = pending_events.pop(0)
                await asyncio.sleep(max(0.0, start + event_at - time.monotonic()))
                t0 = time.monotonic() - start
                if not action:  # a phase boundary without a fault (end of warm-up)
                    continue
                await soak.act(action, client)
                faults.append({"action": action, "at_s": round(t0, 2), "took_s": round(time.monotonic() - start - t0, 2)})
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            out = Outcome(sent_at=time.monotonic() - start, phase=schedule.phase_at(at))
            outcomes.append(out)
            if len(tasks) >= MAX_IN_FLIGHT:
                out.error = "skipped"
                continue
            prompt, max_tokens = prompts.next()
            task = asyncio.create_task(_one(client, url, prompt, max_tokens, out))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    return outcomes, faults


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(outcomes: list[Outcome], schedule: Schedule) -> list[dict[str, Any]]:
    """One row per phase, in schedule order."""
    rows = []
    for phase in schedule.phases():
        mine = [o for o in outcomes if o.phase == phase]
        answered = [o for o in mine if o.status == 200]
        latencies = [o.latency_s for o in answered if o.latency_s is not None]
        failed = Counter(str(o.status) for o in mine if o.status is not None and o.status != 200)
        rows.append({
            "phase": phase,
            "sent": sum(o.error != "skipped" for o in mine),
            "skipped": sum(o.error == "skipped" for o in mine),
            "answered": len(answered),
            "failed_by_status": dict(sorted(failed.items())),
            "lost": sum(o.status is None and o.error != "skipped" for o in mine),
            "lost_errors": dict(Counter(o.error for o in mine if o.status is None and o.error != "skipped")),
            "wrong": sum(o.wrong for o in answered),
            "exact_hits": sum(o.cache == "exact" for o in answered),
            "semantic_hits": sum(o.cache == "semantic" for o in answered),
            "p50_ms": None if not latencies else round(1000 * statistics.median(latencies), 1),
            "p99_ms": None if not latencies else round(1000 * (_pct(latencies, 0.99) or 0), 1),
        })
    base = next(row["p99_ms"] for row in rows if row["phase"] == "baseline")
    for row in rows:
        row["p99_x"] = None if not base or row["p99_ms"] is None else round(row["p99_ms"] / base, 2)
    return rows


def render(rows: list[dict[str, Any]], faults: list[dict]) -> str:
    header = ("phase", "sent", "200", "failed", "lost", "wrong", "exact", "sem", "p50 ms", "p99 ms", "p99 x")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        failed = ", ".join(f"{k}: {v}" for k, v in r["failed_by_status"].items()) or "0"
        cells = (r["phase"], r["sent"], r["answered"], failed, r["lost"], r["wrong"], r["exact_hits"],
                 r["semantic_hits"], r["p50_ms"], r["p99_ms"], r["p99_x"])
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    lines.append("faults: " + "; ".join(f"{f['action']} at {f['at_s']} s" for f in faults))
    return "\n".join(lines)


@app.command()
def main(
    minutes: float = typer.Option(3.0, min=0.5, max=60, help="Length of the load, minutes."),
    rate: float = typer.Option(5.0, min=0.5, max=200, help="Requests per second (open loop)."),
    replicas: int = typer.Option(3, min=2, max=8, help="Simulated replicas (two take faults)."),
    semantic: bool = typer.Option(True, "--semantic/--no-semantic", help="The router's semantic cache stage."),
    json_path: Path = typer.Option(None, "--json", help="Write the report as JSON here."),
    log_dir: Path = typer.Option(Path("out/soak-logs"), help="Folder for the processes' logs."),
    seed: int = typer.Option(0, help="Seed of the prompts and their mix."),
) -> None:
    """Run the soak and print one table row per phase."""
    schedule = Schedule.of(minutes * 60)
    with Stack(log_dir) as stack:
        soak = SoakStack(stack, replicas, semantic)
        try:
            soak.start()
            outcomes, faults = asyncio.run(run_load(soak, schedule, rate, seed))
        except StackError as exc:
            typer.echo(f"error: {exc}\n(logs in {log_dir})", err=True)
            raise typer.Exit(1) from None
        finally:
            soak.stop()
    rows = summarise(outcomes, schedule)
    typer.echo(render(rows, faults))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        report = {"config": {"minutes": minutes, "rate": rate, "replicas": replicas, "semantic": semantic,
                             "seed": seed, "popular_prompts": POPULAR, "repeat_share": 0.4, "client_timeout_s": CLIENT_TIMEOUT_S,
                             "router_p1_ttfb_s": 10},
                  "faults": faults, "phases": rows,
                  "totals": {"sent": sum(r["sent"] for r in rows), "lost": sum(r["lost"] for r in rows),
                             "wrong": sum(r["wrong"] for r in rows)}}
        json_path.write_text(json.dumps(report, indent=2))
        typer.echo(f"report written to {json_path}")


if __name__ == "__main__":
    app()
