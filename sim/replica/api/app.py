"""FastAPI app of one simulated vLLM replica (OpenAI API + vLLM /metrics + fault knobs)."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.replica.api import output, surface
from sim.replica.api import responses as r
from sim.replica.api.schemas import (
    DEFAULT_MAX_TOKENS,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ResponsesRequest,
    TokenizeRequest,
    error_body,
    validation_error_body,
)
from sim.replica.engine import Engine, Handle
from sim.replica.latency.batch import ModelLimitError, Profile
from sim.replica.latency.profiles import get_profile
from sim.replica.settings import SimSettings
from sim.replica.tokens import chat_token_ids, estimate_chat_tokens, estimate_text_tokens, filler, text_token_ids


class Faults(BaseModel):
    """Fault knobs, settable at run time with POST /sim/faults (for router tests)."""

    model_config = ConfigDict(extra="forbid")
    fail_rate: float = Field(default=0.0, ge=0, le=1)
    hang: bool = False


@dataclass
class Replica:
    settings: SimSettings
    profile: Profile
    engine: Engine
    faults: Faults
    rng: random.Random
    draining: bool = False
    responses: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # kept ones, by id


def _error(message: str, err_type: str, param: str | None, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, err_type, param, status), status_code=status)


def create_app(settings: SimSettings, profile: Profile | None = None) -> FastAPI:
    """App for one replica. ``profile`` overrides ``settings.profile`` (tests use tiny ones);
    ``settings.max_model_len``, when set, overrides the profile's. Raises ValueError when that
    does not fit the profile's KV cache, KeyError for an unknown profile name."""
    prof = profile or get_profile(settings.profile)
    if settings.max_model_len is not None:
        prof = dataclasses.replace(prof, max_model_len=settings.max_model_len)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(
            prof,
            settings.model,
            settings.warmup_s,
            settings.time_scale,
            settings.enable_prefix_caching,
            settings.block_size,
        )
        faults = Faults(fail_rate=settings.fail_rate, hang=settings.hang)
        app.state.replica = Replica(settings, prof, engine, faults, random.Random(settings.seed))
        engine.start(settings.warmup_from)
        yield
        await engine.stop()

    app = FastAPI(title=f"PromptEdge sim replica ({prof.name})", lifespan=lifespan)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        rep: Replica = request.app.state.replica
        if rep.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not rep.engine.ready:
            return JSONResponse({"status": "warming_up"}, status_code=503)
        return JSONResponse({"status": "ok", "model": rep.settings.model, "profile": rep.profile.name})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        rep: Replica = request.app.state.replica
        if not _authorized(request, rep):
            return _unauthorized()
        return JSONResponse(r.models_body(rep.settings.model, rep.profile.max_model_len))

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        rep: Replica = request.app.state.replica
        return Response(rep.engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/sim/faults")
    async def set_faults(request: Request) -> JSONResponse:
        rep: Replica = request.app.state.replica
        try:
            rep.faults = Faults.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse(validation_error_body(exc), status_code=400)
        return JSONResponse(rep.faults.model_dump())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(request, "text")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await _surface(request, EmbeddingRequest, _embed)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await _respond(request)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await _surface(request, TokenizeRequest, _tokenize)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await _surface(request, DetokenizeRequest, _detokenize)

    return app


def _authorized(request: Request, rep: Replica) -> bool:
    """True when no key is set, or the request's bearer token is the key (constant-time)."""
    key = rep.settings.api_key
    if key is None:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())


def _unauthorized() -> JSONResponse:
    return _error("invalid or missing API key", "AuthenticationError", None, 401)


async def _parse(request: Request, schema: type[BaseModel]) -> tuple[Replica, Any] | Response:
    """(replica, validated request) of a request to this replica, or the error to answer:
    401 without the key, 400 for a body ``schema`` refuses, 404 for another ``model``."""
    rep: Replica = request.app.state.replica
    if not _authorized(request, rep):
        return _unauthorized()
    try:
        req = schema.model_validate_json(await request.body())
    except ValidationError as exc:
        return JSONResponse(validation_error_body(exc), status_code=400)
    model = getattr(req, "model", None)
    if model is not None and model != rep.settings.model:
        return _error(f"The model `{model}` does not exist.", "NotFoundError", "model", 404)
    return rep, req


