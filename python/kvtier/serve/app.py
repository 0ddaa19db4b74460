"""The HTTP app (FastAPI): its routes, OpenAI-shaped bodies for every error,
the request body limit, and the bridge from the worker thread that generates to
the event loop that answers (an asyncio queue, so a streamed reply flows as it
is generated). The event loop only moves bytes: parsing, tokenizing and
generating run on threads, so /health answers while a large request is worked on."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvtier.serve.api import (
    ApiError,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    ErrorResponse,
    FinishReason,
    Health,
    ModelCard,
    ModelList,
    Usage,
    parse_request,
)
from kvtier.serve.engine import Generation
from kvtier.serve.service import Service

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20  # A request body past this is refused (413) unread: --max-body-bytes.


def _too_large(limit: int, size: int | None = None) -> ApiError:
    told = f"is {size} bytes" if size is not None else "goes past that"
    return ApiError(413, f"This service takes request bodies of at most {limit} bytes; this one {told}.",
                    code="request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (ApiError 413) as soon as it is known to pass
    `limit` bytes: by its Content-Length before a byte is read, or while a
    chunked one is read, so that no oversized body is held whole."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "The Content-Length header is not a number") from None
        if size > limit:
            raise _too_large(limit, size)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class Turn:
    """A validated request, fitted to the context and tokenized: ready to generate."""

    request: ChatCompletionRequest
    ids: list[int]
    session: str
    max_tokens: int


def prepare(service: Service, request: ChatCompletionRequest) -> Turn:
    """Applies the chat template and tokenizes (seconds for a few MB): call it off the event loop."""
    max_tokens = request.reply_limit()
    messages, ids = service.prompt.fit(request.template_messages(), max_tokens)
    return Turn(request, ids, service.prompt.session_of(messages), max_tokens)


Event = str | Generation | BaseException  # A piece of the reply's text; the end; a failure.


def start_generation(service: Service, turn: Turn) -> asyncio.Queue[Event]:
    """Generates `turn` on a thread of its own, which leaves the admission when
    done; the reply comes as events on the returned queue, read on this loop."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(event: Event) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    def run() -> None:
        try:
            put(service.generator.generate(turn.session, turn.ids, turn.max_tokens, turn.request.temperature or 0.0,
                                           turn.request.seed, put))
        except Exception as e:  # Any failure: reported to the client.
            log.exception("generation failed")
            put(e)
        finally:
            service.admission.leave()

    threading.Thread(target=run, name="kvtier-serve-generate", daemon=True).start()
    return queue


def _error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


def build_app(service: Service, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="kvtier.serve")

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, e: ApiError) -> Response:
        service.metrics.failed(e.status)
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> Response:
        # An unknown route or method: OpenAI's shape too, never FastAPI's {"detail": ...}.
        response = ApiError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None).response()
        response.headers.update(e.headers or {})
        return response

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        connected = await asyncio.to_thread(service.cache_connected)
        return Health(model=service.name, kvtier=connected, cache=service.args.cache)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=service.name, created=service.created)])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await asyncio.to_thread(service.metrics.render), media_type=service.metrics.content_type)

    @app.post("/v1/chat/completions", response_model=None,
              responses={200: {"model": ChatCompletion}, **_error_responses(400, 404, 413, 500, 503)})
    async def chat(http: Request) -> Response:
        body = await read_body(http, max_body_bytes)
        request = await run_in_threadpool(parse_request, body, service.name)
        if not service.admission.enter():
            raise ApiError(503, f"The model is busy: {service.admission.count} requests in progress or waiting "
                                f"(--queue-limit {service.admission.limit}); retry shortly",
                           type_="server_error", code="overloaded")
        try:
            turn = await run_in_threadpool(prepare, service, request)
        except BaseException:
            service.admission.leave()
            raise
        queue = start_generation(service, turn)  # It leaves the admission from here on.
        cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

        def done(result: Generation) -> tuple[Usage, FinishReason]:
            service.metrics.completed(len(turn.ids), result.cached, len(result.tokens), result.ttft)
            finish: FinishReason = "length" if len(result.tokens) >= turn.max_tokens else "stop"
            return Usage.of(len(turn.ids), len(result.tokens), result.cached), finish

        if not turn.request.stream:
            parts = []
            while not isinstance(event := await queue.get(), Generation):
                if isinstance(event, BaseException):
                    raise ApiError(500, f"generation failed: {event}", type_="server_error")
                parts.append(event)
            usage, finish = done(event)
            reply = ChatCompletion(id=cid, created=created, model=service.name, usage=usage, choices=[
                Choice(message=AssistantMessage(content="".join(parts)), finish_reason=finish)])
            return JSONResponse(reply.model_dump())

        def chunk(delta: Delta, finish: FinishReason | None = None, usage: Usage | None = None) -> str:
            return ChatCompletionChunk(id=cid, created=created, model=service.name, usage=usage, choices=[
                ChunkChoice(delta=delta, finish_reason=finish)]).event()

        async def events() -> AsyncIterator[str]:
            yield chunk(Delta(role="assistant", content=""))
            while True:
                event = await queue.get()
                if isinstance(event, str):
                    yield chunk(Delta(content=event))
                elif isinstance(event, BaseException):
                    failed = ErrorResponse.model_validate({"error": {"message": str(event), "type": "server_error"}})
                    yield f"data: {failed.model_dump_json()}\n\n"
                    break
                else:
                    usage, finish = done(event)
                    yield chunk(Delta(), finish, usage)
                    break
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
