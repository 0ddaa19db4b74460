"""The service's parts, made from its command line: the model and tokenizer
(loaded offline), the prompt, where K/V waits between turns, the generator, the
metrics, and admission (--queue-limit)."""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import transformers

import kvtier.hf
from kvtier.serve.cache import KvtierLink, LocalCache
from kvtier.serve.engine import Generator
from kvtier.serve.metrics import Metrics
from kvtier.serve.prompt import ChatPrompt


class Admission:
    """Requests in progress or waiting, at most `limit` (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._lock = threading.Lock()

    def enter(self) -> bool:
        """Whether a request may go on; if so, it calls leave() once when done."""
        with self._lock:
            if self.count >= self.limit:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


class Service:
    def __init__(self, a: argparse.Namespace) -> None:
        self.args = a
        torch.set_num_threads(a.threads)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(a.model, local_files_only=True)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(a.model, local_files_only=True).eval()
        self.name: str = a.served_model_name or os.path.basename(os.path.normpath(a.model))
        self.max_context: int = a.max_context or getattr(self.model.config, "max_position_embeddings", 4096)
        self.identity: str = kvtier.hf.model_identity(self.model, self.tokenizer)
        self.created = int(time.time())
        self.prompt = ChatPrompt(self.tokenizer, self.identity, self.max_context, a.context_policy)
        self.link = KvtierLink(self.model, self.identity, self.name, a.socket, a.tenant, a.profile) \
            if a.cache == "kvtier" else None
        local = LocalCache(a.local_sessions) if a.cache == "local" else None
        self.generator = Generator(self.model, self.tokenizer, self.link, local)
        self.admission = Admission(a.queue_limit)
        self.metrics = Metrics(self.cache_connected, lambda: self.admission.count)

    def cache_connected(self) -> bool:
        """Whether kvtierd answers (False under --cache local or none): the link's state, never a wait."""
        return self.link is not None and self.link.connected()
