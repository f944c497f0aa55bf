"""Canonical exact-cache keys: same generation request <=> same key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.keys import _CHAT_DEFAULTS, _COMPLETION_DEFAULTS, NEUTRAL_FIELDS, canonical_request, exact_key

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


@pytest.mark.parametrize(
    ("endpoint", "defaults", "base"),
    [
        ("chat.completions", _CHAT_DEFAULTS, BASE),
        ("completions", _COMPLETION_DEFAULTS, {"model": "m", "prompt": "What is Redis?"}),
    ],
)
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


# Issue 13, finding 3: the key rule is inverted (every body field counts unless known neutral).

VLLM_FIELDS = {
    "min_tokens": 4,
    "ignore_eos": True,
    "stop_token_ids": [2],
    "guided_choice": ["yes", "no"],
    "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+",
    "structured_outputs": {"choice": ["a"]},
    "chat_template_kwargs": {"enable_thinking": False},
    "include_stop_str_in_output": True,
    "bad_words": ["x"],
    "allowed_token_ids": [1, 2],
    "truncate_prompt_tokens": 5,
    "continue_final_message": True,
    "verbosity": "low",
}


@pytest.mark.parametrize(("name", "value"), VLLM_FIELDS.items())
def test_vllm_output_changing_fields_change_the_key(name: str, value: object) -> None:
    assert key({**BASE, name: value}) != key(BASE)
    prompt = {"model": "m", "prompt": "What is Redis?"}
    assert key({**prompt, name: value}, endpoint="completions") != key(prompt, endpoint="completions")


@pytest.mark.parametrize(
    "change",
    [
        {"min_tokens": 0},
        {"ignore_eos": False},
        {"stop_token_ids": []},
        {"bad_words": []},
        {"include_stop_str_in_output": False},
        {"continue_final_message": False},
        {"chat_template_kwargs": {}},
        {"skip_special_tokens": True},
        {"add_generation_prompt": True},
        {"guided_choice": None},
    ],
)
def test_vllm_fields_at_their_default_equal_leaving_them_out(change: dict) -> None:
    assert key({**BASE, **change}) == key(BASE)


@pytest.mark.parametrize("name", sorted(NEUTRAL_FIELDS))
def test_neutral_fields_do_not_change_the_key(name: str) -> None:
    assert key({**BASE, name: "anything"}) == key(BASE)
    assert key({**BASE, name: {"k": [1, 2]}}) == key(BASE)


def test_the_pool_that_answers_is_part_of_the_key() -> None:
    # Regression: a request sent with X-Model to another pool was stored under the body's model.
    assert exact_key("p", "chat.completions", BASE, "t1", pool="other") != key(BASE)
    assert exact_key("p", "chat.completions", BASE, "t1", pool="m") == key(BASE)
    assert exact_key("p", "chat.completions", {**BASE, "model": "x"}, "t1", pool="m") != key(BASE)


def test_unknown_message_fields_change_the_key() -> None:
    named = {**BASE, "messages": [{"role": "user", "content": "What is Redis?", "name": "bob"}]}
    extra = {**BASE, "messages": [{"role": "user", "content": "What is Redis?", "x_tag": 1}]}
    null_name = {**BASE, "messages": [{"role": "user", "content": "What is Redis?", "name": None}]}
    assert key(named) != key(BASE) and key(extra) != key(BASE) and key(named) != key(extra)
    assert key(null_name) == key(BASE)  # a known field set to null is the field left out


def test_max_tokens_and_a_different_max_completion_tokens_are_kept_apart() -> None:
    both = {**BASE, "max_tokens": 5, "max_completion_tokens": 7}
    assert key(both) != key({**BASE, "max_tokens": 5}) and key(both) != key({**BASE, "max_tokens": 7})


_KNOWN = (
    set(_CHAT_DEFAULTS)
    | set(_COMPLETION_DEFAULTS)
    | set(NEUTRAL_FIELDS)
    | {"model", "messages", "prompt", "max_completion_tokens"}
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    name=st.text(min_size=1, max_size=24).filter(lambda n: n not in _KNOWN),
    value=_JSON,
    endpoint=st.sampled_from(["chat.completions", "completions"]),
)
def test_any_unknown_field_with_any_value_changes_the_key(name: str, value: object, endpoint: str) -> None:
    base = BASE if endpoint == "chat.completions" else {"model": "m", "prompt": "What is Redis?"}
    assert key({**base, name: value}, endpoint=endpoint) != key(base, endpoint=endpoint)


@pytest.mark.parametrize(
    "a, b", [(2**53 + 1, 2**53), (2**63 - 1, 2**63 - 2), (10**400, 10**400 + 1)], ids=["2^53", "2^63", "10^400"]
)
def test_integers_are_kept_exact(a: int, b: int) -> None:
    # Regression (issue 13, A1/A3): numbers became floats, so seeds beyond 2**53 shared a key
    # and an integer too large for a float raised OverflowError (a 500 in the router).
    assert key({**BASE, "seed": a}) != key({**BASE, "seed": b})
    assert key({**BASE, "top_k": a}) != key({**BASE, "top_k": b})


def test_an_integral_float_equals_the_int() -> None:
    assert key({**BASE, "max_tokens": 10}) == key({**BASE, "max_tokens": 10.0})
    assert key({**BASE, "temperature": 0}) == key({**BASE, "temperature": 0.0}) == key({**BASE, "temperature": -0.0})
    assert key({**BASE, "temperature": 0.5}) != key({**BASE, "temperature": 0})
