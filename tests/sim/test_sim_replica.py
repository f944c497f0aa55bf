"""The simulated replica over real HTTP: OpenAI shapes, SSE format, errors, /metrics, warm-up."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import FAST

MODEL = "sim-llama-8b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is a KV cache?"}]}


def metric_values(text: str) -> dict[str, float]:
    """Sample name -> value for the unbucketed samples of the sim's model (the info gauge
    vllm:cache_config_info carries CacheConfig labels and no model_name, as in vLLM)."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels and not sample.name.endswith("_info"):
                assert sample.labels["model_name"] == MODEL
                values[sample.name] = sample.value
    return values


async def test_chat_and_completion_return_exactly_max_tokens(serve_replica) -> None:
    url = await serve_replica()
    async with httpx.AsyncClient(base_url=url) as client:
        chat = (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 7})).json()
        text = (
            await client.post("/v1/completions", json={"model": MODEL, "prompt": "abcdefgh", "max_tokens": 3})
        ).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert len(chat["choices"][0]["message"]["content"].split()) == 7
    assert chat["usage"]["completion_tokens"] == 7
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 7
    assert text["object"] == "text_completion"
    assert len(text["choices"][0]["text"].split()) == 3
    assert text["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


async def sse_events(response: httpx.Response) -> list[str]:
    events = []
    async for line in response.aiter_lines():
        if line:
            assert line.startswith("data: ")
            events.append(line[len("data: ") :])
    return events


async def test_chat_stream_is_openai_chunks_with_usage_and_done(serve_replica) -> None:
    url = await serve_replica()
    body = {**CHAT, "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=url) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = await sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(content.split()) == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 12


SLOW_PREFILL = dataclasses.replace(FAST, name="slow-prefill", prefill_s_per_token=0.05)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": 3, "stream": True}),
        ("/v1/completions", {"model": MODEL, "prompt": "What is a KV cache?", "max_tokens": 3, "stream": True}),
    ],
)
async def test_stream_sends_its_first_chunk_after_prefill(serve_replica, path: str, body: dict) -> None:
    # Regression: the chat role chunk went out on arrival, before the simulated prefill
    # (11 prompt tokens x 50 ms here), so a client measured TTFT ~0. vLLM sends it with the
    # first token. No clock: when the first chunk arrives, the engine has already recorded the
    # first token (its TTFT sample) and the whole prompt's prefill.
    url = await serve_replica(profile=SLOW_PREFILL)
    async with httpx.AsyncClient(base_url=url) as client:
        async with client.stream("POST", path, json=body) as response:
            lines = (line[len("data: ") :] async for line in response.aiter_lines() if line)
            first = await anext(lines)
            at_first = metric_values((await client.get("/metrics")).text)
            rest = [line async for line in lines]
    assert at_first["vllm:time_to_first_token_seconds_count"] == 1
    assert at_first["vllm:prompt_tokens_total"] == (11 if "messages" in body else 5)
    assert rest[-1] == "[DONE]"
    chunk = json.loads(first)
    if "messages" in body:
        assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        chunk = json.loads(rest[0])
        assert chunk["choices"][0]["delta"]["content"]  # the first token right behind the role
    else:
        assert chunk["choices"][0]["text"]


async def test_completion_stream_without_usage_option_has_no_usage_chunk(serve_replica) -> None:
    url = await serve_replica()
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": True}
    async with httpx.AsyncClient(base_url=url) as client:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            events = await sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert len("".join(c["choices"][0]["text"] for c in chunks).split()) == 5


