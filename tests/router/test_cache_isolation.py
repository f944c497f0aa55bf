"""Issue 13, findings 3-5, through the real router on a real Redis: the cache never serves
another pool's, another client's or another request's answer, and unknown API keys do not
each become a metrics label or a stats series."""

from __future__ import annotations

import pytest

from router import ReplicaSpec
from tests.router.conftest import MODEL
from tests.router.test_cache_api import chat, post_until_stored

pytestmark = pytest.mark.slow

URL = "/v1/chat/completions"

# vLLM's output-changing request fields that the key used to ignore (issue 13, finding 3),
# each with a value that changes the answer of a real vLLM.
VLLM_FIELDS = {
    "min_tokens": 4,
    "ignore_eos": True,
    "stop_token_ids": [2],
    "guided_choice": ["yes", "no"],
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "structured_outputs": {"choice": ["yes", "no"]},
    "chat_template_kwargs": {"enable_thinking": False},
    "include_stop_str_in_output": True,
    "bad_words": ["kitchen"],
    "allowed_token_ids": [1, 2, 3],
    "truncate_prompt_tokens": 5,
    "continue_final_message": True,
    "verbosity": "low",
}


async def test_x_model_answer_is_not_served_to_the_body_model(start_replica, start_router, client) -> None:
    # Regression (finding 3): body `sim-llama-8b` with `X-Model: small-model` was stored under
    # sim-llama-8b's key, and the next plain sim-llama-8b request got small-model's answer.
    big = await start_replica()
    small = await start_replica()  # a replica that answers whatever model name it is sent
    router = await start_router([], specs=[ReplicaSpec(url=big.url, model=MODEL),
                                           ReplicaSpec(url=small.url, model="small-model")])
    url = router.url + URL
    body = chat("What is a KV cache?")
    await post_until_stored(client, url, body, {"x-model": "small-model"})
    plain = await client.post(url, json=body, headers={"cache-control": "no-store"})
    assert plain.headers["x-cache"] == "miss"
    assert plain.headers["x-promptedge-replica"] == big.url
    again = await client.post(url, json=body, headers={"x-model": "small-model"})
    assert again.headers["x-cache"] == "exact"  # the pool's own answer is still cached for it
    stats = (await client.get(router.url + "/cache/stats")).json()
    assert set(stats["per_model"]) == {MODEL, "small-model"}  # counted under the pool that answers


async def test_vllm_output_fields_each_change_the_key(start_replica, start_router, client) -> None:
    router = await start_router([(await start_replica()).url])
    url = router.url + URL
    await post_until_stored(client, url, chat("How do I turn on the lights in the kitchen?"))
    served = {}
    for name, value in VLLM_FIELDS.items():
        response = await client.post(url, json=chat("How do I turn on the lights in the kitchen?", **{name: value}),
                                     headers={"cache-control": "no-store"})
        assert response.status_code == 200, name
        served[name] = response.headers["x-cache"]
    assert served == {name: "miss" for name in VLLM_FIELDS}
    unknown = await client.post(url, json=chat("How do I turn on the lights in the kitchen?", x_new_field=1),
                                headers={"cache-control": "no-store"})
    assert unknown.headers["x-cache"] == "miss"
    # fields known not to change the answer still share it
    same = await client.post(url, json=chat("How do I turn on the lights in the kitchen?", user="alice",
                                            metadata={"k": "v"}, stream=False))
    assert same.headers["x-cache"] == "exact"


async def test_a_semantic_hit_needs_every_non_text_field_equal(start_replica, start_router, client) -> None:
    router = await start_router([(await start_replica()).url], api_keys={"key-a": "acme"})
    url = router.url + URL
    acme = {"authorization": "Bearer key-a"}
    await post_until_stored(client, url, chat("How do I turn on the lights in the kitchen?"), acme)
    other = await client.post(url, json=chat("How can I turn on the kitchen lights?", guided_choice=["on", "off"]),
                              headers={**acme, "cache-control": "no-store"})
    assert other.headers["x-cache"] == "miss"
    named = {"model": MODEL, "max_tokens": 8,
             "messages": [{"role": "user", "content": "How can I turn on the kitchen lights?", "name": "bob"}]}
    assert (await client.post(url, json=named, headers={**acme, "cache-control": "no-store"})).headers["x-cache"] == "miss"
    same = await client.post(url, json=chat("How can I turn on the kitchen lights?"), headers=acme)
    assert same.headers["x-cache"] == "semantic"