async def _surface(request: Request, schema: type[BaseModel], answer: Any) -> Response:
    """An embeddings / tokenizer request: authorized, validated, the model checked, the
    replica up; then ``answer(replica, request model)``'s JSON (no engine time: these are
    cheap next to a generation)."""
    parsed = await _parse(request, schema)
    if isinstance(parsed, Response):
        return parsed
    rep, req = parsed
    if rep.draining or not rep.engine.ready:
        return _error("replica is warming up or shutting down", "ServiceUnavailableError", None, 503)
    try:
        return JSONResponse(answer(rep, req))
    except ValueError as exc:
        return _error(str(exc), "BadRequestError", None, 400)


def _embed(rep: Replica, req: EmbeddingRequest) -> dict[str, Any]:
    texts = req.texts()
    return surface.embeddings_body(
        rep.settings.model, texts, req.encoding_format, req.dimensions, sum(estimate_text_tokens(t) for t in texts)
    )


def _tokenize(rep: Replica, req: TokenizeRequest) -> dict[str, Any]:
    tokens = surface.tokenize(req.text())
    return {"count": len(tokens), "max_model_len": rep.profile.max_model_len, "tokens": tokens}


def _detokenize(rep: Replica, req: DetokenizeRequest) -> dict[str, Any]:
    try:
        return {"prompt": surface.detokenize(req.tokens)}
    except (UnicodeDecodeError, OverflowError):
        raise ValueError("tokens: not token ids of this model") from None


_KEPT_RESPONSES = 10_000


async def _respond(request: Request) -> Response:
    """``POST /v1/responses``: generated like a completion (engine time, filler text), kept
    by this replica when ``store`` (the oldest dropped past _KEPT_RESPONSES); an unknown
    ``previous_response_id`` is a 404 as vLLM's. Stream: ``response.created``, text deltas,
    ``response.completed``."""
    parsed = await _parse(request, ResponsesRequest)
    if isinstance(parsed, Response):
        return parsed
    rep, req = parsed
    if req.previous_response_id is not None and req.previous_response_id not in rep.responses:
        return _error(
            f"Response with id '{req.previous_response_id}' not found.", "NotFoundError", "previous_response_id", 404
        )
    if rep.draining or not rep.engine.ready:
        return _error("replica is warming up or shutting down", "ServiceUnavailableError", None, 503)
    prompt_tokens, max_tokens = estimate_text_tokens(req.text()), req.max_output_tokens or DEFAULT_MAX_TOKENS
    try:
        handle = rep.engine.submit(prompt_tokens, max_tokens, text_token_ids(req.text()))
    except ModelLimitError as exc:
        return _error(str(exc), "BadRequestError", "max_output_tokens", 400)
    response_id = "resp_" + r.new_id("text")[5:]

    def final() -> dict[str, Any]:
        body = surface.response_body(
            response_id, req.model, filler(0, max_tokens), req.previous_response_id, prompt_tokens, max_tokens
        )
        if req.store:
            rep.responses[response_id] = body
            while len(rep.responses) > _KEPT_RESPONSES:
                rep.responses.pop(next(iter(rep.responses)))
        return body

    if req.stream:
        return StreamingResponse(_response_events(rep, handle, req, response_id, final), media_type="text/event-stream")
    try:
        await handle.done.wait()
    finally:
        rep.engine.abort(handle)
    return JSONResponse(final())


async def _response_events(
    rep: Replica, handle: Handle, req: ResponsesRequest, response_id: str, final: Any
) -> AsyncIterator[bytes]:
    try:
        created = surface.response_body(response_id, req.model, "", req.previous_response_id, 0, 0, "in_progress")
        yield surface.response_event("response.created", 0, response=created)
        await handle.first_token.wait()
        sent, sequence = 0, 1
        while sent < handle.max_tokens:
            upto = handle.generated
            if upto > sent:
                yield surface.response_event(
                    "response.output_text.delta",
                    sequence,
                    output_index=0,
                    content_index=0,
                    item_id="msg_" + response_id[5:],
                    delta=filler(sent, upto - sent),
                )
                sent, sequence = upto, sequence + 1
            if sent < handle.max_tokens:
                try:
                    await asyncio.wait_for(handle.done.wait(), rep.settings.stream_interval_s)
                except TimeoutError:
                    pass
        yield surface.response_event("response.completed", sequence, response=final())
    finally:
        rep.engine.abort(handle)