async def test_bad_requests_get_openai_error_json(serve_replica) -> None:
    url = await serve_replica()
    cases = [
        (b'{"model": "sim-llama-8b", "messages": [', 400, None),
        (json.dumps({"model": MODEL}).encode(), 400, "messages"),
        (json.dumps({**CHAT, "max_tokens": "5"}).encode(), 400, "max_tokens"),
        (json.dumps({**CHAT, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({**CHAT, "stream": "yes"}).encode(), 400, "stream"),
        (json.dumps({**CHAT, "max_tokens": 5000}).encode(), 400, "max_tokens"),
        (json.dumps({**CHAT, "model": "other"}).encode(), 404, "model"),
    ]
    async with httpx.AsyncClient(base_url=url) as client:
        for raw, status, param in cases:
            response = await client.post("/v1/chat/completions", content=raw)
            assert response.status_code == status, raw
            error = response.json()["error"]
            assert error["param"] == param and error["code"] == status and error["message"]


async def test_models_lists_the_served_model(serve_replica) -> None:
    url = await serve_replica(model="m-1")
    async with httpx.AsyncClient(base_url=url) as client:
        body = (await client.get("/v1/models")).json()
    assert [m["id"] for m in body["data"]] == ["m-1"]


async def test_health_is_503_while_warming_up(serve_replica) -> None:
    url = await serve_replica(warmup_s=0.5)
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/health")).status_code == 503
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 503
        for _ in range(100):
            if (await client.get("/health")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert (await client.get("/health")).status_code == 200


async def test_metrics_move_as_load_comes_and_goes(serve_replica) -> None:
    url = await serve_replica()  # FAST: two sequences at a time
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        idle = metric_values((await client.get("/metrics")).text)
        assert idle["vllm:num_requests_running"] == 0 and idle["vllm:kv_cache_usage_perc"] == 0
        load = [
            asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 60})) for _ in range(4)
        ]
        busy = idle
        for _ in range(200):
            busy = metric_values((await client.get("/metrics")).text)
            if busy["vllm:num_requests_waiting"] == 2:
                break
            await asyncio.sleep(0.01)
        assert busy["vllm:num_requests_running"] == 2
        assert busy["vllm:num_requests_waiting"] == 2
        assert 0 < busy["vllm:kv_cache_usage_perc"] <= 1
        assert all(r.status_code == 200 for r in await asyncio.gather(*load))
        done = metric_values((await client.get("/metrics")).text)
    assert done["vllm:num_requests_running"] == 0
    assert done["vllm:num_requests_waiting"] == 0
    assert done["vllm:kv_cache_usage_perc"] == 0
    assert done["vllm:generation_tokens_total"] == 240
    assert done["vllm:prompt_tokens_total"] > 0
    assert done["vllm:time_to_first_token_seconds_count"] == 4
    assert done["vllm:e2e_request_latency_seconds_count"] == 4


def request_success(text: str) -> dict[str, float]:
    """finished_reason -> value of ``vllm:request_success_total`` (labels as vLLM sets them)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                assert set(sample.labels) == {"model_name", "engine", "finished_reason"}
                found[sample.labels["finished_reason"]] = sample.value
    return found


async def test_finished_requests_count_in_request_success_as_vllm(serve_replica) -> None:
    """The series the forecaster's default Prometheus query reads: one per finish reason from the
    start (0), each finished request counted once under "length" (the sim stops at max_tokens)."""
    url = await serve_replica()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        before = request_success((await client.get("/metrics")).text)
        replies = await asyncio.gather(
            *(client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3}) for _ in range(3))
        )
        after = request_success((await client.get("/metrics")).text)
    assert [r.json()["choices"][0]["finish_reason"] for r in replies] == ["length"] * 3
    assert before == {"stop": 0, "length": 0, "abort": 0}
    assert after == {"stop": 0, "length": 3, "abort": 0}


async def test_fault_knobs_fail_and_recover(serve_replica) -> None:
    url = await serve_replica()
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.post("/sim/faults", json={"fail_rate": 1.0})).status_code == 200
        failed = await client.post("/v1/chat/completions", json=CHAT)
        assert failed.status_code == 500 and failed.json()["error"]["type"] == "InternalServerError"
        assert (await client.post("/sim/faults", json={"fail_rate": 2})).status_code == 400
        await client.post("/sim/faults", json={"hang": True})
        try:
            await client.post("/v1/chat/completions", json=CHAT, timeout=0.3)
            raise AssertionError("a hanging replica answered")
        except httpx.ReadTimeout:
            pass
        await client.post("/sim/faults", json={})
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_max_model_len_setting_caps_prompt_plus_max_tokens_with_vllms_400(serve_replica) -> None:
    url = await serve_replica(max_model_len=100)  # the FAST profile's own is 1000
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/v1/models")).json()["data"][0]["max_model_len"] == 100
        fits = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 89})  # 11 + 89 = 100
        too_long = [
            await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 90, "stream": stream})
            for stream in (False, True)
        ]
    assert fits.status_code == 200
    for response in too_long:
        assert response.status_code == 400 and response.headers["content-type"] == "application/json"
        assert response.json() == {
            "error": {
                "message": "This model's maximum context length is 100 tokens. However, you requested 101 tokens "
                "(11 in the messages, 90 in the completion). Please reduce the length of the messages "
                "or completion.",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            }
        }
