"""python -m kvtier.serve --model DIR: an OpenAI-compatible chat service over kvtier.

A Hugging Face model directory (config.json, safetensors weights, tokenizer
files with a chat template), loaded offline, behind FastAPI + uvicorn:

  POST /v1/chat/completions   (stream: server-sent events, or one JSON reply)
  GET  /v1/models, /health, /metrics (Prometheus text)

No session id is needed: a client that resends its conversation finds its own
prefix by tokens (the conversation's session is named by its first messages), so
several service processes on one host share one kvtierd and each other's
conversations; usage.prompt_tokens_details.cached_tokens says how many prompt
tokens came from the cache. kvtierd going away (or not there at start) means
recomputing, never a failed request; the service reconnects when it is back.
Errors are OpenAI-style bodies: 400 for a malformed request or a context beyond
the limit, 404 for an unknown model, 413 for a body past --max-body-bytes, 503
when the queue is full.

Its parts, one module each:
  api       the request, reply and error shapes (Pydantic), parse_request
  prompt    the chat template, tokenizing, session names, fitting the context
  cache     where K/V waits between turns: kvtierd (KvtierLink) or this process
  engine    generation on the model, the prefix loaded and stored back
  metrics   the Prometheus metrics, a registry per service
  service   the parts made from the command line; admission (--queue-limit)
  app       the HTTP app: routes, errors, the body limit, the thread bridge
  cli       main: the command line and uvicorn
"""

from kvtier.serve.api import (
    ApiError,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ContentPart,
    ErrorResponse,
    Message,
    Usage,
    parse_request,
)
from kvtier.serve.app import DEFAULT_MAX_BODY_BYTES, build_app, read_body
from kvtier.serve.cache import KvtierLink, LocalCache
from kvtier.serve.cli import keep_freed_memory, main
from kvtier.serve.engine import Generation, Generator
from kvtier.serve.metrics import Metrics
from kvtier.serve.prompt import ChatPrompt
from kvtier.serve.service import Admission, Service

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Admission",
    "ApiError",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatPrompt",
    "ContentPart",
    "ErrorResponse",
    "Generation",
    "Generator",
    "KvtierLink",
    "LocalCache",
    "Message",
    "Metrics",
    "Service",
    "Usage",
    "build_app",
    "keep_freed_memory",
    "main",
    "parse_request",
    "read_body",
]