async def _complete(request: Request, kind: r.Kind) -> Response:
    rep: Replica = request.app.state.replica
    if not _authorized(request, rep):
        return _unauthorized()
    schema = ChatRequest if kind == "chat" else CompletionRequest
    try:
        req = schema.model_validate_json(await request.body())
    except ValidationError as exc:
        return JSONResponse(validation_error_body(exc), status_code=400)
    if req.model != rep.settings.model:
        return _error(f"The model `{req.model}` does not exist.", "NotFoundError", "model", 404)
    if isinstance(req, CompletionRequest):
        if isinstance(req.prompt, list) and len(req.prompt) > 1:
            return _error("prompt: batched prompts are not supported by the sim", "BadRequestError", "prompt", 400)
        prompt_tokens = estimate_text_tokens(req.prompt_text())
        token_ids = text_token_ids(req.prompt_text())
        if req.echo and req.stream:
            return _error("echo: not supported with stream by the sim", "BadRequestError", "echo", 400)
    else:
        prompt_tokens = estimate_chat_tokens(m.text() for m in req.messages)
        token_ids = chat_token_ids((m.role, m.text()) for m in req.messages)
    if rep.draining:
        return _error("replica is shutting down", "ServiceUnavailableError", None, 503)
    if not rep.engine.ready:
        return _error("replica is warming up", "ServiceUnavailableError", None, 503)
    if rep.faults.hang:  # a stall: held until the fault is cleared (then served) or the client leaves
        while rep.faults.hang:
            if await request.is_disconnected():
                return Response(status_code=499)
            await asyncio.sleep(0.05)
    if rep.rng.random() < rep.faults.fail_rate:
        return _error("simulated replica failure", "InternalServerError", None, 500)
    max_tokens = req.output_tokens()
    try:
        handle = rep.engine.submit(prompt_tokens, max_tokens, token_ids)
    except ModelLimitError as exc:
        return _error(str(exc), "BadRequestError", "max_tokens", 400)
    req_id = r.new_id(kind)
    shape = _shape(rep, req)
    extra = {} if rep.settings.system_fingerprint is None else {"system_fingerprint": rep.settings.system_fingerprint}
    if req.stream:
        events = _stream(rep, handle, shape, r.Head(kind, req_id, req.model, req.include_usage, extra))
        return StreamingResponse(events, media_type="text/event-stream")
    try:
        await handle.done.wait()
    finally:
        rep.engine.abort(handle)
    echoed = req.prompt_text() if isinstance(req, CompletionRequest) and req.echo else ""
    body = r.completion_body(
        kind, req_id, req.model, output.whole(shape, max_tokens, echoed), prompt_tokens, max_tokens, extra
    )
    return JSONResponse(body)


def _shape(rep: Replica, req: ChatRequest | CompletionRequest) -> output.Shape:
    """What the answer holds besides text (sim/replica/api/output.py), from the request and the replica's settings."""
    if isinstance(req, CompletionRequest):
        return output.Shape(chat=False, logprobs=req.logprobs)
    tool = output.chosen_tool(req.tools, req.tool_choice)
    return output.Shape(
        chat=True,
        reasoning=rep.settings.reasoning_tokens,
        tool=tool,
        call_id="call_" + r.new_id("text")[5:21] if tool else "",
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
    )


async def _stream(rep: Replica, handle: Handle, shape: output.Shape, head: r.Head) -> AsyncIterator[bytes]:
    """SSE events: role chunk, content chunks (tokens batched per stream interval; reasoning,
    tool-call arguments and logprobs as sim/replica/api/output.py says), a finish chunk, an optional usage
    chunk, then ``data: [DONE]``. Aborts the request on disconnect.

    Nothing is sent before the first token exists (queueing and prefill done): the chat role
    chunk goes out right before the first content chunk, as vLLM sends it with its first
    engine output, so a client's time to the first chunk is the TTFT the engine observes
    (``vllm:time_to_first_token_seconds``). The response headers go out at once."""
    interval = rep.settings.stream_interval_s
    try:
        await handle.first_token.wait()
        if shape.chat:
            yield r.sse(r.chunk(head, {"role": "assistant", "content": ""}))
        sent = 0
        while sent < handle.max_tokens:
            upto = handle.generated
            if upto > sent:
                fields, logprobs = output.delta(shape, sent, upto, first=sent == 0)
                yield r.sse(r.chunk(head, fields, logprobs))
                sent = upto
            if sent < handle.max_tokens:
                try:
                    await asyncio.wait_for(handle.done.wait(), interval)
                except TimeoutError:
                    pass
        closing = output.closing_delta(shape)
        if closing is not None:
            yield r.sse(r.chunk(head, closing))
        yield r.sse(r.chunk(head, {} if shape.chat else {"text": ""}, finish=output.finish_reason(shape)))
        if head.include_usage:
            yield r.sse(r.usage_chunk(head, handle.prompt_tokens, handle.max_tokens))
        yield r.sse("[DONE]")
    finally:
        rep.engine.abort(handle)
