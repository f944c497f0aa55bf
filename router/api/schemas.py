"""Validation of OpenAI request bodies (chat.completions, completions, embeddings) and of
vLLM's /tokenize and /detokenize.

The router forwards the client's bytes unchanged; these models only check them, so unknown
fields are allowed and passed through. Types are strict (no "0.5" -> 0.5 coercion): a wrong
type is the client's error, answered with 400 naming the field (``param``, dotted path with
list indices, e.g. ``messages.0.role``). Field ranges follow the OpenAI API reference.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import BadRequest
from router.process.limits import Limits

Endpoint = Literal["chat.completions", "completions", "embeddings", "tokenize", "detokenize", "responses"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ContentPart(_Strict):
    type: str
    text: str | None = None  # a text part's text; other parts (image_url, input_audio) have none


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # the list first: a bad part is then reported at its own path (messages.0.content.0.text)
    content: list[ContentPart] | str | None = None


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
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # vLLM, PyTorch: 64-bit seeds
    user: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False


class EmbeddingRequest(_Strict):
    """OpenAI embeddings (vLLM's pooling models): ``input`` one text, texts, or token ids."""

    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class TokenizeRequest(_Strict):
    """vLLM's ``POST /tokenize``: a ``prompt`` or chat ``messages`` of ``model``."""

    model: str = Field(min_length=1)
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None


class DetokenizeRequest(_Strict):
    """vLLM's ``POST /detokenize``: token ids of ``model`` back to text."""

    model: str = Field(min_length=1)
    tokens: list[int]


class ResponsesRequest(_Strict):
    """OpenAI's Responses API: ``input`` text or items; ``previous_response_id`` continues a
    stored response (router/api/responses.py sends it to the replica holding it)."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    previous_response_id: str | None = Field(None, min_length=1)
    instructions: str | None = None
    stream: bool = False
    store: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)


_MODELS: dict[str, type[_Strict]] = {
    "chat.completions": ChatCompletionRequest,
    "completions": CompletionRequest,
    "embeddings": EmbeddingRequest,
    "tokenize": TokenizeRequest,
    "detokenize": DetokenizeRequest,
    "responses": ResponsesRequest,
}


_DEFAULT_LIMITS = Limits()
# A JSON escape of a UTF-16 surrogate (\uD800-\uDFFF): the only way a lone surrogate can reach a
# str, since the body is decoded as strict UTF-8 first. A pair is fine (json joins it into one
# character); a lone one cannot be encoded (cache key digest, prefix hash) and is no text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON string once its escaped backslashes and quotes are gone (see _check_containers).
_PLAIN_STRING = re.compile(rb'"[^"]*"')


def parse_request(raw: bytes, endpoint: Endpoint, limits: Limits = _DEFAULT_LIMITS) -> dict[str, Any]:
    """Parse and validate a request body; returns the parsed JSON object unchanged.

    raw: the HTTP body bytes (already bounded by ``limits.max_body_bytes``, router/api/bodylimit.py).
    Raises BadRequest (400) for a body that is not UTF-8 JSON (``NaN``/``Infinity`` included),
    not an object, or nested deeper than ``limits.max_json_depth`` (code ``invalid_json``); a
    lone surrogate in any string or key (``invalid_unicode``); more than ``limits.max_messages``
    messages or prompt items, ``max_tokens`` over ``limits.max_output_tokens``, a missing
    required field or a wrong type/range (``param`` names the field).
    """
    _check_containers(raw, limits.max_json_containers, limits.max_json_values)
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:  # the C scanner's own bound (~1,000 levels), below ours never reached
        raise BadRequest(
            f"request body is nested deeper than {limits.max_json_depth} levels", code="invalid_json"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    # Fast paths: a body with few brackets cannot be deep, one without a surrogate escape has no
    # lone surrogate; only other bodies are walked (cost: one pass over the parsed values).
    deep = raw.count(b"[") + raw.count(b"{") > limits.max_json_depth
    texts = _SURROGATE_ESCAPE.search(raw) is not None
    if deep or texts:
        _walk(body, limits.max_json_depth, texts)
    _check_counts(body, endpoint, limits)
    try:
        _MODELS[endpoint].model_validate(body)
    except ValidationError as exc:
        raise _bad_request(exc) from None
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(field)
        if isinstance(value, int) and value > limits.max_output_tokens:
            raise BadRequest(
                f"invalid value for '{field}': at most {limits.max_output_tokens}", param=field, code="invalid_value"
            )
    return body


def _check_containers(raw: bytes, limit: int, max_values: int | None = None) -> None:
    """Raise BadRequest when the body holds more than ``limit`` objects and arrays, or more than
    ``max_values`` values in its arrays and objects (None: no bound), counted on the bytes before
    parsing. One parsed empty object costs ~200 bytes and ~2 us (8 MiB of ``{},`` was +673 MB and
    4.9 s); every value costs validation, walk and digest time on the event loop (2M integers
    in 70 lists held the loop, and /health with it, for 9.8 s). Values are counted as commas
    (n values in a container have n - 1). Brackets and commas inside strings are text: they are
    counted only after blanking strings out, which runs only when a plain count is over."""
    values_over = max_values is not None and raw.count(b",") > max_values
    if raw.count(b"{") + raw.count(b"[") <= limit and not values_over:
        return
    # drop escape pairs left to right (\\ first, so that \\" is a backslash then a quote's end),
    # then every string is quote, non-quotes, quote: cut with a simple, fast pattern
    bare = _PLAIN_STRING.sub(b"", raw.replace(b"\\\\", b"").replace(b'\\"', b""))
    if bare.count(b"{") + bare.count(b"[") > limit:
        raise BadRequest(
            f"request body has more than {limit} JSON containers (objects and arrays)", code="invalid_json"
        )
    if max_values is not None and bare.count(b",") > max_values:
        raise BadRequest(
            f"request body has more than {max_values} JSON values in its arrays and objects", code="invalid_json"
        )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _walk(body: dict[str, Any], max_depth: int, texts: bool) -> None:
    """Raise BadRequest for nesting deeper than ``max_depth`` (the body is level 1) or, when
    ``texts``, a lone surrogate in a string or key; iterative, so no depth can overflow the
    stack. Scalars other than strings are never pushed, and no path is built on the way: the
    culprit's path is found again only when there is one (building a path tuple per value
    made a body of 2M numbers cost seconds of event loop)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise BadRequest(f"request body is nested deeper than {max_depth} levels", code="invalid_json")
        if isinstance(value, dict):
            for key, item in value.items():
                if texts and _SURROGATE.search(key) is not None:
                    _lone_surrogate(body)
                if isinstance(item, (dict, list)) or (texts and isinstance(item, str)):
                    stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend(
                (item, depth + 1)
                for item in value
                if isinstance(item, (dict, list)) or (texts and isinstance(item, str))
            )
        elif _SURROGATE.search(value) is not None:
            _lone_surrogate(body)


