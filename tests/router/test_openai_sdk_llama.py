"""The official ``openai`` SDK through the real router in front of a real llama.cpp
``llama-server`` (issue 12's "SDK calls for each route ... in front of the sim and llama-server";
test_openai_sdk_live.py has the same calls in front of the sim).

Two llama-servers on the SmolLM2-135M-Instruct GGUF (tests/tools/build_llama.py; skipped with its
reason where it is not built): one for generation, and one started with ``--embeddings``, since
llama-server then serves embeddings only (and ``--pooling mean``: the model's own pooling is
``none``, which llama-server refuses on /v1/embeddings). The router has one pool for each.

What llama-server (0.3.36's vendored llama.cpp) does differently from vLLM, and so what a client
gets through the router: /tokenize takes ``content`` (vLLM: ``prompt``) and /detokenize answers
``content``; /v1/responses is served, but ``previous_response_id`` is refused (400, it keeps no
responses), and that 400 reaches the client as the server sent it; /v1/embeddings on the
generation server is its 501, which the router answers 502 ``replica_error`` like any 5xx.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from tests.router.llama_servers import EXACT_ENTRIES, start_llama, start_router, stop, wait_entries

pytestmark = [pytest.mark.llama, pytest.mark.slow]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def embedder(llama: str, model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, model id) of a second llama-server on the same GGUF, serving embeddings."""
    name = model + "-embeddings"
    proc, url = start_llama(
        tmp_path_factory.mktemp("embedder") / "llama-server.log", name, "--embeddings", "--pooling", "mean"
    )
    yield url, name
    stop(proc)


