"""The HTTP API's shapes, OpenAI's: what a chat-completions request may hold
(one place, Pydantic; every violation a 400 in OpenAI's error shape, naming the
offending field in `param`), the replies and stream chunks, and the error body.

Requests are strict JSON: no "5" for 5, no true for 1. Fields of OpenAI's API
that this service does not use (n, top_p, stream_options, ...) are accepted and
ignored, as clients send them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypedDict

from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

MAX_TOKENS_LIMIT = 4096  # The most tokens one reply may ask for.
DEFAULT_MAX_TOKENS = 64
FinishReason = Literal["stop", "length"]


class ApiError(Exception):
    """An error answered as OpenAI answers them: HTTP `status` and
    {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.type, param=self.param,
                                               code=self.code))

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content=self.body().model_dump())


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# --- requests --------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ContentPart(_Strict):
    """One part of a message's content: the text parts are read; the others
    (images, audio) are accepted and skipped, as a text model can do no more."""

    type: str
    text: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _an_object_with_a_type(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise PydanticCustomError("content_part", "must be an object with a 'type'")
        if data["type"] == "text" and data.get("text") is None:
            raise PydanticCustomError("content_part", "a part of type text needs a 'text'")
        return data


def _content_kind(value: Any) -> str:
    return "parts" if isinstance(value, list) else "string"


# A message's content: a string, or a list of parts. The discriminator picks the branch by the
# value's type, so a violation is reported for that branch alone; its tag is no field (see _param).
Content = Annotated[Annotated[str, Tag("string")] | Annotated[list[ContentPart], Tag("parts")],
                    Discriminator(_content_kind)]
_BRANCH_TAGS = frozenset({"string", "parts"})


class TemplateMessage(TypedDict):
    """A message as the chat template takes it."""

    role: str
    content: str


class Message(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: Content

    def for_template(self) -> TemplateMessage:
        """The role a chat template knows (developer is OpenAI's newer name for system), and the text."""
        text = self.content if isinstance(self.content, str) else \
            "".join(p.text or "" for p in self.content if p.type == "text")
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]


class ChatCompletionRequest(_Strict):
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None  # OpenAI's newer name; it wins over max_tokens.
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None  # 0 (the default): greedy.
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None  # Fixes the sampling when temperature > 0.
    stream: bool | None = None

    def reply_limit(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS

    def template_messages(self) -> list[TemplateMessage]:
        return [m.for_template() for m in self.messages]


def _param(loc: Sequence[int | str]) -> str | None:
    """A Pydantic location as OpenAI writes a param: messages[0].content[1].text."""
    out = ""
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif item not in _BRANCH_TAGS:
            out += f".{item}" if out else item
    return out or None


def _api_error(error: ErrorDetails) -> ApiError:
    param = _param(error["loc"])
    if error["type"] == "json_invalid":
        return ApiError(400, f"The request body is not valid JSON: {error.get('ctx', {}).get('error', '')}")
    if param is None:
        return ApiError(400, "The request body must be a JSON object")
    if error["type"] == "missing":
        return ApiError(400, f"'{param}' is required", param=param)
    return ApiError(400, f"{param}: {error['msg']}", param=param)


def parse_request(body: bytes, model_name: str) -> ChatCompletionRequest:
    """The request in `body` (JSON), validated: ApiError 400 naming the first
    violation, 404 for a model other than `model_name`. Blocks (a few MB of JSON
    take tens of ms): call it off the event loop."""
    try:
        request = ChatCompletionRequest.model_validate_json(body)
    except ValidationError as e:
        raise _api_error(e.errors(include_url=False, include_input=False)[0]) from None
    if request.model != model_name:
        raise ApiError(404, f"The model '{request.model}' does not exist; this service serves '{model_name}'",
                       code="model_not_found", param="model")
    return request


# --- replies ---------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # Prompt tokens whose K/V came from the cache, not computed.


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


def _absent_if_none(value: object) -> bool:
    return value is None


class Delta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=_absent_if_none)
    content: str | None = Field(default=None, exclude_if=_absent_if_none)


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = Field(default=None, exclude_if=_absent_if_none)  # The last chunk's alone.

    def event(self) -> str:
        """The chunk as one server-sent event."""
        return f"data: {self.model_dump_json()}\n\n"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvtier"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    kvtier: bool  # Whether kvtierd answers now.
    cache: str  # --cache: kvtier, local or none.
