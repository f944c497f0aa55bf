"""Automatic pipelining: Redis commands issued while round trips are in flight share the next one.

A router worker at concurrency 32 issues a write per store and a stats write per batch of
lookups, after the answers; one round trip each costs a send and a receive system call on both sides,
a pooled connection and redis-py's per-command machinery. Queued here instead, the commands of
all requests that arrive while pipelines are out go together in the next one (one connection,
one write, one read). A command goes out at once while fewer than ``max_in_flight`` pipelines
are out, so nothing waits for company. Not for lookups: a queued command waits for a pipeline
to come back, and on a saturated router that pushed half the exact lookups at concurrency 32
past their 50 ms bound (bench/router_overhead.py, hit path), so reads keep their own round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

# queues one command on a pipeline; called on the client itself, it returns that command's awaitable
Queue = Callable[[Pipeline | aioredis.Redis], object]


class AutoPipeline:
    """Runs commands on ``redis`` in non-transactional pipelines, at most ``max_in_flight`` at once.

    ``await call(lambda pipe: pipe.get(key))`` queues one command (the callable must queue
    exactly one; it may also get the client itself, when nothing else is out) and returns its
    reply. Commands keep their issue order within a pipeline, not
    across pipelines in flight together (as with separate connections). Raises what Redis or the connection raised: a command
    error only to its caller, a connection error to every caller of that pipeline. A caller that
    gives up (timeout, cancellation) only stops waiting; its command may still run. A pipeline
    is abandoned after ``timeout_s`` (its callers get TimeoutError, its connection is dropped):
    one stalled connection must not hold every later command of the worker. Scripts go
    as EVAL (``eval(pipe, script, keys, args)``): in a pipeline EVALSHA would make redis-py ask
    SCRIPT EXISTS first, a second round trip per pipeline.
    """

    def __init__(self, redis: aioredis.Redis, timeout_s: float = 1.0, max_in_flight: int = 4) -> None:
        self._redis = redis
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._queue: list[tuple[Queue, asyncio.Future[Any]]] = []
        self._runners: set[asyncio.Task[None]] = set()
        self._direct = 0  # lone commands sent on the client itself, now out
        self.round_trips = 0  # pipelines and lone commands sent, for tests and benchmarks

    async def call(self, queue: Queue) -> Any:
        if not self._runners and not self._direct:
            # nothing out: straight on the client, without a pipeline or a task; what comes
            # meanwhile queues
            self._direct += 1
            self.round_trips += 1
            try:
                async with asyncio.timeout(self._timeout_s):
                    return await queue(self._redis)  # type: ignore[misc]
            finally:
                self._direct -= 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((queue, future))
        if len(self._runners) < self._max_in_flight:
            runner = asyncio.create_task(self._run())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        return await future

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            pipe = self._redis.pipeline(transaction=False)
            for queue, _ in batch:
                queue(pipe)
            self.round_trips += 1
            try:
                async with asyncio.timeout(self._timeout_s):
                    replies = await pipe.execute(raise_on_error=False)
            except Exception as exc:  # noqa: BLE001 - every waiter must learn what happened
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: a caller that gave up must not warn
                continue
            for (_, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                    future.exception()
                else:
                    future.set_result(reply)


def eval_script(pipe: Pipeline, script: str, keys: list[str], args: list[Any]) -> object:
    """Queue ``EVAL script`` on ``pipe`` (see AutoPipeline)."""
    return pipe.eval(script, len(keys), *keys, *args)
