"""Fuzz test of the request parser and the router's request path (issue 13): hypothesis sends
random bodies and headers to the real router process (in front of a real simulated replica) and
every answer must be a 2xx, or a 4xx with OpenAI error JSON; never a 5xx, never a traceback.

Budget (CI): ``EXAMPLES`` (150) examples per test, 5 tests, no shrinking deadline; about 1-2 minutes
on a loaded 2-core machine, of which ~40 s start the two processes. Raise
``PROMPTEDGE_FUZZ_EXAMPLES`` for a longer local run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.router.router_process import MODEL, RouterProcess, start_replica, start_router

EXAMPLES = int(os.environ.get("PROMPTEDGE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PATHS = ["/v1/chat/completions", "/v1/completions"]
HUGE = 10**400  # found (A1): a 500 from the cache key, which turned every number into a float

# Text with everything JSON can carry: controls, non-BMP characters and lone surrogates
# (json.dumps writes those as \ud800 escapes, as a hostile client would).
# hypothesis leaves surrogates out of text unless asked: half the texts here may have some.
TEXT = st.text(st.characters(codec=None), max_size=40) | st.text(
    st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=8
)
LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
    | st.sampled_from(["", "m", "user", "assistant", "text", "P0", "auto"])
)
JSON = st.recursive(
    LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=20
)
SMALL_INT = st.integers(-3, 40)
ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "bot"])
CONTENT = (
    TEXT
    | st.none()
    | st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | JSON}, optional={"text": TEXT | JSON}),
        max_size=2,
    )
    | JSON
)
MESSAGE = st.fixed_dictionaries({"role": ROLE | JSON}, optional={"content": CONTENT, "name": TEXT}) | JSON
SAMPLING = {
    "max_tokens": SMALL_INT | JSON,
    "max_completion_tokens": SMALL_INT | JSON,
    "temperature": LEAF,
    "top_p": LEAF,
    "n": st.integers(-1, 3) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | JSON}) | JSON,
    "stop": TEXT | st.lists(TEXT, max_size=3) | JSON,
    "seed": st.integers() | JSON,
    "user": TEXT | JSON,
    "presence_penalty": LEAF,
    "frequency_penalty": LEAF,
    "logprobs": JSON,
    "extra": JSON,
}
CHAT = st.fixed_dictionaries(
    {"model": st.just(MODEL) | JSON, "messages": st.lists(MESSAGE, max_size=3) | JSON}, optional=SAMPLING
)
COMPLETION = st.fixed_dictionaries(
    {
        "model": st.just(MODEL) | JSON,
        "prompt": TEXT | st.lists(TEXT, max_size=3) | st.lists(st.integers(-5, 2**40), max_size=5) | JSON,
    },
    optional={**SAMPLING, "echo": st.booleans() | JSON},
)
# Valid requests but for their text (any of which may hold a lone surrogate) and an extra field:
# these reach the cache key, dispatch and the replica (the others mostly stop at validation).
WELL_TYPED_CHAT = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": TEXT}), min_size=1, max_size=3),
    },
    optional={
        "max_tokens": st.integers(1, 8),
        "temperature": st.floats(0, 2),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "stop": TEXT | st.lists(TEXT, max_size=3),
        "user": TEXT,
        "seed": st.integers(-(2**65), 2**65),
        "n": st.integers(1, 2),
        "top_p": st.floats(0, 1),
        "metadata": JSON,
    },
)
HEADER_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(
    str.strip
) | st.sampled_from(["P0", "P1", "P2", "0", "-1", "1e309", "nan", "no-cache", "no-store", MODEL, "2"])
HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "x-priority",
            "x-cache-ttl",
            "x-cache-threshold",
            "x-model",
            "cache-control",
            "x-request-id",
            "x-session-id",
            "authorization",
        ]
    ),
    HEADER_VALUE,
    max_size=4,
)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    replica, url = start_replica(tmp)
    replicas = json.dumps([{"url": url, "model": MODEL}])
    served = start_router(tmp, {"PROMPTEDGE_ROUTER_REPLICAS": replicas, "PROMPTEDGE_ROUTER_HEALTH_INTERVAL_S": "1"})
    try:
        yield served
        log = served.log_text()
        assert "Traceback" not in log and "unhandled error" not in log, log[-4000:]
    finally:
        served.stop()
        replica.terminate()
        replica.wait(timeout=30)


@pytest.fixture(scope="module")
def client(router: RouterProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router.url, timeout=60) as c:
        for _ in range(100):  # until the router has probed the replica
            if c.get("/health").json()["pools"][MODEL]["ready"]:
                break
            time.sleep(0.2)
        yield c


def check(answer: httpx.Response) -> None:
    """A 2xx, or a 4xx whose body is exactly OpenAI's error object."""
    if 200 <= answer.status_code < 300:
        return
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:500])
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and "Traceback" not in error["message"]


