"""Semantic scope: what must match exactly before two requests are compared by meaning."""

from __future__ import annotations

from typing import Any

from cache.semantic.scope import SemanticQuery, Skip, semantic_query


def chat(*turns: tuple[str, Any], **params: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in turns], **params}


def scope(body: dict[str, Any], tenant: str = "t1") -> str:
    query = semantic_query("chat.completions", body, tenant)
    assert isinstance(query, SemanticQuery), query
    return query.scope


def test_only_the_last_user_turn_is_compared() -> None:
    query = semantic_query("chat.completions", chat(("system", "Be brief."), ("user", " How old is he? ")), "t1")
    assert isinstance(query, SemanticQuery) and query.text == "How old is he?"


def test_follow_ups_in_different_conversations_have_different_scopes() -> None:
    about_obama = chat(
        ("user", "Who is Barack Obama?"), ("assistant", "The 44th US president."), ("user", "How old is he?")
    )
    about_biden = chat(
        ("user", "Who is Joe Biden?"), ("assistant", "The 46th US president."), ("user", "How old is he?")
    )
    assert scope(about_obama) != scope(about_biden)


def test_system_prompt_tenant_and_model_are_part_of_the_scope() -> None:
    base = chat(("system", "Answer in English."), ("user", "What is Redis?"))
    assert scope(base) != scope(chat(("system", "Answer in French."), ("user", "What is Redis?")))
    assert scope(base) != scope(base, tenant="t2")
    assert scope(base) != scope({**base, "model": "other"})
    # same context, different wording of the last turn: same scope (compared by meaning)
    assert scope(base) == scope(chat(("system", "Answer in English."), ("user", "Explain Redis")))


def test_output_affecting_parameters_split_scopes_with_defaults_filled_in() -> None:
    base = chat(("user", "Write a haiku"))
    for change in (
        {"temperature": 0.2},
        {"max_tokens": 10},
        {"seed": 7},
        {"response_format": {"type": "json_object"}},
        {"top_p": 0.5},
        {"n": 2},
    ):
        assert scope(base) != scope({**base, **change}), change
    assert scope(base) == scope({**base, "temperature": 1.0, "top_p": 1, "stream": True, "user": "u"})


def test_content_the_semantic_stage_cannot_judge_is_skipped_with_a_reason() -> None:
    image = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    tool_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    cases = {
        "non_text": chat(("user", image)),
        "tools": {**chat(("user", "Weather in Paris?")), "tools": [{"type": "function", "function": {"name": "w"}}]},
        "not_user_last": chat(("user", "Hi"), ("assistant", "Hello")),
        "empty": chat(("user", "   ")),
        "too_long": chat(("user", "word " * 400)),
    }
    history_with_tools = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather?"},
            tool_call,
            {"role": "tool", "tool_call_id": "1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"},
        ],
    }
    for reason, body in cases.items():
        assert semantic_query("chat.completions", body, "t1") == Skip(reason), reason
    assert semantic_query("chat.completions", history_with_tools, "t1") == Skip("tools")
    assert semantic_query("completions", {"model": "m", "prompt": [1, 2, 3]}, "t1") == Skip("prompt_not_text")
    assert semantic_query("chat.completions", {"model": "m", "messages": "oops"}, "t1") == Skip("not_user_last")


def test_completions_prompt_is_the_compared_text() -> None:
    query = semantic_query("completions", {"model": "m", "prompt": ["Once upon a time"]}, "t1")
    assert isinstance(query, SemanticQuery) and query.text == "Once upon a time"
    other = semantic_query("completions", {"model": "m", "prompt": "Once upon a time", "max_tokens": 16}, "t1")
    assert isinstance(other, SemanticQuery) and other.scope == query.scope


def test_every_non_text_field_splits_the_scope() -> None:
    # Issue 13, finding 3: a semantic hit only within the exact scope of every non-text field.
    base = chat(("user", "Write a haiku"))
    for change in (
        {"guided_choice": ["a", "b"]},
        {"min_tokens": 3},
        {"x_unknown": None},
        {"chat_template_kwargs": {"enable_thinking": True}},
    ):
        assert scope(base) != scope({**base, **change}), change
    named = {"model": "m", "messages": [{"role": "user", "content": "Write a haiku", "name": "bob"}]}
    assert scope(named) != scope(base)
    pooled = semantic_query("chat.completions", base, "t1", pool="other")
    assert isinstance(pooled, SemanticQuery) and pooled.scope != scope(base)


def test_answers_that_repeat_the_prompt_are_never_matched_by_meaning() -> None:
    # An answer with echo (the prompt is part of its text) or prompt_logprobs (one entry per
    # prompt token) served for another wording would show the other client's prompt.
    prompt = {"model": "m", "prompt": "Once upon a time"}
    for extra in ({"echo": True}, {"prompt_logprobs": 1}, {"echo": 1}):
        assert semantic_query("completions", {**prompt, **extra}, "t1") == Skip("echo"), extra
        assert semantic_query("chat.completions", chat(("user", "Hi there"), **extra), "t1") == Skip("echo"), extra
    assert isinstance(
        semantic_query("completions", {**prompt, "echo": False, "prompt_logprobs": None}, "t1"), SemanticQuery
    )


def test_embeddings_are_never_matched_by_meaning() -> None:
    # issue 12: the embedding of a paraphrase is not the embedding of this text
    assert semantic_query("embeddings", {"model": "m", "input": "How do I turn on the lights?"}, "t") == Skip(
        "endpoint"
    )
