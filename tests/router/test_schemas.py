"""router/api/schemas.py's container count (pure): brackets inside strings, escapes included, are text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.api.schemas import _check_containers
from router.errors import BadRequest

TEXT = st.text(st.sampled_from('{["\\]}ab'), max_size=12)
JSON = st.recursive(
    st.none() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


def _containers(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_containers(v) for v in value)
    return 0


@settings(max_examples=300, deadline=None)
@given(body=JSON)
def test_the_count_is_exact_whatever_the_strings_hold(body: Any) -> None:
    raw = json.dumps(body).encode()
    count = _containers(body)
    _check_containers(raw, count)  # exactly at the limit: accepted
    if count:
        with pytest.raises(BadRequest):
            _check_containers(raw, count - 1)


def test_too_many_values_is_a_400_before_parsing() -> None:
    # Regression (attack, Dec 2): 2M integers in 70 lists (5.6 MB, 71 containers) held the event
    # loop, and /health with it, for 9.8 s: every value was walked with a path tuple built for it.
    from router.api.schemas import parse_request
    from router.process.limits import Limits

    limits = Limits()
    extra = json.dumps([[1] * 5_000 for _ in range(70)])  # 350,000 values in 71 containers
    raw = ('{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ' + extra + "}").encode()
    with pytest.raises(BadRequest, match="JSON values") as caught:
        parse_request(raw, "chat.completions", limits)
    assert caught.value.code == "invalid_json"


def test_a_long_token_id_prompt_and_commas_in_text_are_within_the_value_bound() -> None:
    from router.api.schemas import parse_request
    from router.process.limits import Limits

    limits = Limits()
    ids = json.dumps({"model": "m", "prompt": list(range(200_000))}).encode()  # a 200k-token context
    assert len(parse_request(ids, "completions", limits)["prompt"]) == 200_000
    prose = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a, b, " * 400_000}]}).encode()
    assert parse_request(prose, "chat.completions", limits)["messages"][0]["content"].count(",") == 800_000


def test_a_lone_surrogate_deep_in_a_large_body_is_named_by_its_path() -> None:
    from router.api.schemas import parse_request
    from router.process.limits import Limits

    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "x": [[{"deep": [1, 2, "ok"]}] * 30, {"bad": "\\ud800"}],
    }
    raw = json.dumps(body).replace("\\\\ud800", "\\ud800").encode()
    with pytest.raises(BadRequest) as caught:
        parse_request(raw, "chat.completions", Limits())
    assert (caught.value.code, caught.value.param) == ("invalid_unicode", "x.1.bad")
