"""kvtier.hf: a prefix cache for Hugging Face transformers causal LMs.

    cache = kvtier.hf.PrefixCache(client, model)
    past, cached = cache.load("chat-1", input_ids)        # a DynamicCache of the longest cached prefix
    out = model(input_ids[:, cached:], past_key_values=past, use_cache=True)
    cache.store("chat-1", input_ids, out.past_key_values)  # commits the new full blocks

It works with a plain forward loop and with model.generate(..., past_key_values=past).
kvtierd going away (stopped, restarting, hung past the client's
request_timeout) never fails a turn: load then returns an empty cache (the turn
recomputes) and store commits nothing, each with a warning; the next call after
kvtierd is back reconnects. A service keeps its client with kvtier.link.Link
(a thread that pings and reconnects) and passes on_unavailable=link.failed, so
that no turn tries kvtierd while it is away (kvtier.serve does).
The model's KV geometry must be the daemon profile's (checked at construction,
with an error naming both), and the client must carry the model's identity
(model_identity(model, tokenizer) computes it, as every kvtier worker does).
Any causal LM whose cache is a DynamicCache of full-attention or
sliding-window layers is served (Llama, Qwen2, Mistral, GPT-2, ...); others
(recurrent or convolution layers, multi-head latent attention) are refused at
construction with an error naming what is not supported.

The pieces live beside it: _hf_model (the supported caches, the KV geometry),
_hf_identity (the model identity), _tensors (pool blocks as tensors) and
_hf_layer (the in-place cache layer); this module re-exports their public names.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from . import FailedPreconditionError, InvalidArgumentError, NotFoundError, ResourceExhaustedError, UnavailableError
from . import TimeoutError as KvtierTimeoutError
from ._hf_identity import config_settings, model_identity, tokenizer_description
from ._hf_layer import RoomyLayer, held_tokens, layer_kv
from ._hf_model import check_supported, geometry
from ._tensors import block_tensor, to_numpy, view

__all__ = ["PrefixCache", "block_tensor", "config_settings", "model_identity", "tokenizer_description"]

_log = logging.getLogger("kvtier.hf")
# The names this module had before the split (tests and older callers use them).
_layer_kv = layer_kv
_geometry = geometry


def _tokens(input_ids: Any) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.size(0) != 1:
                raise InvalidArgumentError("kvtier.hf caches one sequence at a time (batch size 1)")
            input_ids = input_ids[0]
        return [int(t) for t in input_ids.tolist()]
    return [int(t) for t in input_ids]


class PrefixCache:
    """A prefix cache of one model over a kvtier client (see the module's text)."""

    def __init__(self, client: Any, model: Any, tail_sessions: int = 64,
                 on_unavailable: Callable[[BaseException], None] | None = None) -> None:
        """tail_sessions: for how many sessions (the most recently stored) this
        object keeps the K/V of the tokens past the last full block, which
        kvtierd does not hold: a follow-up turn served by this process then
        computes only its new tokens, as an in-process cache would, instead of
        up to block_tokens - 1 more. 0 keeps none. on_unavailable(error): called
        when a load or store found kvtierd gone or not answering in time (a
        kvtier.link.Link's failed, so that no later turn tries it until it is back)."""
        self.client = client
        self.model = model
        self.on_unavailable = on_unavailable
        check_supported(model)
        profile = client.profile
        want = geometry(model)
        have = {k: profile[k] for k in ("layers", "kv_heads", "head_dim", "dtype")}
        if want != have:
            raise FailedPreconditionError(
                f"model {model.config.model_type} has KV geometry {want}, but kvtierd's profile "
                f"'{profile['name']}' is {have}: connect to a profile that fits the model")
        self.block_tokens = client.block_tokens
        self.dtype = model.dtype
        self.profile = profile
        self.device = next(model.parameters()).device
        # On the cuda backend the GPU tier is device memory this process maps:
        # blocks are read and written there, ordered on the current stream.
        self.gpu = client.backend == "cuda"
        self.tail_sessions = tail_sessions
        # session -> (the tokens up to the tail's end, [(K, V) of the tail per layer]).
        self._tails: collections.OrderedDict[str, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = (
            collections.OrderedDict())

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def _block(self, lease, i: int, writable: bool) -> torch.Tensor:
        # The profile and backend are this object's: no round of native calls per block.
        device = self.device if self.device.type == "cuda" else None
        return view(lease, i, writable, self.profile, self.gpu, device)

    def load(self, session: str, input_ids: Any, max_new_tokens: int = 256) -> tuple[DynamicCache, int]:
        """A DynamicCache holding the longest cached prefix of input_ids (whole
        blocks, leaving at least one token to compute), and its length in tokens.
        The session then holds that prefix. With kvtierd away: an empty cache.
        On the CPU each layer's K/V buffers keep room for the rest of the prompt
        and max_new_tokens more: the forward passes write their tokens' K/V in
        place rather than concatenate (a DynamicLayer copies the whole history
        at every update); past that room the cache grows as a DynamicCache does."""
        try:
            return self._load(session, input_ids, max_new_tokens)
        except (UnavailableError, KvtierTimeoutError) as e:
            self._away(e, "recomputing this turn")
            return DynamicCache(), 0

    def store(self, session: str, input_ids: Any, cache: Any) -> int:
        """Commits the full blocks of input_ids whose K/V `cache` holds and the
        session does not yet: the session then holds them all. Returns how many
        blocks were committed (0 with kvtierd away)."""
        try:
            return self._store(session, input_ids, cache)
        except (UnavailableError, KvtierTimeoutError) as e:
            self._away(e, "this turn is not cached")
            return 0
        except ResourceExhaustedError as e:  # A full tier or quota, or the session's length limit.
            _log.warning("kvtier: this turn is not cached: %s", e)
            return 0

    def _away(self, error: BaseException, what: str) -> None:
        """kvtierd is gone or did not answer in time: said, and told to on_unavailable."""
        _log.warning("kvtier: kvtierd is unavailable, %s: %s", what, error)
        if self.on_unavailable is not None:
            self.on_unavailable(error)

    def _load(self, session: str, input_ids: Any, max_new_tokens: int) -> tuple[DynamicCache, int]:
        tokens = _tokens(input_ids)
        usable = (len(tokens) - 1) // self.block_tokens * self.block_tokens
        cache = DynamicCache()
        if usable <= 0:
            return cache, 0
        # A GPU-tier pool read on the GPU: host-tier hits are promoted first, then
        # copied device to device. Otherwise the rows are copied out of shared
        # memory either way: host-tier hits are read where they lie, at once,
        # and kvtierd promotes them when the lease is released.
        lease = self.client.acquire(tokens[:usable], session=session, promote=True if self.gpu else "after_read")
        try:
            n = len(lease)
            if n == 0:
                return cache, 0
            stream = self._stream()
            if stream:
                lease.wait_on_stream(stream)  # Promotions land before the copies below run.
            else:
                lease.wait()
            bt = self.block_tokens
            layers, kvh, hd = self.profile["layers"], self.profile["kv_heads"], self.profile["head_dim"]
            on_gpu = self.gpu and any(tier == "gpu" for tier, _ in lease.blocks)
            if not on_gpu and self.device.type == "cpu":
                # Host memory into a CPU model: a native pass per layer copies its two
                # planes into the HF layout [kv_heads, seq, head_dim], in buffers with
                # room after the prefix (a buffer per layer stays small enough for
                # malloc to reuse).
                capacity = len(tokens) + max(0, int(max_new_tokens))
                for layer in range(layers):
                    planes = torch.empty(2, 1, kvh, capacity, hd, dtype=self.dtype)
                    lease.gather(to_numpy(planes), layer, 1, capacity)
                    cache.layers.append(RoomyLayer(planes[0], planes[1], n * bt))
            elif not on_gpu:
                # Host memory into a GPU model: gathered on the CPU, then copied over.
                for layer in range(layers):
                    planes = torch.empty(2, kvh, n * bt, hd, dtype=self.dtype)
                    lease.gather(to_numpy(planes), layer, 1)
                    planes = planes.to(self.device, non_blocking=True)
                    cache.update(planes[0].unsqueeze(0), planes[1].unsqueeze(0), layer)
            else:
                # GPU-tier blocks, read in place on torch's stream: one copy per plane
                # straight into the HF layout [batch, kv_heads, seq, head_dim].
                blocks = [self._block(lease, i, writable=False) for i in range(n)]
                for layer in range(layers):
                    k = torch.empty(1, kvh, n * bt, hd, dtype=self.dtype, device=self.device)
                    v = torch.empty_like(k)
                    for i, b in enumerate(blocks):
                        k[0, :, i * bt:(i + 1) * bt].copy_(b[layer, 0].permute(1, 0, 2), non_blocking=True)
                        v[0, :, i * bt:(i + 1) * bt].copy_(b[layer, 1].permute(1, 0, 2), non_blocking=True)
                    cache.update(k, v, layer)
        finally:
            stream = self._stream()
            if stream:
                lease.release_after(stream)  # Pinned until the copies above are done.
            else:
                lease.release()
        return cache, n * bt + self._add_tail(session, tokens, n * bt, cache)

    def _add_tail(self, session: str, tokens: list[int], cached: int, cache: DynamicCache) -> int:
        """Appends the session's kept tail when it continues the cached blocks
        with the prompt's own tokens (one token at least is left to compute).
        Returns how many tokens it added."""
        kept = self._tails.get(session)
        if kept is None:
            return 0
        seen, kv = kept
        full = len(seen) - kv[0][0].size(-2)
        end = min(len(seen), len(tokens) - 1)
        if full != cached or end <= cached or tokens[:end] != seen[:end]:
            return 0
        for layer, (k, v) in enumerate(kv):
            cache.layers[layer].update(  # type: ignore[union-attr]  # load made them DynamicLayers
               k[:, :, :end - cached].to(self.device), v[:, :, :end - cached].to(self.device))
        return end - cached

    def _keep_tail(self, session: str, tokens: list[int], known: int, cache: Any) -> None:
        full = known // self.block_tokens * self.block_tokens
        self._tails.pop(session, None)
        if self.tail_sessions <= 0 or full == known or full == 0:
            return
        kv = []
        for layer in range(self.profile["layers"]):
            k, v = layer_kv(cache, layer)
            kv.append((k[:, :, full:known].to("cpu", copy=True), v[:, :, full:known].to("cpu", copy=True)))
        self._tails[session] = (tokens[:known], kv)
        while len(self._tails) > self.tail_sessions:
            self._tails.popitem(last=False)

    def _store(self, session: str, input_ids: Any, cache: Any) -> int:
        tokens = _tokens(input_ids)
        held = held_tokens(cache)
        if held == 0 and len(tokens) >= self.block_tokens:
            _log.warning("kvtier: this turn is not cached: a sliding-window layer of its cache dropped its first "
                         "tokens (a cache from load keeps them all)")
        known = min(len(tokens), held)
        self._keep_tail(session, tokens, known, cache)
        full = known // self.block_tokens
        if full == 0:
            return 0
        keys = self.client.keys(tokens[: full * self.block_tokens])
        try:
            chain = [key for key, _ in self.client.session(session)["chain"]]
        except NotFoundError:  # A new session holds nothing.
            chain = []
        start = 0
        while start < min(len(chain), full) and chain[start] == keys[start]:
            start += 1
        if start == full:
            return 0
        n = full - start
        bt = self.block_tokens
        w = self.client.allocate(n)
        stream = self._stream()
        try:
            slots = [self._block(w, i, writable=True) for i in range(n)]
            for layer in range(self.profile["layers"]):
                k, v = layer_kv(cache, layer)
                # [1, kv_heads, seq, hd] rows of the new blocks -> each slot's [bt, kv_heads, hd] planes.
                for i, slot in enumerate(slots):
                    lo, hi = (start + i) * bt, (start + i + 1) * bt
                    slot[layer, 0].copy_(k[0, :, lo:hi].permute(1, 0, 2), non_blocking=True)
                    slot[layer, 1].copy_(v[0, :, lo:hi].permute(1, 0, 2), non_blocking=True)
            if self.gpu and stream:
                w.record_written(stream)  # kvtierd serves the blocks once these copies are done.
            elif stream:
                torch.cuda.current_stream(self.device).synchronize()  # Device -> host copies into the pool.
            self.client.commit(w, session, tokens[start * bt: full * bt], start_block=start,
                               parent=keys[start - 1] if start > 0 else None)
        finally:
            if self.gpu and stream:
                w.release_after(stream)
            else:
                w.release()
        return n
