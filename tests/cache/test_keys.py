"""Canonical exact-cache keys: same generation request <=> same key."""

from __future__ import annotations

import pytest

from cache.keys import _CHAT_DEFAULTS, _COMPLETION_DEFAULTS, canonical_request, exact_key

BASE = {"model": "m", "messages": [{"role": "user", "content": "What is Redis?"}]}


def key(body: dict, tenant: str = "t1", endpoint: str = "chat.completions") -> str:
    return exact_key("p", endpoint, body, tenant)  # type: ignore[arg-type]


def test_missing_temperature_equals_explicit_default() -> None:
    assert key(BASE) == key({**BASE, "temperature": 1.0}) == key({**BASE, "temperature": 1})


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.0},
        {"max_tokens": 10},
        {"seed": 7},
        {"top_p": 0.5},
        {"n": 2},
        {"stop": ["\n"]},
        {"response_format": {"type": "json_object"}},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"model": "other"},
        {"messages": [{"role": "user", "content": "What is Redis"}]},
        {"messages": [{"role": "system", "content": "Be terse."}, *BASE["messages"]]},
    ],
)
def test_output_affecting_change_changes_key(change: dict) -> None:
    assert key({**BASE, **change}) != key(BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"stream": True},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"user": "alice"},
        {"stop": []},
        {"tools": []},
        {"logit_bias": {}},
        {"max_completion_tokens": None},
    ],
)
def test_fields_that_do_not_change_output_share_key(change: dict) -> None:
    assert key({**BASE, **change}) == key(BASE)


@pytest.mark.parametrize(("endpoint", "defaults", "base"), [
    ("chat.completions", _CHAT_DEFAULTS, BASE),
    ("completions", _COMPLETION_DEFAULTS, {"model": "m", "prompt": "What is Redis?"}),
])
def test_every_parameter_at_its_default_equals_leaving_it_out(endpoint: str, defaults: dict, base: dict) -> None:
    for name, default in defaults.items():
        assert key({**base, name: default}, endpoint=endpoint) == key(base, endpoint=endpoint), name
    assert key({**base, **defaults}, endpoint=endpoint) == key(base, endpoint=endpoint)


def test_tool_choice_default_depends_on_tools() -> None:
    tools = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    assert key({**BASE, "tool_choice": "none"}) == key(BASE)
    assert key({**BASE, "tool_choice": "auto"}) != key(BASE)
    assert key({**BASE, **tools, "tool_choice": "auto"}) == key({**BASE, **tools})
    assert key({**BASE, **tools, "tool_choice": "none"}) != key({**BASE, **tools})


def test_a_value_equal_to_the_default_but_of_another_type_is_not_the_default() -> None:
    assert key({**BASE, "logprobs": 0}) != key(BASE)  # 0 == False in Python, not in the API
    assert key({**BASE, "temperature": None}) != key(BASE)


def test_stop_string_equals_one_element_list() -> None:
    assert key({**BASE, "stop": "END"}) == key({**BASE, "stop": ["END"]})


def test_max_completion_tokens_is_max_tokens() -> None:
    assert key({**BASE, "max_completion_tokens": 5}) == key({**BASE, "max_tokens": 5})


def test_single_text_part_equals_string() -> None:
    parts = {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "What is Redis?"}]}]}
    assert key(parts) == key(BASE)


def test_tenants_never_share() -> None:
    assert key(BASE, "t1") != key(BASE, "t2")


def test_endpoints_never_share() -> None:
    prompt = {"model": "m", "prompt": "What is Redis?"}
    assert key(prompt, endpoint="completions") != key(BASE)
    # Legacy completions default max_tokens is 16 (OpenAI API reference).
    assert key(prompt, endpoint="completions") == key({**prompt, "max_tokens": 16}, endpoint="completions")


def test_multimodal_and_odd_content_is_kept_verbatim_not_crashed_on() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    a = {**BASE, "messages": [{"role": "user", "content": [image]}]}
    b = {**BASE, "messages": [{"role": "user", "content": [{**image, "image_url": {"url": "x"}}]}]}
    odd = {**BASE, "messages": ["not a message", {"role": "user", "content": None}]}
    assert key(a) != key(b)
    assert isinstance(canonical_request("chat.completions", odd, "t"), dict)
