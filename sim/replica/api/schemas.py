"""OpenAI request shapes the simulated replica accepts, and OpenAI-style error bodies.

Only the fields that change the simulated work are declared; other OpenAI fields (temperature,
top_p, ...) are accepted and ignored, as they do not change the sim's latency. Types are strict:
``"max_tokens": "5"`` is a 400, not a silent conversion.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_MAX_TOKENS = 16  # the OpenAI legacy completions default, used for chat too


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _Common(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def output_tokens(self) -> int:
        """max_completion_tokens (newer OpenAI name) wins over max_tokens; default 16."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return DEFAULT_MAX_TOKENS


class CompletionRequest(_Common):
    prompt: str | list[str] = Field(min_length=1)
    echo: bool = False  # as OpenAI/vLLM: the answer's text starts with the prompt (non-stream only here)
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def prompt_text(self) -> str:
        """The single prompt; a batch of several prompts is refused by the API layer."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def output_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS


class EmbeddingRequest(_Strict):
    """OpenAI embeddings: texts only in the sim (token-id input is refused, 400)."""

    model: str
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=4096)

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a prompt, or chat messages (their texts joined)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None

    def text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "".join(m.text() for m in self.messages or [])


class DetokenizeRequest(_Strict):
    """vLLM's /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[int]


class ResponsesRequest(_Strict):
    """OpenAI's Responses API, the part the sim serves: text or message-item ``input``."""

    model: str
    input: str | list[dict[str, Any]] = Field(min_length=1)
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    store: bool = True

    def text(self) -> str:
        if isinstance(self.input, str):
            return self.input
        return "".join(str(item.get("content", "")) for item in self.input)


def error_body(message: str, err_type: str, param: str | None, code: int) -> dict[str, Any]:
    """OpenAI error JSON: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def validation_error_body(exc: ValidationError) -> dict[str, Any]:
    """400 body naming the first offending field (dotted path, e.g. ``messages.0.content``)."""
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return error_body(f"request body is not valid JSON: {first['msg']}", "BadRequestError", None, 400)
    param = ".".join(str(part) for part in first["loc"]) or None
    return error_body(f"{param or 'request body'}: {first['msg']}", "BadRequestError", param, 400)