def _lone_surrogate(body: dict[str, Any]) -> None:
    """Raise the 400 naming the first string or key (depth first) holding a lone surrogate."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                _text(key, (*path, key))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value) if isinstance(item, (dict, list, str)))
        elif isinstance(value, str):
            _text(value, path)


def _text(value: str, path: tuple[str, ...]) -> None:
    if _SURROGATE.search(value) is not None:
        # a key can be the culprit: the path is shown with its surrogates escaped (\\ud800)
        param = ".".join(path).encode("utf-8", "backslashreplace").decode() or None
        raise BadRequest(
            f"invalid value for '{param}': a lone UTF-16 surrogate is not text", param=param, code="invalid_unicode"
        )


def _check_counts(body: dict[str, Any], endpoint: Endpoint, limits: Limits) -> None:
    """Bound the items that each cost validation, key and estimate work before validating them."""
    field = {"chat.completions": "messages", "embeddings": "input", "responses": "input", "detokenize": "tokens"}.get(
        endpoint, "prompt"
    )
    if endpoint == "tokenize" and "messages" in body:
        field = "messages"
    items = body.get(field)
    # a prompt of token ids is one prompt (bounded by the body size); a list of prompts is a batch
    if isinstance(items, list) and len(items) > limits.max_messages and not isinstance(items[0], int):
        raise BadRequest(
            f"invalid value for '{field}': at most {limits.max_messages} items", param=field, code="invalid_value"
        )


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
