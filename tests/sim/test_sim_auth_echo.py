"""``--api-key`` as in vLLM (every /v1 route needs the bearer key; /health and /metrics stay open),
and ``echo`` on completions."""

from __future__ import annotations

import httpx

MODEL = "sim-llama-8b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_v1_routes_need_the_key_and_probes_do_not(serve_replica) -> None:
    url = await serve_replica(api_key="sk-sim-key")
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for headers in ({}, {"authorization": "Bearer sk-other"}, {"authorization": "sk-sim-key"}):
            response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "AuthenticationError"
            assert "sk-sim-key" not in response.text
            assert (await client.get("/v1/models", headers=headers)).status_code == 401
        good = {"authorization": "Bearer sk-sim-key"}
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=good)).status_code == 200
        assert (
            await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers=good)
        ).status_code == 200
        assert (await client.get("/v1/models", headers=good)).status_code == 200
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_no_key_set_means_no_check(serve_replica) -> None:
    url = await serve_replica()
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        response = await client.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer anything"})
        assert response.status_code == 200


async def test_completion_echo_starts_the_text_with_the_prompt(serve_replica) -> None:
    url = await serve_replica()
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        body = {"model": MODEL, "prompt": "zebra quartz", "max_tokens": 3, "echo": True}
        text = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        plain = (await client.post("/v1/completions", json={**body, "echo": False})).json()["choices"][0]["text"]
        assert text == "zebra quartz" + plain and len(plain.split()) == 3  # concatenated, as vLLM does
        assert (await client.post("/v1/completions", json={**body, "stream": True})).status_code == 400