def _post(client: httpx.Client, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    content = json.dumps(body, allow_nan=True).encode()  # NaN/Infinity too, as some clients send
    return client.post(path, content=content, headers={"content-type": "application/json", **headers})


@FUZZ
@given(body=CHAT, headers=HEADERS)
@example(body={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "extra": HUGE}, headers={})
@example(
    body={"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, headers={}
)  # found (A2): a 500 from the prompt-size estimate
@example(body={"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": True}]}]}, headers={})
def test_fuzzed_chat_requests_get_2xx_or_4xx_json(client: httpx.Client, body: Any, headers: dict[str, str]) -> None:
    check(_post(client, "/v1/chat/completions", body, headers))


@FUZZ
@given(body=WELL_TYPED_CHAT)
@example(body={"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]})  # found: 500 (issue 13)
@example(body={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": ["a\udfff"]})
@example(body={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "metadata": {"\udc00": 1}})
def test_well_typed_chat_requests_get_2xx_or_4xx_json(client: httpx.Client, body: Any) -> None:
    # no headers: a random one would stop most requests before the cache key (400, 404)
    check(_post(client, "/v1/chat/completions", body, {}))


@FUZZ
@given(body=COMPLETION, headers=HEADERS)
@example(body={"model": MODEL, "prompt": "x", "logprobs": HUGE}, headers={})
@example(body={"model": MODEL, "prompt": "x", "top_k": -HUGE}, headers={})
@example(body={"model": MODEL, "prompt": "x", "seed": 2**53 + 1}, headers={})  # A3: an exact int in the key
def test_fuzzed_completion_requests_get_2xx_or_4xx_json(
    client: httpx.Client, body: Any, headers: dict[str, str]
) -> None:
    check(_post(client, "/v1/completions", body, headers))


@FUZZ
@given(body=JSON, path=st.sampled_from(PATHS))
def test_any_json_value_gets_2xx_or_4xx_json(client: httpx.Client, body: Any, path: str) -> None:
    check(_post(client, path, body, {}))


@FUZZ
@given(
    raw=st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()[:-1]),
    path=st.sampled_from(PATHS),
    content_type=st.sampled_from(["application/json", "text/plain", "", "application/x-www-form-urlencoded"]),
)
def test_arbitrary_bytes_get_2xx_or_4xx_json(client: httpx.Client, raw: bytes, path: str, content_type: str) -> None:
    check(client.post(path, content=raw, headers={"content-type": content_type}))


def test_a_huge_integer_field_is_answered_and_the_connection_kept(client: httpx.Client) -> None:
    # Regression (A1): 500 with an OverflowError traceback, and the kept-alive connection dropped.
    for body in (
        {"model": MODEL, "prompt": "x", "logprobs": HUGE, "max_tokens": 2},
        {"model": MODEL, "prompt": "x", "top_k": HUGE, "max_tokens": 2},
    ):
        answer = _post(client, "/v1/completions", body, {})
        assert answer.status_code in (200, 400), (answer.status_code, answer.text[:300])
        check(answer)
        assert answer.headers.get("connection") != "close"
    assert client.get("/health").status_code == 200


def test_a_content_part_whose_text_is_not_a_string_is_a_400_naming_it(client: httpx.Client) -> None:
    # Regression (A2): 500 with a TypeError from the prompt-size estimate.
    for text in (5, True, {"a": 1}):
        body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
        answer = _post(client, "/v1/chat/completions", body, {})
        assert answer.status_code == 400, (answer.status_code, answer.text[:300])
        check(answer)
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_type", "messages.0.content.0.text"), error


def _completion(client: httpx.Client, seed: int) -> httpx.Response:
    body = {"model": MODEL, "prompt": "seeded a3", "max_tokens": 3, "seed": seed}
    answer = _post(client, "/v1/completions", body, {})
    assert answer.status_code == 200, answer.text[:300]
    return answer


@pytest.mark.parametrize("seeds", [(2**53 + 1, 2**53), (2**63 - 1, 2**63 - 2)], ids=["2^53", "2^63"])
def test_seeds_that_differ_only_beyond_float_precision_do_not_share_an_entry(
    client: httpx.Client, seeds: tuple[int, int]
) -> None:
    # Regression (A3): the key held float(seed), so the second seed was an exact hit on the first.
    first = _completion(client, seeds[0])
    for _ in range(50):  # until the first answer is stored (the store runs after the response)
        if _completion(client, seeds[0]).headers["x-cache"] == "exact":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the first answer was never stored")
    second = _completion(client, seeds[1])
    assert second.headers["x-cache"] == "miss", second.headers
    assert second.json()["id"] != first.json()["id"]
