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
the limit, 404 for an unknown model, 503 when the queue is full.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import logging
import os
import threading
import time
import uuid

import torch
import transformers
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

import kvtier
import kvtier.hf

log = logging.getLogger("kvtier.serve")


class ApiError(Exception):
    def __init__(self, status, message, type_="invalid_request_error", code=None, param=None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def response(self):
        return JSONResponse(status_code=self.status, content={
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}})


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = collections.Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.ttft = collections.deque(maxlen=2048)

    def render(self, cache_connected: bool) -> str:
        with self.lock:
            ttft = sorted(self.ttft)
            lines = ["# HELP kvtier_serve_requests_total Chat completion requests by outcome",
                     "# TYPE kvtier_serve_requests_total counter"]
            for outcome, n in sorted(self.requests.items()):
                lines.append(f'kvtier_serve_requests_total{{outcome="{outcome}"}} {n}')
            lines += ["# HELP kvtier_serve_prompt_tokens_total Prompt tokens served",
                      "# TYPE kvtier_serve_prompt_tokens_total counter",
                      f"kvtier_serve_prompt_tokens_total {self.prompt_tokens}",
                      "# HELP kvtier_serve_cached_tokens_total Prompt tokens that came from kvtier",
                      "# TYPE kvtier_serve_cached_tokens_total counter",
                      f"kvtier_serve_cached_tokens_total {self.cached_tokens}",
                      "# HELP kvtier_serve_completion_tokens_total Tokens generated",
                      "# TYPE kvtier_serve_completion_tokens_total counter",
                      f"kvtier_serve_completion_tokens_total {self.completion_tokens}",
                      "# HELP kvtier_serve_ttft_seconds Time to first token (the last 2048 requests)",
                      "# TYPE kvtier_serve_ttft_seconds summary"]
            for q in (0.5, 0.9, 0.99):
                v = ttft[min(len(ttft) - 1, int(q * len(ttft)))] if ttft else float("nan")
                lines.append(f'kvtier_serve_ttft_seconds{{quantile="{q}"}} {v}')
            lines += [f"kvtier_serve_ttft_seconds_sum {sum(ttft)}", f"kvtier_serve_ttft_seconds_count {len(ttft)}",
                      "# HELP kvtier_serve_cache_connected 1 while kvtierd is reachable",
                      "# TYPE kvtier_serve_cache_connected gauge",
                      f"kvtier_serve_cache_connected {int(cache_connected)}"]
        return "\n".join(lines) + "\n"


