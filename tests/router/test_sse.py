"""Unit tests of SSE replay and stream assembly (no I/O)."""

from __future__ import annotations

import json

from router.stream.sse import StreamAssembler, replay

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "word " * 40 + "end"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 41, "total_tokens": 50},
}
TEXT = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1700000000,
    "model": "m",
    "choices": [{"index": 0, "text": "hello there", "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
}


def events(stream: bytes) -> list[str]:
    return [line[6:] for line in stream.decode().split("\n") if line.startswith("data: ")]


def test_chat_replay_has_role_content_finish_usage_and_done() -> None:
    out = events(b"".join(replay(CHAT)))
    assert out[-1] == "[DONE]"
    chunks = [json.loads(e) for e in out[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len(contents) > 1 and "".join(contents) == CHAT["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == CHAT["usage"]


def test_replay_then_assembly_gives_back_the_response() -> None:
    for response in (CHAT, TEXT):
        assembler = StreamAssembler()
        for event in replay(response):
            assembler.feed(event)
        assert assembler.result() == response


def test_assembly_across_arbitrary_byte_splits_and_tool_calls() -> None:
    chunks = [
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_", "arguments": ""},
                            }
                        ],
                    },
                    "finish_reason": None,
                }
            ],
        },
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": '{"c":1}'}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        },
    ]
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    assembler = StreamAssembler()
    for i in range(0, len(raw), 7):
        assembler.feed(raw[i : i + 7])
    result = assembler.result()
    assert result is not None
    call = result["choices"][0]["message"]["tool_calls"][0]
    assert call == {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"c":1}'}}
    assert result["choices"][0]["finish_reason"] == "tool_calls"


def test_incomplete_or_failed_streams_are_not_assembled() -> None:
    events_ = list(replay(CHAT))
    cut = StreamAssembler()
    for event in events_[:-1]:  # no [DONE]
        cut.feed(event)
    assert cut.result() is None
    no_finish = StreamAssembler()
    for event in events_[:2] + events_[-1:]:  # [DONE] but no finish_reason
        no_finish.feed(event)
    assert no_finish.result() is None
    error = StreamAssembler()
    for event in events_[:3] + [b'data: {"error": {"message": "boom"}}\n\n'] + events_[3:]:
        error.feed(event)
    assert error.result() is None


def _fed(raw: bytes, step: int, max_bytes: int | None = None) -> StreamAssembler:
    assembler = StreamAssembler(max_bytes=max_bytes)
    for i in range(0, len(raw), step):
        assembler.feed(raw[i : i + step])
    return assembler


def test_assembly_reads_every_line_end_the_sse_spec_allows() -> None:
    # Attack review (Dec 2, F13): WHATWG's event stream ends a line with CRLF, LF or CR alone;
    # a stream of CR-only lines was relayed but never assembled (no line was ever seen), and a
    # CRLF cut between two feeds must not count as two line ends.
    lf = b"".join(replay(CHAT))
    for end in (b"\r", b"\r\n"):
        raw = lf.replace(b"\n", end)
        for step in (1, 2, 7, len(raw)):
            assert _fed(raw, step).result() == CHAT, (end, step)


def test_assembly_stops_past_its_byte_bound_but_still_sees_the_end_and_usage() -> None:
    # Attack review (Dec 2, F9): a streamed answer was assembled without any bound.
    long = {**CHAT, "choices": [{**CHAT["choices"][0], "message": {"role": "assistant", "content": "word " * 400}}]}
    raw = b"".join(replay(long))  # 2,000 characters of answer, events of ~150 bytes
    small = _fed(raw, 5, max_bytes=1000)
    assert small.too_large and small.done and small.result() is None
    assert small.usage == CHAT["usage"]  # still counted and settled
    assert _fed(raw, 5, max_bytes=10_000).result() == long
    # one event larger than the bound and without a line end yet is not held whole either
    huge = StreamAssembler(max_bytes=1000)
    huge.feed(b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "')
    for _ in range(100):
        huge.feed(b"y" * 1000)
        assert sum(len(p) for p in huge._pending) <= 2000
    huge.feed(b'"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    assert huge.too_large and huge.done and huge.result() is None


def test_the_byte_count_follows_the_assembled_answer_not_the_chunk_framing() -> None:
    # one token per chunk: the chunks' repeated id/model/delta framing is many times the text;
    # the bound is on the entry, which holds the text once
    answer = {
        **CHAT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ab" * 2000},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
    }
    raw = b"".join(replay(answer))
    entry = len(json.dumps(answer))
    assert len(raw) > 2 * entry
    assert _fed(raw, 4096, max_bytes=int(entry * 1.5)).result() == answer
    assert _fed(raw, 4096, max_bytes=entry // 2).result() is None


def test_data_events_are_counted_across_byte_splits_but_not_done() -> None:
    # what a stream that ends without usage is charged for (router/stream/relay.py)
    stream = b"".join(replay(CHAT))
    sent = events(stream)
    assert sent[-1] == "[DONE]"
    for step in (1, 7, len(stream)):
        assembler = StreamAssembler()
        for i in range(0, len(stream), step):
            assembler.feed(stream[i : i + step])
        assert assembler.events == len(sent) - 1
    cut = StreamAssembler()
    cut.feed(stream[: stream.index(b"data:", 200)])  # cut mid-stream, as by a killed replica
    assert 0 < cut.events < len(sent) - 1 and cut.usage is None
