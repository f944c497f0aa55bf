"""AutoPipeline against a real Redis: shared round trips, order, errors and a stalled connection."""

from __future__ import annotations

import asyncio
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from cache.autopipe import AutoPipeline, eval_script


@pytest.fixture()
async def client(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


async def test_concurrent_commands_share_round_trips_in_issue_order(client: aioredis.Redis) -> None:
    auto = AutoPipeline(client)
    await client.delete("ap:n")
    replies = await asyncio.gather(*(auto.call(lambda pipe: pipe.incr("ap:n")) for _ in range(40)))
    assert replies == list(range(1, 41))  # issued in this order, executed in this order
    assert 1 <= auto.round_trips < 40
    await client.delete("ap:n")


async def test_a_lone_command_and_a_script(client: aioredis.Redis) -> None:
    auto = AutoPipeline(client)
    assert await auto.call(lambda pipe: eval_script(pipe, "return redis.call('SET', KEYS[1], ARGV[1])",
                                                    ["ap:s"], ["v"])) == b"OK"
    assert await auto.call(lambda pipe: pipe.get("ap:s")) == b"v"
    assert auto.round_trips == 2
    await client.delete("ap:s")


async def test_a_command_error_reaches_only_its_caller(client: aioredis.Redis) -> None:
    auto = AutoPipeline(client)
    await client.set("ap:text", "not a number")
    good, bad = await asyncio.gather(auto.call(lambda pipe: pipe.get("ap:text")),
                                     auto.call(lambda pipe: pipe.incr("ap:text")), return_exceptions=True)
    assert good == b"not a number"
    assert isinstance(bad, ResponseError)
    await client.delete("ap:text")


async def test_a_stalled_connection_is_dropped_and_later_commands_go_through(redis_url: str) -> None:
    # A TCP proxy to the real Redis that swallows everything on its first connection: without a
    # socket timeout, that pipeline would wait forever and every later command behind it.
    target = urlparse(redis_url)
    connections = 0

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            await reader.read(-1)
            return
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port or 6379)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    db = (target.path or "/0").lstrip("/") or "0"
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/{db}")
    auto = AutoPipeline(client, timeout_s=0.2)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(auto.call(lambda pipe: pipe.ping()), 5)
    assert await asyncio.wait_for(auto.call(lambda pipe: pipe.ping()), 5) is True
    await client.aclose()
    server.close()


async def test_a_command_does_not_wait_behind_a_slow_pipeline(client: aioredis.Redis) -> None:
    # Regression: with one pipeline at a time, a lookup's GET queued behind the previous
    # request's store or stats write. Here a pipeline blocks in Redis for 1 s (BLPOP on an
    # empty list) and a GET issued meanwhile must be answered before it.
    auto = AutoPipeline(client, timeout_s=5)
    await client.set("ap:fast", "v")
    blocked = asyncio.ensure_future(auto.call(lambda pipe: pipe.blpop(["ap:empty-list"], timeout=1)))
    await asyncio.sleep(0.05)  # the blocking pipeline is out
    assert await auto.call(lambda pipe: pipe.get("ap:fast")) == b"v"
    assert not blocked.done()  # answered while the blocking pipeline was still out
    assert await blocked is None
    await client.delete("ap:fast")
