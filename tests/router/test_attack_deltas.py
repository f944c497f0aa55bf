"""The delta merge of many ``tool_calls`` indices, interleaved over chunks, gives each call its
own parts in order (the merge now finds an index's element by a dict, router/stream/deltas.py
``_List``: the scan of every element so far was quadratic, a replica streaming 32 000 indices
held the event loop for tens of seconds)."""

from __future__ import annotations

from router.stream import deltas


def test_many_interleaved_indices_merge_into_their_own_calls() -> None:
    acc: dict[str, object] = {}
    n = 5000
    deltas.merge(
        acc,
        {"tool_calls": [{"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "{"}} for i in range(n)]},
    )
    for i in reversed(range(n)):
        deltas.merge(acc, {"tool_calls": [{"index": i, "function": {"arguments": f'"k":{i}'}}]})
    deltas.merge(acc, {"tool_calls": [{"index": i, "function": {"arguments": "}"}} for i in range(n)]})
    calls = deltas.message_of(acc)["tool_calls"]
    assert len(calls) == n
    assert calls[123] == {"id": "c123", "function": {"name": "f", "arguments": '{"k":123}'}}
    assert all(call["function"]["arguments"] == '{"k":%d}' % i for i, call in enumerate(calls))


def test_the_usage_filter_and_the_assembler_keep_events_whole_across_any_split() -> None:
    """Event ends split over chunks one byte at a time, and a long event fed in pieces, come out
    as a whole search would cut them (the filter now searches only new bytes, the assembler
    keeps an unfinished line without splitting it again: both were quadratic in a long event,
    48 s and 3 s of the event loop for 16 MiB fed 16 KiB at a time)."""
    from router.stream.sse import StreamAssembler, UsageFilter

    long = (
        b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","usage":null,'
        b'"choices":[{"index":0,"delta":{"content":"' + b"y" * 100_000 + b'"},"finish_reason":"stop"}]}'
    )
    answer = long + b"\n\ndata: [DONE]\n\n"
    stream = b": 1\r\r: 2\r\n\r\n: 3\n\n" + answer  # comments with every kind of event end
    for size in (1, 7, 4096):
        usage, assembler = UsageFilter(), StreamAssembler()
        out = b""
        for i in range(0, len(stream), size):
            out += usage.feed(stream[i : i + size])
            assembler.feed(stream[i : i + size])
        out += usage.flush()
        assert out == stream.replace(b',"usage":null', b"")
        result = assembler.result()
        assert result is not None and result["choices"][0]["message"]["content"] == "y" * 100_000
