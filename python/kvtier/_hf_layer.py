"""The cache layers kvtier.hf hands out and reads: a DynamicLayer that takes
new tokens in place, and how many tokens a cache holds from its first on."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


def layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `layer`'s K and V, [batch, kv_heads, seq, head_dim]."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56: one object per layer
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def held_tokens(cache: Any) -> int:
    """How many tokens, from the first on, every layer of `cache` holds the K/V
    of. A sliding-window layer past its window dropped its first tokens: 0."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return int(cache.key_cache[0].size(-2))
    held = None
    for layer in layers:
        if layer.keys is None:
            return 0
        n = int(layer.keys.size(-2))
        if getattr(layer, "cumulative_length", n) != n:
            return 0
        held = n if held is None else min(held, n)
    return held or 0


class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose K/V lie at the start of buffers with room after
    them: update writes the new tokens' K/V in place and returns views (a
    DynamicLayer concatenates, copying the whole history each time). Out of
    room, or once the caller replaced its tensors (a batch reorder), it grows
    as a DynamicLayer does. It keeps every token's K/V, on a sliding-window
    layer too (the attention mask applies the window), so store finds them all."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int):
        super().__init__()
        self._kbuf: torch.Tensor | None = kbuf  # [1, kv_heads, capacity, head_dim]
        self._vbuf: torch.Tensor | None = vbuf
        self.dtype, self.device = kbuf.dtype, kbuf.device
        self.keys, self.values = kbuf[:, :, :length], vbuf[:, :, :length]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys, self.values
        kbuf, vbuf = self._kbuf, self._vbuf
        assert keys is not None and values is not None
        n, m = keys.shape[-2], key_states.shape[-2]
        if (kbuf is None or vbuf is None or n + m > kbuf.shape[-2] or key_states.shape[0] != 1
                or keys.data_ptr() != kbuf.data_ptr() or values.data_ptr() != vbuf.data_ptr()):
            self._kbuf = self._vbuf = None
            return super().update(key_states, value_states, *args, **kwargs)
        kbuf[:, :, n:n + m].copy_(key_states)
        vbuf[:, :, n:n + m].copy_(value_states)
        self.keys, self.values = kbuf[:, :, :n + m], vbuf[:, :, :n + m]
        return self.keys, self.values
