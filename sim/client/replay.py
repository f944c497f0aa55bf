"""Load generator: replays a trace against any OpenAI-compatible endpoint.

Arrivals keep the trace's gaps divided by ``speedup`` (60 -> one trace minute per wall
second). Prompts come from a :class:`~sim.client.questions.QuestionMix`. Request parameters belong to
the question: ``max_tokens`` is the trace's generated-token count (at least 1) of the row where
the question, or for a paraphrase or near miss its source question, first appeared, so a
repeated question is a byte-identical request (as a repeating client sends) and a paraphrase
differs from its source in the text only. The trace's context tokens are not sent by default:
the prompt is the question alone. With ``pad_context`` a system message of filler pads the
prompt to the context size of the source's first row (capped), so replicas do realistic
prefill work; repeats stay identical, paraphrases get their source's padding. The padding is
the source question's own text (drawn from its hash), so different questions share no prompt
prefix and replicas' prefix caches (sim/replica/latency/prefix.py) reuse only what repeats repeat.

With ``shared_prefixes`` a trace row that has prefix block ids (Mooncake ``hash_ids``) is sent
instead as one user message made of its blocks' texts (sim/client/prefix_text.py), trimmed to its
context tokens (capped at ``max_context_tokens``), with its own generated-token count as
``max_tokens``: requests share exactly the prefixes the trace says they share, so replicas'
prefix caches and the router's prefix-aware dispatch see the trace's reuse. Such requests
are of kind ``new``; rows without block ids are planned as above.

Every request is sent with ``stream: true`` (TTFT is measured at the first content chunk)
unless ``stream`` is off. ``X-Cache`` and ``X-PromptEdge-Replica`` response headers are
recorded per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from sim.client.prefix_text import BLOCK_TOKENS, prompt_from_blocks
from sim.client.questions import Kind, QuestionMix
from sim.client.traces import TraceRequest


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay. ``duration_s``: wall seconds of arrivals to send (None = whole trace);
    ``sample_fraction``: keep each trace request with this probability (seeded), to thin a
    trace that is too heavy for the machine; ``concurrency``: most requests in flight."""

    target: str
    model: str = "sim-llama-8b"
    speedup: float = 60.0
    duration_s: float | None = None
    concurrency: int = 256
    stream: bool = True
    pad_context: bool = False
    shared_prefixes: bool = False
    max_context_tokens: int = 6000
    sample_fraction: float = 1.0
    seed: int = 0
    timeout_s: float = 300.0
    progress: bool = True
    progress_label: str = "replay"  # the progress bar's name (the loop names the policy)

    def __post_init__(self) -> None:
        if self.speedup <= 0 or not 0 < self.sample_fraction <= 1 or self.concurrency < 1:
            raise ValueError("need speedup > 0, 0 < sample_fraction <= 1 and concurrency >= 1")


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the plan; ``source``: the question whose meaning it asks
    (sim/client/questions.py ``Prompt.source``; "" for a synthetic shared-prefix prompt)."""

    at_s: float
    kind: Kind
    max_tokens: int
    body: dict[str, Any]
    source: str = ""


@dataclass
class Outcome:
    """What happened to one request. Times in seconds; ``cache``: X-Cache header value;
    ``sent_s``: perf_counter() when it was sent; ``prompt``: identity of its body (identical
    bodies, identical prompt), for checking that a repeat after an answer hits; ``source``: the
    question it asks (PlannedRequest.source); ``answer_id``: the answer's ``id`` (a cached
    answer keeps the id the replica gave it, so a hit names the request that made its entry)."""

    kind: Kind
    ok: bool
    error: str | None
    latency_s: float
    ttft_s: float | None
    cache: str | None
    replica: str | None
    lag_s: float
    sent_s: float = 0.0
    prompt: str = ""
    source: str = ""
    answer_id: str | None = None


def _padding(tokens: int, source: str) -> str:
    # ~4 characters per token, the same estimate the sim uses for prompts. The text is the
    # source question's own (blocks drawn from its hash): one padding shared by every request
    # would make every padded prompt a prefix-cache hit on the replicas (sim/replica/latency/prefix.py).
    seed = int.from_bytes(hashlib.blake2b(source.encode(), digest_size=8).digest(), "big")
    return prompt_from_blocks([seed + k for k in range(tokens // BLOCK_TOKENS + 1)], tokens)


def plan_requests(trace: list[TraceRequest], mix: QuestionMix, cfg: ReplayConfig) -> list[PlannedRequest]:
    """Deterministic request plan: arrival (wall s from start), kind, max_tokens, body."""
    rng = random.Random(cfg.seed)
    params_for: dict[str, tuple[int, int]] = {}  # source question -> (max_tokens, padding tokens)
    plan = []
    for row in trace:
        at = row.offset_s / cfg.speedup
        if cfg.duration_s is not None and at >= cfg.duration_s:
            break
        if cfg.sample_fraction < 1 and rng.random() >= cfg.sample_fraction:
            continue
        if cfg.shared_prefixes and row.hash_ids:
            plan.append(_shared_prefix_request(row, at, cfg))
            continue
        prompt = mix.next()
        wanted_pad = max(0, min(row.context_tokens, cfg.max_context_tokens) - len(prompt.source) // 4)
        max_tokens, pad = params_for.setdefault(prompt.source, (max(1, row.generated_tokens), wanted_pad))
        messages = [{"role": "user", "content": prompt.text}]
        if cfg.pad_context and pad:
            messages.insert(0, {"role": "system", "content": _padding(pad, prompt.source)})
        body: dict[str, Any] = {"model": cfg.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        if cfg.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        plan.append(PlannedRequest(at, prompt.kind, max_tokens, body, prompt.source))
    return plan


def _shared_prefix_request(row: TraceRequest, at: float, cfg: ReplayConfig) -> PlannedRequest:
    text = prompt_from_blocks(row.hash_ids, max(1, min(row.context_tokens, cfg.max_context_tokens)))
    max_tokens = max(1, row.generated_tokens)
    body: dict[str, Any] = {
        "model": cfg.model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if cfg.stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return PlannedRequest(at, "new", max_tokens, body)


def _has_content(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or choice.get("text"):
            return True
    return False


async def _send(client: httpx.AsyncClient, req: PlannedRequest, lag: float) -> Outcome:
    t0 = time.perf_counter()
    ttft: float | None = None
    headers: httpx.Headers = httpx.Headers()
    answer_id: str | None = None

    def done(ok: bool, error: str | None) -> Outcome:
        return Outcome(
            req.kind,
            ok,
            error,
            time.perf_counter() - t0,
            ttft,
            headers.get("x-cache"),
            headers.get("x-promptedge-replica"),
            lag,
            t0,
            json.dumps(req.body, sort_keys=True),
            req.source,
            answer_id,
        )

    try:
        if req.body.get("stream"):
            async with client.stream("POST", "/v1/chat/completions", json=req.body) as resp:
                headers = resp.headers
                if resp.status_code != 200:
                    await resp.aread()
                    return done(False, f"HTTP {resp.status_code}")
                finished = False
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        finished = True
                        break
                    chunk = json.loads(data)
                    if answer_id is None and isinstance(chunk.get("id"), str):
                        answer_id = chunk["id"]
                    if ttft is None and _has_content(chunk):
                        ttft = time.perf_counter() - t0
                if not finished or ttft is None:
                    return done(False, "malformed stream")
                return done(True, None)
        resp = await client.post("/v1/chat/completions", json=req.body)
        headers = resp.headers
        if resp.status_code != 200:
            return done(False, f"HTTP {resp.status_code}")
        answer = resp.json()
        answer_id = answer.get("id") if isinstance(answer.get("id"), str) else None
        content = answer["choices"][0]["message"]["content"]
        return done(isinstance(content, str), None if isinstance(content, str) else "malformed body")
    except httpx.HTTPError as exc:
        return done(False, type(exc).__name__)
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        return done(False, "malformed body")


async def run_plan(
    plan: list[PlannedRequest], cfg: ReplayConfig, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[list[Outcome], float]:
    """Send the plan on its schedule; returns (outcomes in plan order, wall seconds)."""
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=10.0)
    sem = asyncio.Semaphore(cfg.concurrency)
    outcomes: list[Outcome | None] = [None] * len(plan)
    bar = tqdm(total=len(plan), unit="req", disable=not cfg.progress, desc=cfg.progress_label, mininterval=0.5)
    async with httpx.AsyncClient(base_url=cfg.target, limits=limits, timeout=timeout, transport=transport) as client:

        async def worker(i: int, req: PlannedRequest, lag: float) -> None:
            try:
                outcomes[i] = await _send(client, req, lag)
            finally:
                sem.release()
                bar.update()

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for i, req in enumerate(plan):
            delay = start + req.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            tasks.append(asyncio.create_task(worker(i, req, max(0.0, loop.time() - start - req.at_s))))
        await asyncio.gather(*tasks)
        wall = loop.time() - start
    bar.close()
    return [o for o in outcomes if o is not None], wall
