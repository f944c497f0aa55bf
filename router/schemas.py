"""Validation of OpenAI request bodies (chat.completions and completions).

The router forwards the client's bytes unchanged; these models only check them, so unknown
fields are allowed and passed through. Types are strict (no "0.5" -> 0.5 coercion): a wrong
type is the client's error, answered with 400 naming the field (``param``, dotted path with
list indices, e.g. ``messages.0.role``). Field ranges follow the OpenAI API reference.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import BadRequest

Endpoint = Literal["chat.completions", "completions"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ContentPart(_Strict):
    type: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = None
    user: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False


_MODELS: dict[str, type[_Sampling]] = {
    "chat.completions": ChatCompletionRequest,
    "completions": CompletionRequest,
}


def parse_request(raw: bytes, endpoint: Endpoint) -> dict[str, Any]:
    """Parse and validate a request body; returns the parsed JSON object unchanged.

    raw: the HTTP body bytes. Raises BadRequest (400) for invalid JSON, a non-object body,
    a missing required field or a wrong type/range, with ``param`` naming the field.
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    try:
        _MODELS[endpoint].model_validate(body)
    except ValidationError as exc:
        raise _bad_request(exc) from None
    return body


def _bad_request(exc: ValidationError) -> BadRequest:
    first = exc.errors(include_url=False)[0]
    # Union members add their type name to the location; the client only needs the field path.
    path = [str(p) for p in first["loc"] if not _is_union_tag(p)]
    param = ".".join(path) or None
    if first["type"] == "missing":
        message = f"missing required field '{param}'"
        code = "missing_field"
    else:
        message = f"invalid value for '{param}': {first['msg']}"
        code = "invalid_type" if first["type"].endswith("_type") else "invalid_value"
    return BadRequest(message, param=param, code=code)


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "none"} or part.startswith(("list[", "ContentPart", "function-"))
    )
