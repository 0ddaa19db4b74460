"""A conversation as the model sees it: the chat template and tokenizing, the
kvtier session that names it, and fitting it to the context. Tokenizing a few
MB of text takes seconds (transformers releases the GIL meanwhile): the HTTP
layer calls these off the event loop. Thread-safe (the tokenizer is only read)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from kvtier.serve.api import ApiError, TemplateMessage

ContextPolicy = Literal["refuse", "truncate"]


class ChatPrompt:
    def __init__(self, tokenizer: Any, identity: str, max_context: int, policy: ContextPolicy = "refuse") -> None:
        self.tokenizer = tokenizer
        self.identity = identity
        self.max_context = max_context
        self.policy = policy

    def ids(self, messages: Sequence[TemplateMessage]) -> list[int]:
        """The prompt's token ids: the chat template with the assistant's turn opened."""
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def session_of(self, messages: Sequence[TemplateMessage]) -> str:
        """A conversation is named by the model's identity and its messages up to
        its first user message. kvtierd's sessions are the tenant's, not the
        model's: without the identity, services of two models (or one model under
        two tokenizers) holding the same conversation would replace each other's
        blocks under one name."""
        first = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages) - 1)
        named = json.dumps([self.identity, list(messages[: first + 1])], sort_keys=True).encode()
        return "chat-" + hashlib.sha256(named).hexdigest()[:24]

    def fit(self, messages: Sequence[TemplateMessage], max_tokens: int) -> tuple[list[TemplateMessage], list[int]]:
        """The messages that fit the context with `max_tokens` more, and their ids:
        all of them, or (policy truncate) the system messages and the latest
        turns; ApiError 400 (context_length_exceeded) when they do not fit."""
        kept = list(messages)
        ids = self.ids(kept)
        if len(ids) + max_tokens > self.max_context and self.policy == "truncate":
            while len(ids) + max_tokens > self.max_context:
                drop = next((i for i, m in enumerate(kept) if m["role"] != "system"), None)
                if drop is None or sum(1 for m in kept if m["role"] != "system") <= 1:
                    break
                del kept[drop]
                ids = self.ids(kept)
        if len(ids) + max_tokens <= self.max_context:
            return kept, ids
        raise ApiError(400, f"This model's maximum context length is {self.max_context} tokens; the messages "
                            f"take {len(ids)} and max_tokens asks {max_tokens} more.",
                       code="context_length_exceeded", param="messages")
