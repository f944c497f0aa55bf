"""Labels for the per-entry error bound from a replica's answer to the same request (pure).

When the bound did not serve a candidate (a compared miss), the request went to the replica
anyway; its answer then says whether the candidate's cached answer would have been right, at no
replica cost. A served hit can be checked the same way by asking a replica off the client's
path (shadow verification, router/caching/shadowing.py: one replica call per verified hit). The
cache's rule for "right" is the house rule: a cached answer may be served only to a request
that would have produced it. That can be checked only where the replica's answer is
determined by the prompt: greedy decoding (``temperature`` 0) and one choice. There, right
means every choice's output (message content, tool calls, refusal; or a completion's text) is
identical. A sampled answer proves nothing either way: no label.

Identical text is strict: a paraphrased query may get an answer worded differently that a
person would accept. Such labels say "wrong" too often, which makes the bound stricter (fewer
hits), never looser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_OUTPUT_FIELDS = ("content", "tool_calls", "function_call", "refusal")


def _outputs(response: Mapping[str, Any]) -> list[Any] | None:
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    out: list[Any] = []
    for choice in sorted((c for c in choices if isinstance(c, dict)), key=lambda c: c.get("index", 0)):
        message = choice.get("message")
        if isinstance(message, dict):
            out.append({k: message.get(k) for k in _OUTPUT_FIELDS})
        else:
            out.append(choice.get("text"))
    return out


def judgeable(body: Mapping[str, Any]) -> bool:
    """True when a replica's answer to the request ``body`` is determined by it (``temperature``
    exactly 0, one choice), the only requests ``compared_label`` labels: a caller about to pay
    a replica call for a label asks this first."""
    temperature = body.get("temperature", 1.0)
    return type(temperature) in (int, float) and temperature == 0 and body.get("n", 1) == 1


def compared_label(body: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool | None:
    """Would ``cached`` have been the right answer to the request ``body``, given the replica's
    ``fresh`` answer to it? True / False for a greedy, single-choice request (module doc);
    None when the request samples, asks for several choices or either answer has no choices."""
    if not judgeable(body):
        return None
    old, new = _outputs(cached), _outputs(fresh)
    if not old or not new:
        return None
    return old == new
