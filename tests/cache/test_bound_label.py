"""Labels from compared misses (cache/verify/bound/label.py): only greedy single-choice requests are
judged, by identical output."""

from __future__ import annotations

from typing import Any

from cache.verify.bound.label import compared_label


def chat(content: Any, tool_calls: Any = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


GREEDY = {"model": "m", "messages": [], "temperature": 0}


def test_greedy_answers_are_compared_by_their_output() -> None:
    assert compared_label(GREEDY, chat("Paris."), chat("Paris.")) is True
    assert compared_label(GREEDY, chat("Paris."), chat("Paris is the capital.")) is False
    call = [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert compared_label(GREEDY, chat(None, call), chat(None, [])) is False
    completion = {"choices": [{"index": 0, "text": " 4", "finish_reason": "stop"}]}
    assert compared_label({"prompt": "2+2=", "temperature": 0.0}, completion, completion) is True
    # ids, timestamps and usage are not the answer
    assert compared_label(GREEDY, chat("Paris.") | {"id": "a", "created": 1}, chat("Paris.") | {"id": "b"}) is True


def test_sampled_or_several_choices_give_no_label() -> None:
    for body in (
        {"messages": []},
        {"temperature": 0.7},
        {"temperature": "0"},
        {"temperature": 0, "n": 2},
        {"temperature": None},
    ):
        assert compared_label(body, chat("Paris."), chat("Paris.")) is None
    assert compared_label(GREEDY, {"choices": []}, chat("Paris.")) is None
    assert compared_label(GREEDY, {"error": "x"}, chat("Paris.")) is None