class Service:
    def __init__(self, a):
        self.args = a
        torch.set_num_threads(a.threads)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(a.model, local_files_only=True)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(a.model, local_files_only=True).eval()
        self.name = a.served_model_name or os.path.basename(os.path.normpath(a.model))
        self.max_context = a.max_context or getattr(self.model.config, "max_position_embeddings", 4096)
        self.identity = kvtier.hf.model_identity(self.model, self.tokenizer)
        self.metrics = Metrics()
        self.model_lock = threading.Lock()  # One forward at a time: the model is not shared across threads.
        self.inflight = 0
        self.inflight_lock = threading.Lock()
        self.cache = None
        self.next_connect = 0.0
        self._checked_at = -10.0  # When cache_connected last asked kvtierd, and what it found.
        self._connected = False
        self._check_every = 0.0  # Seconds between its asks: 0 while kvtierd answers, 1 doubling to 30 while not.
        # --cache local: each conversation's DynamicCache kept in this process
        # (the design kvtier replaces; for comparison), the coldest dropped first.
        self.local = collections.OrderedDict()
        self.created = int(time.time())

    # --- kvtierd ---------------------------------------------------------------------
    def prefix_cache(self):
        """The PrefixCache, connecting (again) at most every 2 s while kvtierd is away."""
        if self.args.cache != "kvtier":
            return None
        if self.cache is None and time.monotonic() >= self.next_connect:
            self.next_connect = time.monotonic() + 2.0
            try:
                client = kvtier.Client(socket=self.args.socket, tenant=self.args.tenant, profile=self.args.profile,
                                       model_id=self.identity, client_name=f"kvtier.serve:{self.name}",
                                       connect_timeout=0.5)
                self.cache = kvtier.hf.PrefixCache(client, self.model)
                log.info("kvtier: connected to %s (model identity %s)", self.args.socket, self.identity)
            except kvtier.UnavailableError as e:
                log.warning("kvtier: %s; serving without the cache until it is back", e)
        return self.cache

    def cache_connected(self) -> bool:
        """Whether kvtierd answers now: a ping (a round trip, ~0.1 ms) each time
        while it does; while it does not, the next ping waits 1, 2, 4 ... 30 s,
        the answer remembered in between, so a request pays at most one failed
        connection attempt per interval. A client object alone says nothing: it
        outlives the kvtierd it was connected to."""
        cache = self.cache
        if cache is None:
            return False
        now = time.monotonic()
        if now - self._checked_at >= self._check_every:
            try:
                cache.client.ping()
                self._connected, self._check_every = True, 0.0
            except kvtier.Error:
                self._connected = False
                self._check_every = min(30.0, max(1.0, self._check_every * 2))
            self._checked_at = now
        return self._connected

    # --- requests --------------------------------------------------------------------
    def prompt_ids(self, messages):
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def session_of(self, messages) -> str:
        """A conversation is named by the model's identity and its messages up to
        its first user message. kvtierd's sessions are the tenant's, not the
        model's: without the identity, services of two models (or one model under
        two tokenizers) holding the same conversation would replace each other's
        blocks under one name."""
        first = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages) - 1)
        named = json.dumps([self.identity, messages[: first + 1]], sort_keys=True).encode()
        return "chat-" + hashlib.sha256(named).hexdigest()[:24]

    def fit_context(self, messages, max_tokens):
        ids = self.prompt_ids(messages)
        if len(ids) + max_tokens <= self.max_context:
            return messages, ids
        if self.args.context_policy == "truncate":
            # Keep system messages and the most recent turns.
            kept = list(messages)
            while len(ids) + max_tokens > self.max_context:
                drop = next((i for i, m in enumerate(kept) if m["role"] != "system"), None)
                if drop is None or sum(1 for m in kept if m["role"] != "system") <= 1:
                    break
                del kept[drop]
                ids = self.prompt_ids(kept)
            if len(ids) + max_tokens <= self.max_context:
                return kept, ids
        raise ApiError(400, f"This model's maximum context length is {self.max_context} tokens; the messages "
                            f"take {len(ids)} and max_tokens asks {max_tokens} more.",
                       code="context_length_exceeded", param="messages")

    def local_load(self, session, ids):
        """--cache local: the conversation's own DynamicCache, cut to the prefix it shares with ids."""
        entry = self.local.get(session)
        if entry is None:
            return None, 0
        seen, past = entry
        n = 0
        limit = min(len(seen), len(ids) - 1, past.get_seq_length())
        while n < limit and seen[n] == ids[n]:
            n += 1
        if n == 0:
            return None, 0
        past.crop(n)
        return past, n

    def generate(self, session, ids, max_tokens, temperature, seed, emit):
        """Runs one completion (on a worker thread); emit(token_text) per token.
        Returns (completion token ids, cached tokens, ttft seconds)."""
        start = time.perf_counter()
        input_ids = torch.tensor([ids])
        eos = self.tokenizer.eos_token_id
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with self.model_lock, torch.no_grad():
            cache = self.prefix_cache()
            if cache is not None and not self.cache_connected():
                # kvtierd is away: no load or store tries it (each waited to connect: ~0.9 s a
                # request) until a ping finds it back.
                cache = None
            if self.args.cache == "local":
                past, cached = self.local_load(session, ids)
            else:
                past, cached = (cache.load(session, input_ids, max_tokens) if cache else (None, 0))
            out = self.model(input_ids[:, cached:], past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens, ttft, text = [], None, ""
            logits = out.logits[0, -1]
            for _ in range(max_tokens):
                if temperature and temperature > 0:
                    probs = torch.softmax(logits.float() / temperature, dim=-1)
                    nxt = int(torch.multinomial(probs, 1, generator=gen))
                else:
                    nxt = int(logits.argmax())
                if ttft is None:
                    ttft = time.perf_counter() - start
                if nxt == eos:
                    break
                tokens.append(nxt)
                # Detokenized as a whole (a token's text can depend on its neighbours), sent as deltas.
                now = self.tokenizer.decode(tokens, skip_special_tokens=True)
                if now.startswith(text) and len(now) > len(text):
                    emit(now[len(text):])
                    text = now
                out = self.model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1]
            if cache is not None:
                # The prompt and the reply are cached for the conversation's next turn.
                cache.store(session, ids + tokens, past)
            elif self.args.cache == "local":
                self.local[session] = (ids + tokens, past)
                self.local.move_to_end(session)
                while len(self.local) > self.args.local_sessions:
                    self.local.popitem(last=False)
        return tokens, cached, ttft if ttft is not None else time.perf_counter() - start


