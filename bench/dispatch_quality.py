"""Dispatch quality: each policy's TTFT, latency and balance on real traces, 4 mixed replicas.

    python bench/dispatch_quality.py [--json PATH] [--requests N] [--offset N] [--azure-speedup X ...]

A discrete-event simulation in virtual time (the loop of bench/vtime.py, shared with
bench/prefix_dispatch.py), so a whole policy comparison takes seconds of CPU on a shared 2-core
machine and is exactly repeatable:

- replicas: 2 x ``a100`` and 2 x ``t4`` profiles of ``sim`` (``sim.replica.latency.batch.BatchModel``: the
  same continuous-batching model the simulated vLLM replica serves with), each running its
  engine steps back to back while it has work; a request that arrives during a step joins at
  the next step boundary, as in the sim's engine loop;
- the router: ``router.dispatch.pick`` (the production code, unchanged) over ``ReplicaView``
  snapshots built as the router builds them: a metrics scrape every 0.25 s (waiting, running,
  KV usage), its age, the router's exact in-flight count and that count at scrape time, and
  the replica's learned speed: each finished request is folded in with ``router.dispatch.speed.sample``
  and ``router.dispatch.speed.observe`` (seconds from dispatch to the last token per token of work),
  the same calls the router makes when an answer ends, on the same clock as ``Context.now``
  (virtual time here, ``time.monotonic()`` in the router);
- traffic: the first N requests of the Azure LLM 2023 conversation trace and of the Mooncake
  conversation trace (real arrival times and token counts), arrival times divided by the
  speed-up so the fleet is loaded. Requests too long for a T4 (prompt + output over its
  ``max_model_len``) may only go to the A100s, under every policy; Mooncake prompts longer
  than the A100's ``max_model_len`` are clipped to it.

Reported per trace and policy: TTFT p50/p99, end-to-end p99 (ms), throughput (completed
requests per second of virtual time) and the hotspot factor (replicas x the largest replica's
share of requests; 1.0 = perfectly even). Defaults: the Azure trace at its real speed (x1),
Mooncake slowed to x0.5 (its long prompts overload 4 sim replicas at x1); at both, round robin's
TTFT p99 exceeds 2 s.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vtime import Job, SimReplica, replay  # noqa: E402
from router.dispatch import Weights, pick  # noqa: E402
from sim import A100, T4, BatchModel  # noqa: E402
from sim.client.traces import read_trace  # noqa: E402

POLICIES = ("round_robin", "least_request", "power_of_two", "gpu_load")
FLEET = (A100, A100, T4, T4)
TRACES = {
    "azure_conv": "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "mooncake": "traces/mooncake/conversation_trace.jsonl",
}


def run(requests: list[tuple[float, int, int]], policy: str, seed: int = 0) -> dict[str, float]:
    """Simulate one policy over ``requests`` = [(arrival_s, prompt_tokens, max_tokens)]."""
    replicas = [SimReplica(f"r{i}-{p.name}", p, BatchModel(p)) for i, p in enumerate(FLEET)]
    weights = Weights(stale_after_s=1.0)
    jobs = [Job(at, prompt, out) for at, prompt, out in requests]

    def fits(i: int) -> list[int]:  # a request too long for a T4 may only go to the A100s
        return [r for r, rep in enumerate(replicas) if jobs[i].prompt + jobs[i].output <= rep.profile.max_model_len]

    timeline = replay(
        jobs, replicas, lambda i, views, ctx: pick(views, policy, ctx, weights).key, random.Random(seed), eligible=fits
    )
    first, done = timeline.first_token, timeline.done
    ttft = np.array([(first[i] - requests[i][0]) * 1000 for i in done])
    e2e = np.array([(done[i] - requests[i][0]) * 1000 for i in done])
    span = max(done.values()) - requests[0][0]
    shares = [rep.served / len(requests) for rep in replicas]
    return {
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1),
        "e2e_p99_ms": round(float(np.percentile(e2e, 99)), 1),
        "throughput_rps": round(len(done) / span, 3),
        "hotspot": round(len(replicas) * max(shares), 3),
        "share": {rep.key: round(s, 3) for rep, s in zip(replicas, shares, strict=True)},
    }


def load(data_dir: Path, trace: str, n: int, speedup: float, offset: int = 0) -> list[tuple[float, int, int]]:
    """``n`` requests of a trace from its ``offset``-th as (arrival_s / speedup, prompt, output),
    arrivals counted from the first of them, the prompt clipped so that prompt + output fits
    the largest replica."""
    cap = max(p.max_model_len for p in FLEET)
    rows = read_trace(data_dir / TRACES[trace])[offset : offset + n]
    start = rows[0].offset_s if rows else 0.0
    out = []
    for row in rows:
        gen = max(1, min(row.generated_tokens, cap // 2))
        prompt = max(1, min(row.context_tokens, cap - gen))
        out.append(((row.offset_s - start) / speedup, prompt, gen))
    return out


def main(
    json_path: Path = typer.Option(None, "--json", help="Write {trace: {policy: {...}}} here."),
    data_dir: Path = typer.Option(
        ROOT.parent / "shared" / "data", envvar="PROMPTEDGE_DATA_DIR", help="The shared real-data folder."
    ),
    requests: int = typer.Option(2000, help="Requests replayed from each trace."),
    offset: int = typer.Option(0, help="Skip this many requests of each trace first (another window)."),
    azure_speedup: float = typer.Option(1.0, help="Time compression of the Azure conv trace."),
    mooncake_speedup: float = typer.Option(0.5, help="Time compression of the Mooncake trace."),
) -> None:
    """Replay both traces under every policy; print a table and write JSON."""
    results: dict[str, dict[str, object]] = {}
    for trace, speedup in (("azure_conv", azure_speedup), ("mooncake", mooncake_speedup)):
        reqs = load(data_dir, trace, requests, speedup, offset)
        offered = len(reqs) / (reqs[-1][0] - reqs[0][0])
        results[trace] = {"speedup": speedup, "requests": len(reqs), "offered_rps": round(offered, 2)}
        for policy in POLICIES:
            results[trace][policy] = run(reqs, policy)
    print_table(results)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2))


def print_table(results: dict[str, dict[str, object]]) -> None:
    print("| trace (speed-up, offered req/s) | policy | TTFT p50 ms | TTFT p99 ms | e2e p99 ms | req/s | hotspot |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for trace, entry in results.items():
        label = f"{trace} (x{entry['speedup']}, {entry['offered_rps']})"
        for policy in POLICIES:
            r = entry[policy]  # type: ignore[index]
            print(
                f"| {label} | {policy} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['e2e_p99_ms']:.0f} "
                f"| {r['throughput_rps']:.2f} | {r['hotspot']:.2f} |"
            )
        rr, gl = entry["round_robin"]["ttft_p99_ms"], entry["gpu_load"]["ttft_p99_ms"]  # type: ignore[index]
        print(f"| {label} | gpu_load vs round_robin TTFT p99 | {rr / max(gl, 1e-9):.1f}x lower | | | | |")


if __name__ == "__main__":
    typer.run(main)
