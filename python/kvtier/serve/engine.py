"""Generation: one completion at a time on the model (a lock: the model is not
shared across threads), its prompt's prefix loaded from the cache and the whole
conversation stored back for the next turn. Called on worker threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from kvtier.serve.cache import KvtierLink, LocalCache


class Generation(NamedTuple):
    tokens: list[int]  # The reply's token ids (no end of sequence).
    cached: int  # Prompt tokens whose K/V came from the cache.
    ttft: float  # Seconds from the call to the first token chosen.


class Generator:
    def __init__(self, model: Any, tokenizer: Any, link: KvtierLink | None = None,
                 local: LocalCache | None = None) -> None:
        self.model, self.tokenizer, self.link, self.local = model, tokenizer, link, local
        self.lock = threading.Lock()

    def generate(self, session: str, ids: list[int], max_tokens: int, temperature: float = 0.0,
                 seed: int | None = None, emit: Callable[[str], None] = lambda _text: None) -> Generation:
        """Runs one completion, calling emit(text) for each piece of the reply as
        it grows. Blocks (waits for the model, then computes): a worker thread's job."""
        start = time.perf_counter()
        input_ids = torch.tensor([ids])
        eos = self.tokenizer.eos_token_id
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with self.lock, torch.no_grad():
            cache = self.link.usable() if self.link is not None else None
            if self.local is not None:
                past, cached = self.local.load(session, ids)
            else:
                past, cached = cache.load(session, input_ids, max_tokens) if cache is not None else (None, 0)
            out = self.model(input_ids[:, cached:], past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens: list[int] = []
            ttft: float | None = None
            text = ""
            logits = out.logits[0, -1]
            for _ in range(max_tokens):
                if temperature > 0:
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
            # The prompt and the reply are cached for the conversation's next turn.
            if cache is not None:
                cache.store(session, ids + tokens, past)
            elif self.local is not None:
                self.local.store(session, ids + tokens, past)
        return Generation(tokens, cached, ttft if ttft is not None else time.perf_counter() - start)
