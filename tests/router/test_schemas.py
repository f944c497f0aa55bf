"""router/schemas.py's container count (pure): brackets inside strings, escapes included, are text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.errors import BadRequest
from router.schemas import _check_containers

TEXT = st.text(st.sampled_from('{["\\]}ab'), max_size=12)
JSON = st.recursive(st.none() | st.integers() | TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4), max_leaves=30)


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
