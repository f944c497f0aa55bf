"""The delta merge of many ``tool_calls`` indices, interleaved over chunks, gives each call its
own parts in order (the merge now finds an index's element by a dict, router/deltas.py
``_List``: the scan of every element so far was quadratic, a replica streaming 32 000 indices
held the event loop for tens of seconds)."""

from __future__ import annotations

from router import deltas


def test_many_interleaved_indices_merge_into_their_own_calls() -> None:
    acc: dict[str, object] = {}
    n = 5000
    deltas.merge(acc, {"tool_calls": [{"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "{"}}
                                      for i in range(n)]})
    for i in reversed(range(n)):
        deltas.merge(acc, {"tool_calls": [{"index": i, "function": {"arguments": f'"k":{i}'}}]})
    deltas.merge(acc, {"tool_calls": [{"index": i, "function": {"arguments": "}"}} for i in range(n)]})
    calls = deltas.message_of(acc)["tool_calls"]
    assert len(calls) == n
    assert calls[123] == {"id": "c123", "function": {"name": "f", "arguments": '{"k":123}'}}
    assert all(call["function"]["arguments"] == '{"k":%d}' % i for i, call in enumerate(calls))