@pytest.fixture(scope="module")
def router(
    llama: str, model: str, embedder: tuple[str, str], store: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Base URL of the router with two pools: ``model`` (generation) and the embedder's."""
    proc, url = start_router(
        tmp_path_factory.mktemp("router") / "router.log",
        [
            {"url": llama, "model": model, "profile": "cpu"},
            {"url": embedder[0], "model": embedder[1], "profile": "cpu", "metrics_path": None},
        ],
    )
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def sdk(router: str) -> Iterator[openai.OpenAI]:
    """The official client, pointed at the router; no retries (a retry would hide a wrong status)."""
    client = openai.OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


def _cached(store: redis.Redis) -> int:
    return len(store.keys(EXACT_ENTRIES))


def test_chat_miss_and_hit_read_the_same(sdk: openai.OpenAI, model: str, store: redis.Redis) -> None:
    before = _cached(store)
    miss = sdk.chat.completions.with_raw_response.create(model=model, messages=QUESTION, **GREEDY)
    wait_entries(store, before + 1)
    hit = sdk.chat.completions.with_raw_response.create(model=model, messages=QUESTION, **GREEDY)
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("miss", "exact")
    assert hit.parse().model_dump() == miss.parse().model_dump()
    assert hit.parse().usage.total_tokens == miss.parse().usage.total_tokens > 0
    assert miss.parse().choices[0].message.content


def test_a_stream_without_include_usage_is_answered_later_with_usage(
    sdk: openai.OpenAI, model: str, store: redis.Redis
) -> None:
    question = [{"role": "user", "content": "Name a fruit."}]
    before = _cached(store)
    chunks = list(sdk.chat.completions.create(model=model, messages=question, stream=True, **GREEDY))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed and all(c.usage is None for c in chunks)  # not asked for: none in the stream
    wait_entries(store, before + 1)
    hit = sdk.chat.completions.with_raw_response.create(model=model, messages=question, **GREEDY)
    answer = hit.parse()
    assert hit.headers["x-cache"] == "exact"
    assert answer.choices[0].message.content == streamed
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 12
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_completions_miss_and_hit_read_the_same(sdk: openai.OpenAI, model: str, store: redis.Redis) -> None:
    before = _cached(store)
    miss = sdk.completions.with_raw_response.create(model=model, prompt="The sky is", **GREEDY)
    wait_entries(store, before + 1)
    hit = sdk.completions.with_raw_response.create(model=model, prompt="The sky is", **GREEDY)
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("miss", "exact")
    assert hit.parse().model_dump() == miss.parse().model_dump()
    assert miss.parse().object == "text_completion" and miss.parse().choices[0].text
    assert 0 < miss.parse().usage.completion_tokens <= 12


def test_models_list_and_retrieve(sdk: openai.OpenAI, model: str, embedder: tuple[str, str]) -> None:
    assert [m.id for m in sdk.models.list()] == [model, embedder[1]]
    retrieved = sdk.models.retrieve(model)
    assert (retrieved.id, retrieved.object) == (model, "model")
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.models.retrieve("no-such-model")
    assert missing.value.status_code == 404
    assert missing.value.response.json()["error"]["code"] == "model_not_found"


def test_embeddings_miss_and_exact_hit_read_the_same(
    sdk: openai.OpenAI, embedder: tuple[str, str], store: redis.Redis
) -> None:
    before = _cached(store)
    texts = ["one", "two words"]
    miss = sdk.embeddings.with_raw_response.create(model=embedder[1], input=texts)
    wait_entries(store, before + 1)
    hit = sdk.embeddings.with_raw_response.create(model=embedder[1], input=texts)
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("miss", "exact")
    assert hit.parse().model_dump() == miss.parse().model_dump()
    vectors = miss.parse().data
    assert [d.index for d in vectors] == [0, 1]
    assert len(vectors[0].embedding) == len(vectors[1].embedding) > 0
    assert vectors[0].embedding != vectors[1].embedding


def test_embeddings_on_the_generation_server_are_an_openai_error(
    sdk: openai.OpenAI, model: str, store: redis.Redis
) -> None:
    before = _cached(store)
    with pytest.raises(openai.APIStatusError) as refused:
        sdk.embeddings.create(model=model, input="one")
    # llama-server answers 501 not_supported_error; the router answers any replica 5xx 502
    # replica_error (router/README.md, Errors), in OpenAI's error JSON, and caches nothing
    assert refused.value.status_code == 502
    assert refused.value.response.json()["error"]["code"] == "replica_error"
    assert _cached(store) == before


def test_tokenize_and_detokenize_round_trip(router: str, llama: str, model: str) -> None:
    text = "Hello, world! Ünïcode and 東京"
    with httpx.Client(base_url=router, timeout=60) as client:
        tokens = client.post("/tokenize", json={"model": model, "content": text})
        assert tokens.status_code == 200 and tokens.headers["x-promptedge-replica"] == llama
        ids = tokens.json()["tokens"]
        assert ids and all(isinstance(i, int) for i in ids)
        text_back = client.post("/detokenize", json={"model": model, "tokens": ids})
        assert text_back.status_code == 200
        assert text_back.json()["content"] == text
        again = client.post("/tokenize", json={"model": model, "content": text})
        assert (again.headers["x-cache"], again.json()["tokens"]) == ("miss", ids)  # never cached


def test_responses_are_served_but_previous_response_id_is_refused(sdk: openai.OpenAI, model: str) -> None:
    first = sdk.responses.with_raw_response.create(model=model, input="Hello", max_output_tokens=4)
    assert first.status_code == 200
    response = first.parse()
    assert response.id.startswith("resp_") and response.output_text and response.usage.output_tokens == 4
    events = list(sdk.responses.create(model=model, input="Hello", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.output_text
    # The router sends the id to the replica that made it; llama-server keeps no responses and
    # says so: its 400 reaches the client as it was sent.
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=model, input="And then?", max_output_tokens=4, previous_response_id=response.id)
    assert refused.value.status_code == 400
    assert "previous_response_id" in refused.value.response.json()["error"]["message"]
    # An id no replica made: the router's own 404, never sent to the server.
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.responses.create(model=model, input="x", max_output_tokens=4, previous_response_id="resp_nope")
    assert unknown.value.response.json()["error"]["code"] == "previous_response_not_found"