def parse_request(body: bytes, service: Service):
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"The request body is not valid JSON: {e}") from None
    if not isinstance(req, dict):
        raise ApiError(400, "The request body must be a JSON object")
    model = req.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "'model' is required (a string)", param="model")
    if model != service.name:
        raise ApiError(404, f"The model '{model}' does not exist; this service serves '{service.name}'",
                       code="model_not_found", param="model")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise ApiError(400, f"messages[{i}] needs a role of system, user or assistant", param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # Content parts: each an object with a type; the text ones are read.
            texts = []
            for j, p in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if not isinstance(p, dict) or not isinstance(p.get("type"), str):
                    raise ApiError(400, f"{where} must be an object with a 'type'", param=where)
                if p["type"] == "text":
                    if not isinstance(p.get("text"), str):
                        raise ApiError(400, f"{where}.text must be a string", param=f"{where}.text")
                    texts.append(p["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    max_tokens = req.get("max_completion_tokens", req.get("max_tokens", 64))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 4096:
        raise ApiError(400, "'max_tokens' must be an integer in [1, 4096]", param="max_tokens")
    temperature = req.get("temperature", 0)
    if temperature is None:
        temperature = 0
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise ApiError(400, "'temperature' must be a number in [0, 2]", param="temperature")
    seed = req.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not -2**63 <= seed < 2**64):
        raise ApiError(400, "'seed' must be an integer of at most 64 bits", param="seed")
    return clean, max_tokens, float(temperature), seed, bool(req.get("stream", False))


def build_app(service: Service) -> FastAPI:
    app = FastAPI(title="kvtier.serve")

    @app.exception_handler(ApiError)
    async def api_error(_request, e: ApiError):
        service.metrics.requests["error_" + str(e.status)] += 1
        return e.response()

    @app.get("/health")
    async def health():
        connected = await asyncio.to_thread(service.cache_connected)
        return {"status": "ok", "model": service.name, "kvtier": connected, "cache": service.args.cache}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.name, "object": "model", "created": service.created,
                                            "owned_by": "kvtier"}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(service.metrics.render(await asyncio.to_thread(service.cache_connected)))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        messages, max_tokens, temperature, seed, stream = parse_request(await request.body(), service)
        messages, ids = service.fit_context(messages, max_tokens)
        with service.inflight_lock:
            if service.inflight >= service.args.queue_limit:
                raise ApiError(503, f"The model is busy: {service.inflight} requests in progress or waiting "
                                    f"(--queue-limit {service.args.queue_limit}); retry shortly",
                               type_="server_error", code="overloaded")
            service.inflight += 1
        session = service.session_of(messages)
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def emit(text):
            loop.call_soon_threadsafe(queue.put_nowait, ("token", text))

        def run():
            try:
                result = service.generate(session, ids, max_tokens, temperature, seed, emit)
                loop.call_soon_threadsafe(queue.put_nowait, ("done", result))
            except Exception as e:  # noqa: BLE001 - reported to the client as a 500
                log.exception("generation failed")
                loop.call_soon_threadsafe(queue.put_nowait, ("error", e))
            finally:
                with service.inflight_lock:
                    service.inflight -= 1

        threading.Thread(target=run, daemon=True).start()

        def usage(tokens, cached):
            return {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                    "total_tokens": len(ids) + len(tokens), "prompt_tokens_details": {"cached_tokens": cached}}

        def account(tokens, cached, ttft):
            with service.metrics.lock:
                service.metrics.requests["ok"] += 1
                service.metrics.prompt_tokens += len(ids)
                service.metrics.cached_tokens += cached
                service.metrics.completion_tokens += len(tokens)
                service.metrics.ttft.append(ttft)

        if not stream:
            parts = []
            while True:
                kind, value = await queue.get()
                if kind == "token":
                    parts.append(value)
                elif kind == "error":
                    raise ApiError(500, f"generation failed: {value}", type_="server_error")
                else:
                    tokens, cached, ttft = value
                    break
            account(tokens, cached, ttft)
            finish = "length" if len(tokens) >= max_tokens else "stop"
            return {"id": cid, "object": "chat.completion", "created": created, "model": service.name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                                 "finish_reason": finish}],
                    "usage": usage(tokens, cached)}

        async def events():
            def chunk(delta, finish=None, extra=None):
                body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": service.name,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                if extra:
                    body.update(extra)
                return f"data: {json.dumps(body)}\n\n"

            yield chunk({"role": "assistant", "content": ""})
            while True:
                kind, value = await queue.get()
                if kind == "token":
                    yield chunk({"content": value})
                elif kind == "error":
                    yield f"data: {json.dumps({'error': {'message': str(value), 'type': 'server_error'}})}\n\n"
                    break
                else:
                    tokens, cached, ttft = value
                    account(tokens, cached, ttft)
                    finish = "length" if len(tokens) >= max_tokens else "stop"
                    yield chunk({}, finish, {"usage": usage(tokens, cached)})
                    break
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def keep_freed_memory():
    """As kvtier-worker does: by default glibc hands large freed blocks back to
    the kernel, and every prefill then takes thousands of page faults to get
    them back. Blocks past 32 MiB (glibc's ceiling) still come from mmap."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # malloc.h
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 1 << 30)
        libc.mallopt(m_top_pad, 64 << 20)
    except (OSError, AttributeError):  # Not glibc: nothing to tune.
        pass


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kvtier.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model directory (loaded offline)")
    p.add_argument("--served-model-name", default="", help="the model's name in the API (default: the directory's)")
    p.add_argument("--socket", default="/run/kvtier/kvtierd.sock", help="kvtierd's socket")
    p.add_argument("--tenant", default="")
    p.add_argument("--profile", default="", help="kvtierd's profile (default: its first)")
    p.add_argument("--cache", choices=("kvtier", "local", "none"), default="kvtier",
                   help="where a conversation's K/V is kept between turns: kvtierd (shared by every process), "
                        "this process alone (for comparison), or nowhere (recompute every turn)")
    p.add_argument("--no-kvtier", dest="cache", action="store_const", const="none", help="--cache none")
    p.add_argument("--local-sessions", type=int, default=64, help="--cache local: conversations kept")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-context", type=int, default=0, help="tokens (default: the model's maximum)")
    p.add_argument("--context-policy", choices=("refuse", "truncate"), default="refuse",
                   help="an overlong conversation: refused (400), or cut to the system prompt and the latest turns")
    p.add_argument("--queue-limit", type=int, default=16, help="requests in progress or waiting before 503")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--log-level", default="info")
    p.add_argument("--no-keep-memory", dest="keep_memory", action="store_false",
                   help="let glibc return freed memory to the kernel between requests (the default keeps it)")
    a = p.parse_args(argv)
    if a.keep_memory:
        keep_freed_memory()
    logging.basicConfig(level=a.log_level.upper(), format="kvtier.serve: %(levelname)s: %(message)s")
    service = Service(a)
    service.prefix_cache()
    log.info("serving %s on http://%s:%d (model identity %s, max context %d)", service.name, a.host, a.port,
             service.identity, service.max_context)
    uvicorn.run(build_app(service), host=a.host, port=a.port, log_level=a.log_level)


if __name__ == "__main__":
    main()
