"""Stored answers are the answer (issue 12): a stream assembled into a response and a response
replayed as a stream keep every field, pure (no I/O). The live versions through the router and
the sim are in test_fidelity_live.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.stream.sse import StreamAssembler, UsageFilter, replay, strip_usage_event

HEAD = {
    "id": "chatcmpl-9",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "m",
    "system_fingerprint": "fp_abc",
}


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def assemble(raw: bytes) -> dict[str, Any] | None:
    assembler = StreamAssembler()
    for i in range(0, len(raw), 5):  # any byte split
        assembler.feed(raw[i : i + 5])
    return assembler.result()


def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> dict[str, Any]:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **extra}]}


def token(text: str, lp: float) -> dict[str, Any]:
    return {
        "token": text,
        "logprob": lp,
        "bytes": list(text.encode()),
        "top_logprobs": [{"token": text, "logprob": lp, "bytes": list(text.encode())}],
    }


def test_a_streamed_tool_call_assembles_to_content_null() -> None:
    raw = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, "tool_calls", stop_reason=None),
    )
    result = assemble(raw)
    assert result is not None
    message = result["choices"][0]["message"]
    assert message["content"] is None  # what the non-stream answer says: was ""
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert result["choices"][0]["stop_reason"] is None and "stop_reason" in result["choices"][0]


def test_a_stream_keeps_logprobs_reasoning_and_the_system_fingerprint() -> None:
    raw = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Think "}),
        chunk({"reasoning_content": "hard."}),
        chunk({"content": "Hi"}, logprobs={"content": [token("Hi", -0.1)]}),
        chunk({"content": " there"}, logprobs={"content": [token(" there", -0.5)]}),
        chunk({}, "stop"),
        {**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    )
    result = assemble(raw)
    assert result is not None
    assert result["system_fingerprint"] == "fp_abc" and result["object"] == "chat.completion"
    choice = result["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hi there", "reasoning_content": "Think hard."}
    assert choice["logprobs"] == {"content": [token("Hi", -0.1), token(" there", -0.5)]}
    assert result["usage"]["total_tokens"] == 5


RESPONSES = [
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "system_fingerprint": "fp_1",
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi there",
                    "refusal": None,
                    "reasoning_content": "Short thought " * 9,
                },
                "logprobs": {"content": [token("Hi", -0.1), token(" there", -0.5)], "refusal": None},
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    },
    {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "", "refusal": "I can't."},
                "logprobs": None,
                "finish_reason": "stop",
            },
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12},
    },
    {
        "id": "cmpl-3",
        "object": "text_completion",
        "created": 1700000000,
        "model": "m",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "text": "ab cd",
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": {
                    "tokens": ["ab", " cd"],
                    "token_logprobs": [-0.2, -0.3],
                    "top_logprobs": [{"ab": -0.2}, {" cd": -0.3}],
                    "text_offset": [0, 2],
                },
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    },
]


@pytest.mark.parametrize("response", RESPONSES, ids=["logprobs-reasoning", "tools-refusal-n2", "text-logprobs"])
def test_replay_then_assembly_gives_back_every_field(response: dict[str, Any]) -> None:
    assert assemble(b"".join(replay(response, include_usage=True))) == response


def test_replayed_chunks_carry_the_fingerprint_and_token_logprobs() -> None:
    events = [
        json.loads(e[6:])
        for e in b"".join(replay(RESPONSES[0], include_usage=True)).decode().split("\n\n")
        if e.startswith("data: {")
    ]
    assert all(e["system_fingerprint"] == "fp_1" for e in events)
    per_token = [
        e["choices"][0]["logprobs"]["content"]
        for e in events
        if e["choices"] and (e["choices"][0].get("logprobs") or {}).get("content")
    ]
    assert per_token == [[token("Hi", -0.1)], [token(" there", -0.5)]]  # one token's logprobs per chunk


def test_replay_has_a_usage_chunk_only_when_asked() -> None:
    without = b"".join(replay(RESPONSES[0], include_usage=False))
    assert b'"usage"' not in without and without.endswith(b"data: [DONE]\n\n")
    with_usage = b"".join(replay(RESPONSES[0], include_usage=True)).split(b"\n\n")
    assert json.loads(with_usage[-3][6:])["usage"]["total_tokens"] == 5


def test_strip_usage_event_drops_only_the_usage_chunk() -> None:
    usage = {**HEAD, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    content = chunk({"content": "x"})
    assert strip_usage_event(b"data: " + json.dumps(usage).encode()) is None
    event = b"data: " + json.dumps(content).encode()
    assert strip_usage_event(event) == event
    for spaced in (False, True):  # the "usage": null a stream that asked for usage has on each chunk
        with_null = json.dumps({**content, "usage": None}, separators=None if spaced else (",", ":")).encode()
        assert json.loads(strip_usage_event(b"data: " + with_null)[6:]) == content
        first = json.dumps({"usage": None, **content}).encode()
        assert json.loads(strip_usage_event(b"data: " + first)[6:]) == content
    quoted = chunk({"content": 'say ,"usage":null please'})
    assert strip_usage_event(b"data: " + json.dumps(quoted).encode()) == b"data: " + json.dumps(quoted).encode()


@pytest.mark.parametrize("response", RESPONSES, ids=["logprobs-reasoning", "tools-refusal-n2", "text-logprobs"])
def test_the_usage_filter_gives_the_stream_the_client_asked_for_in_any_byte_split(response: dict[str, Any]) -> None:
    # regression: the filter dropped the usage chunk but relayed the other events unchanged,
    # "usage": null and all
    asked = b"".join(replay(response, include_usage=True))
    usage_filter = UsageFilter()
    out = b"".join(usage_filter.feed(asked[i : i + 7]) for i in range(0, len(asked), 7)) + usage_filter.flush()
    assert out == b"".join(replay(response, include_usage=False))


def test_usage_filter_holds_no_event_past_its_bound_and_relays_it_as_it_comes() -> None:
    # A replica's event without an end (one 192 MB line) was held whole until the stream ended:
    # the client got nothing, the router held it all (670 MB peak RSS, attack review Dec 2 #2)
    from router.stream.sse import USAGE_FILTER_MAX_HELD

    usage_filter = UsageFilter()
    piece = b"x" * 16384
    head = b'data: {"choices":[{"index":0,"delta":{"content":"'
    out = [usage_filter.feed(head)]
    pieces = 4 * USAGE_FILTER_MAX_HELD // len(piece)
    for _ in range(pieces):
        out.append(usage_filter.feed(piece))
        assert len(usage_filter._buf) <= USAGE_FILTER_MAX_HELD + len(piece)
    assert sum(map(len, out)) > pieces * len(piece) - USAGE_FILTER_MAX_HELD - len(piece)  # relayed as it came
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    tail = b'"}}]}\r\n\r' + b"\ndata: [DONE]\n\n" + usage + b"\n\n" + b"data: [DONE]\n\n"
    pieces = USAGE_FILTER_MAX_HELD // len(piece) + 2  # just past the bound
    for i in range(len(tail)):  # the end of the long event is found across any split, the usage still stripped
        f = UsageFilter()
        got = (
            f.feed(head)
            + b"".join(f.feed(piece) for _ in range(pieces))
            + f.feed(tail[:i])
            + f.feed(tail[i:])
            + f.flush()
        )
        assert got == head + piece * pieces + b'"}}]}\r\n\r\ndata: [DONE]\n\n' + b"data: [DONE]\n\n"


def test_events_after_done_make_the_stream_unstorable() -> None:
    # A client stops reading at [DONE]; a replica that sent its answer after [DONE] was stored
    # with that answer, which the client it was generated for never saw (attack review Dec 2 #2)
    assembler = StreamAssembler()
    assembler.feed(
        b'data: [DONE]\n\ndata: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    )
    assert assembler.result() is None


@pytest.mark.parametrize(
    "answer",
    [
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "Hi"}}],
        },
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"text": "Hi", "index": 0, "finish_reason": "length"}],
        },
    ],
    ids=["chat", "completions"],
)
def test_a_choice_without_logprobs_comes_back_without_them(answer: dict[str, Any]) -> None:
    """llama-server leaves ``logprobs`` out of a choice when none were asked for (vLLM and OpenAI
    say ``null``). Regression: a stream hit said ``"logprobs": null`` on every chunk and
    assembled to a choice with it, a field the replica had not sent."""
    raw = b"".join(replay(answer, include_usage=False))
    assert all(
        "logprobs" not in c
        for line in raw.split(b"\n\n")
        if line.startswith(b"data: {")
        for c in json.loads(line[6:])["choices"]
    )
    assert assemble(raw) == answer


def test_logprobs_null_stays_null() -> None:
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "logprobs": None, "finish_reason": "stop"}
        ],
    }
    assert assemble(b"".join(replay(answer, include_usage=False))) == answer
