"""Relaying a replica's SSE stream to the client, byte for byte, while assembling it.

Timeouts (per priority, ``RouterSettings.timeouts``): the first chunk must come within
``ttfb_s``, each next one within ``idle_s``. A failure after the headers went out cannot change the status, so
the client gets one clean error event (``data: {"error": ...}``) and ``data: [DONE]``; the
partial answer is never cached. However the stream ends (done, failed, client gone), the
lease is released once, the upstream connection is closed (so the replica aborts), and the
request is accounted for.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from opentelemetry.trace import Tracer
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cache import CacheRequest, usage_tokens
from router.errors import APIError, UpstreamError, UpstreamTimeout
from router.fleet.health import judged_ttft
from router.fleet.replicas import Lease
from router.forward.ratelimit import RateLimiter
from router.forward.storing import AnswerStore
from router.forward.upstream import iter_body
from router.observe.counters import TrafficCounters
from router.observe.metrics import RouterMetrics
from router.observe.record import Record
from router.settings import Timeouts
from router.stream.sse import DONE, StreamAssembler, UsageFilter


@dataclass(frozen=True)
class Relaying:
    """What relaying a stream uses besides the stream itself (built once, by the Forwarder):
    ``answers`` where a complete answer is stored; ``timeouts`` per priority class; where the
    request is accounted when its stream ends: ``counters`` (the forecaster's traffic),
    ``metrics`` and ``tracer`` (Record.finish), ``limiter`` (the real usage settles admission)."""

    answers: AnswerStore
    timeouts: Mapping[str, Timeouts]
    counters: TrafficCounters
    metrics: RouterMetrics
    tracer: Tracer | None
    limiter: RateLimiter


class RelayResponse(StreamingResponse):
    """A streamed response whose ``on_close`` runs exactly once however the stream ends
    (finished, failed, client disconnected, or never started)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A disconnect cancels this task; the clean-up must not be cancelled half-way.
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self._on_close()


def relay_stream(
    relaying: Relaying,
    rec: Record,
    store: CacheRequest | None,
    upstream: httpx.Response,
    lease: Lease,
    headers: dict[str, str],
    strip_usage: bool = False,
    assembler: StreamAssembler | None = None,
    on_chunk: Callable[[], Awaitable[None]] | None = None,
) -> RelayResponse:
    """The client response for an open upstream SSE response; a complete stream is stored in
    the cache under ``store`` (None: not stored) unless its answer is over the cache's
    ``max_entry_bytes`` (then it is relayed whole but no longer assembled, and counted
    ``too_large``, router/forward/storing.py). ``strip_usage``: the router asked the replica
    for the usage chunk on the client's behalf (it did not ask for ``include_usage``): the
    client's stream goes out event by event without it; it is still counted and stored.
    ``assembler``: what reads the stream (default: a chat/completions StreamAssembler; the
    Responses API has its own, router/api/responses.py); ``on_chunk``: awaited after each chunk
    is read and before it is relayed."""
    if assembler is None:  # bounded by the cache's entry size: past it, relayed but not assembled
        assembler = StreamAssembler(relaying.answers.max_entry_bytes)
    usage_filter = UsageFilter() if strip_usage else None
    url = lease.replica.url
    rec.deferred = True
    failed: list[APIError] = []
    timeouts = relaying.timeouts[rec.priority]

    async def relay() -> AsyncIterator[bytes]:
        chunks = iter_body(upstream, url).__aiter__()
        timeout = timeouts.ttfb_s
        try:
            while True:
                try:
                    with anyio.fail_after(timeout):
                        chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise UpstreamTimeout(
                        f"replica {url} sent nothing for {timeout} s", code="replica_timeout"
                    ) from None
                if rec.first_byte_at is None:
                    rec.first_byte_at = time.perf_counter()
                    timeout = timeouts.idle_s
                    if rec.forwarded_at is not None:
                        lease.first_token(rec.first_byte_at - rec.forwarded_at)
                    lease.first_byte()
                lease.advanced()  # the replica generates: not stuck (router/fleet/progress.py)
                assembler.feed(chunk)
                if on_chunk is not None:
                    await on_chunk()
                if usage_filter is not None:
                    chunk = usage_filter.feed(chunk)
                if chunk:
                    yield chunk
            if usage_filter is not None and (rest := usage_filter.flush()):
                yield rest
            if not assembler.done:
                raise UpstreamError(f"replica {url} ended its stream without [DONE]", code="replica_error")
        except APIError as exc:
            failed.append(exc)
            yield exc.sse_event()
            yield DONE
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def on_close() -> None:
        lease.release()
        await upstream.aclose()
        result = assembler.result()
        # a stream too large to assemble that ended normally is a complete answer all the same
        complete = result is not None or (assembler.too_large and assembler.done and not assembler.failed)
        now = time.monotonic()
        if failed:
            rec.status = failed[0].status
            lease.replica.health.on_evidence(getattr(failed[0], "evidence", None), now)
        elif not complete:
            rec.status = 499  # the client left before the end
        else:
            # from the forward, not the request's start: the client's upload and the cache
            # lookup are no evidence about the replica (a slow upload ejected a healthy one)
            ttft = (
                None if rec.first_byte_at is None or rec.forwarded_at is None else rec.first_byte_at - rec.forwarded_at
            )
            lease.replica.health.on_success(now, judged_ttft(ttft, rec.size))
        usage = usage_tokens(assembler.usage)
        streamed = None if usage is not None or rec.first_byte_at is None else (rec.prompt_tokens, assembler.events)
        # without usage (cut by the replica, left by the client): logged and counted with the
        # data events streamed, a lower bound of its tokens, not 0
        prompt, completion = usage or streamed or (0, 0)
        rec.completion_tokens = completion
        rec.prompt_tokens = prompt or rec.prompt_tokens
        if complete and not failed and rec.forwarded_at is not None:
            lease.replica.observe_answer(
                time.perf_counter() - rec.forwarded_at, rec.completion_tokens, rec.prompt_tokens, now
            )
            if rec.first_byte_at is not None:  # the learned step speed (router/dispatch/ttft.py)
                lease.replica.observe_itl(rec.first_byte_at, time.perf_counter(), rec.completion_tokens)
        relaying.counters.count(
            rec.pool, miss=True, prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens
        )
        rec.finish(relaying.metrics, relaying.tracer)
        if rec.charged_tokens and usage is not None:  # the real usage corrects what admission charged
            await relaying.limiter.settle(rec.api_key, rec.charged_tokens, sum(usage))
        elif rec.charged_tokens and failed and not isinstance(failed[0], UpstreamTimeout):
            # the replica broke off (its fault, not the client's): charged what it streamed, a
            # lower bound. A client that left or a timeout (the client picks its priority's)
            # stays charged in full: leaving early must not make generation free.
            await relaying.limiter.settle(rec.api_key, rec.charged_tokens, sum(streamed or (rec.prompt_tokens, 0)))
        if store is not None and assembler.too_large:
            if complete and not failed:  # a broken stream is not stored whatever its size
                relaying.answers.skipped(rec, "too_large")
        elif result is not None and store is not None:
            await relaying.answers.store(rec, store, result)

    return RelayResponse(relay(), on_close, media_type="text/event-stream", headers=headers)
