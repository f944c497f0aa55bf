"""Automatic pipelining: Redis commands issued while a round trip is in flight share the next one.

A router worker at concurrency 32 issues a GET per lookup, a write per store and a stats write
per batch of lookups; one round trip each costs a send and a receive system call on both sides,
a pooled connection and redis-py's per-command machinery. Queued here instead, the commands of
all requests that arrive while one pipeline is out go together in the next (one connection, one
write, one read), in the order they were issued. A lone command goes out at once, so nothing
waits for company.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

Queue = Callable[[Pipeline], object]


class AutoPipeline:
    """Runs commands on ``redis`` in non-transactional pipelines, one pipeline in flight at a time.

    ``await call(lambda pipe: pipe.get(key))`` queues one command (the callable must queue
    exactly one) and returns its reply. Raises what Redis or the connection raised: a command
    error only to its caller, a connection error to every caller of that pipeline. A caller that
    gives up (timeout, cancellation) only stops waiting; its command may still run. A pipeline
    is abandoned after ``timeout_s`` (its callers get TimeoutError, its connection is dropped):
    one stalled connection must not hold every later command of the worker. Scripts go
    as EVAL (``eval(pipe, script, keys, args)``): in a pipeline EVALSHA would make redis-py ask
    SCRIPT EXISTS first, a second round trip per pipeline.
    """

    def __init__(self, redis: aioredis.Redis, timeout_s: float = 1.0) -> None:
        self._redis = redis
        self._timeout_s = timeout_s
        self._queue: list[tuple[Queue, asyncio.Future[Any]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.round_trips = 0  # pipelines sent, for tests and benchmarks

    async def call(self, queue: Queue) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((queue, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
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
