"""The official ``openai`` SDK against the real router in front of real sim replicas (issue 12):
every route a client of the SDK uses, and a cached answer that the SDK reads as it read the
miss (``usage`` present, so ``r.usage.total_tokens`` does not raise, whatever shape the miss had)."""

from __future__ import annotations

import openai
import pytest

from tests.router.conftest import MODEL, cache_entries

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("exact_only")]
QUESTION = [{"role": "user", "content": "How do I turn on the kitchen lights?"}]


@pytest.fixture()
async def sdk(start_replica, start_router):  # type: ignore[no-untyped-def]
    router = await start_router([(await start_replica()).url])
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


async def test_chat_miss_and_hit_read_the_same_through_the_sdk(sdk, redis_url) -> None:
    miss = await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, max_tokens=8)
    await cache_entries(redis_url, 1)
    hit = await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, max_tokens=8)
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("miss", "exact")
    assert hit.parse().model_dump() == miss.parse().model_dump()
    assert hit.parse().usage.total_tokens == miss.parse().usage.total_tokens > 0


async def test_a_stream_without_include_usage_is_answered_later_with_usage(sdk, redis_url) -> None:
    # The report: a stream without include_usage, asked again non-stream, had usage None.
    stream = await sdk.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, stream=True)
    chunks = [chunk async for chunk in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(c.usage is None for c in chunks)  # the client did not ask for it: it gets none
    await cache_entries(redis_url, 1)
    hit = await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=QUESTION, max_tokens=8)
    assert hit.headers["x-cache"] == "exact"
    answer = hit.parse()
    assert answer.choices[0].message.content == streamed
    assert answer.usage is not None and answer.usage.total_tokens > 0


async def test_completions_models_embeddings_and_responses(sdk) -> None:
    text = await sdk.completions.create(model=MODEL, prompt="Say hi", max_tokens=4)
    assert text.choices[0].text and text.usage.completion_tokens > 0
    listed = [m.id async for m in sdk.models.list()]
    assert MODEL in listed and (await sdk.models.retrieve(MODEL)).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.models.retrieve("no-such-model")
    assert missing.value.status_code == 404
    vectors = await sdk.embeddings.create(model=MODEL, input=["one", "two"])
    assert [d.index for d in vectors.data] == [0, 1] and len(vectors.data[0].embedding) > 0
    first = await sdk.responses.create(model=MODEL, input="Hello", max_output_tokens=4)
    follow = await sdk.responses.create(
        model=MODEL, input="And then?", max_output_tokens=4, previous_response_id=first.id
    )
    assert first.output_text and follow.output_text and follow.id != first.id
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model=MODEL, input="x", max_output_tokens=4, previous_response_id="resp_nope")
