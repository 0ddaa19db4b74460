"""kvtier.paged: a paged KV cache (vLLM's) copied to and from kvtierd's blocks.

An engine that pages its KV keeps, per layer, a tensor of blocks of N tokens
each. One engine block is one kvtier block: the profile's block_tokens must be
N (PagedKV.check refuses any other profile, naming both sizes). The block's
page in layer l becomes layer l of the kvtier block, copied as it lies
(opaque): the engine's layout within a page is its own (vLLM's CPU backend
packs heads first, for its ISA) and is part of the model identity, so only
engines that lay blocks out the same way share them.

Why whole blocks: a kvtier block's bytes must depend only on the tokens its key
chain covers. A page cut into pieces keyed by fewer tokens broke that on
layouts whose pages are not token-major (every piece holds some heads of all N
tokens): two prompts sharing a prefix that ended inside an engine block could
each save some pieces of that block, and the block then held both prompts' KV.
With one kvtier block per engine block the key covers every token the page
depends on, so no save can mix two prompts (docs/design.md, "vLLM connector").

Torch only (no vLLM or transformers import): kvtier.vllm's connector uses it,
and the tests run it against a real kvtierd on both backends without an engine.
On a cuda-backend kvtierd with the cache on the GPU, copies are device to
device between the GPU tier (CUDA IPC) and the cache, queued on the caller's
stream and ordered with kvtierd's events (a read lease waits on the stream for
its promotions and is released after the stream's copies; a write lease is
committed after an event recorded behind them). Host-tier blocks are copied
host to device.

A save's copy on the CPU is one memmove per layer page, never torch's copy_:
saves run on a thread of their own (kvtier.vllm's saver), and torch's parallel
copy there starts a second OpenMP team beside the engine's. libgomp then has
more threads than cores and stops letting any team's threads spin at a barrier
(they sleep and are woken instead), so every step of the engine slows: a vLLM
CPU engine decoded 13% slower with the connector than without it, even for
requests the connector left alone, until the saves stopped using torch here.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
import warnings
from typing import Any

import torch

import kvtier
from kvtier._tensors import DTYPES, block_tensor, view

__all__ = ["PagedKV", "load_blocks", "profile_mismatch", "save_blocks", "save_new_blocks"]


def _page_view(t: torch.Tensor) -> torch.Tensor | None:
    """[blocks, page elements] viewing each block of a layer tensor [blocks, ...]
    as the dense run of memory it occupies (its axes in memory order), or None
    when a block's elements are not one dense run."""
    inner = sorted(range(1, t.dim()), key=lambda d: (-t.stride()[d], d))
    p = t.permute(0, *inner)
    if not p[0].is_contiguous():
        return None
    return p.flatten(1)


def profile_mismatch(profile: dict[str, Any], layers: int, kv_heads: int, head_dim: int, dtype: str,
                     block_size: int) -> str | None:
    """Why kvtierd's `profile` cannot hold an engine's blocks one for one, or
    None when it can: the same layers, KV heads, head size and dtype, and
    block_tokens equal to the engine's block size (a kvtier block is one engine
    block). The message names both geometries and what to change."""
    ours = (layers, kv_heads, head_dim, dtype, block_size)
    theirs = (profile["layers"], profile["kv_heads"], profile["head_dim"], profile["dtype"], profile["block_tokens"])
    if ours == theirs:
        return None
    what = f"kvtierd's profile '{profile['name']}' ({profile['layers']} layers x {profile['kv_heads']} kv_heads x " \
           f"{profile['head_dim']} dim, {profile['dtype']}, blocks of {profile['block_tokens']} tokens) does not fit " \
           f"this engine's KV cache ({layers} layers x {kv_heads} kv_heads x {head_dim} dim, {dtype}, blocks of " \
           f"{block_size} tokens)"
    if ours[:4] == theirs[:4]:
        what += f": a kvtier block must be one engine block, {block_size} tokens, not {profile['block_tokens']} " \
                f"(configure a profile with block_tokens: {block_size}, or run the engine with blocks of " \
                f"{profile['block_tokens']} tokens)"
    return what


class PagedKV:
    """Per-layer paged KV tensors [blocks, kv_heads, block_size, 2 x head_dim]
    (vLLM's logical view, any physical order in which each block of a layer is
    one dense page). Raises ValueError, naming `layout`, for anything else."""

    def __init__(self, layers: list[torch.Tensor], block_size: int, layout: str = "", names: list[str] | None = None):
        if not layers:
            raise ValueError("kvtier: no KV cache layers")
        names = names or [str(i) for i in range(len(layers))]
        t = layers[0]
        if t.dim() != 4 or t.shape[2] != block_size:
            raise ValueError(f"kvtier: unsupported KV cache layout {layout}: layer tensors of shape {tuple(t.shape)} "
                             f"(expected [blocks, kv_heads, {block_size}, 2 x head_dim])")
        pages = []
        for n, kv in zip(names, layers):
            page = _page_view(kv) if kv.shape == t.shape and kv.dtype == t.dtype else None
            if page is None:
                raise ValueError(f"kvtier: unsupported KV cache layout {layout}: layer {n} has shape "
                                 f"{tuple(kv.shape)}, strides {kv.stride()}, {kv.dtype}: each block of a layer must "
                                 "be one dense page, alike in every layer")
            pages.append(page)
        self.layers, self.block_size, self.dtype, self.device = len(layers), block_size, t.dtype, t.device
        self.kv_heads, self.head_dim = t.shape[1], t.shape[3] // 2
        self.page_elements = pages[0].shape[1]
        joined = self._joined(pages)
        # (first layer, view [layers, blocks, page]): one for all layers when vLLM
        # placed them at a fixed stride in one allocation (it does), else one per layer.
        self._views = [(0, joined)] if joined is not None else [(i, p.unsqueeze(0)) for i, p in enumerate(pages)]

    @staticmethod
    def _joined(pages: list[torch.Tensor]) -> torch.Tensor | None:
        t = pages[0]
        if len(pages) == 1:
            return t.unsqueeze(0)
        size = t.element_size()
        step = pages[1].data_ptr() - t.data_ptr()
        if step <= 0 or step % size:
            return None
        for i, p in enumerate(pages):
            if p.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or \
                    p.data_ptr() != t.data_ptr() + i * step or p.stride() != t.stride():
                return None
        return t.as_strided((len(pages), *t.shape), (step // size, *t.stride()), t.storage_offset())

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def mismatch(self, profile: dict[str, Any]) -> str | None:
        """Why kvtierd's `profile` cannot hold this cache's blocks one for one, or
        None when it can (profile_mismatch)."""
        dtype = DTYPES[self.dtype][0] if self.dtype in DTYPES else str(self.dtype)
        return profile_mismatch(profile, self.layers, self.kv_heads, self.head_dim, dtype, self.block_size)

    def check(self, profile: dict[str, Any]) -> None:
        """Raises kvtier.FailedPreconditionError (mismatch()) unless `profile` fits."""
        why = self.mismatch(profile)
        if why is not None:
            raise kvtier.FailedPreconditionError(f"kvtier: {why}")

    def _layer_views(self, block: int):
        for first, v in self._views:
            yield first, v[:, block]

    def copy_in(self, src: torch.Tensor, block: int, piece: int = 0, pieces: int = 1,
                non_blocking: bool = False) -> None:
        """kvtier block `src` [layers, ...] into engine block `block`. (piece and
        pieces are the older signature's; a block is copied whole: 0 and 1.)"""
        _whole(piece, pieces)
        for first, d in self._layer_views(block):
            d.copy_(src[first:first + d.shape[0]].reshape(d.shape), non_blocking=non_blocking)

    def copy_out(self, dst: torch.Tensor, block: int, piece: int = 0, pieces: int = 1,
                 non_blocking: bool = False) -> None:
        """Engine block `block` into kvtier block `dst` [layers, ...] (piece, pieces: as copy_in)."""
        _whole(piece, pieces)
        for first, s in self._layer_views(block):
            d = dst[first:first + s.shape[0]].view(s.shape)
            if not _copy_pages(d, s):
                d.copy_(s, non_blocking=non_blocking)

    def pieces(self, block_tokens: int) -> int:
        """Deprecated: engine blocks are no longer cut into pieces (one kvtier
        block is one engine block); kept for older callers. Engine block tokens
        over `block_tokens`."""
        warnings.warn("PagedKV.pieces is deprecated: a kvtier block is one engine block", DeprecationWarning,
                      stacklevel=2)
        return self.block_size // block_tokens


def _copy_pages(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """dst <- src, both CPU tensors [pages, page elements] of one dtype whose
    pages are dense runs, as one memmove per page (ctypes drops the GIL for
    each): no OpenMP team on the calling thread (the module docstring). False,
    copying nothing, for anything else (CUDA tensors, other layouts)."""
    if dst.device.type != "cpu" or src.device.type != "cpu" or dst.dtype != src.dtype or dst.shape != src.shape \
            or dst.dim() != 2 or (dst.shape[1] > 1 and (dst.stride(1) != 1 or src.stride(1) != 1)):
        return False
    size = dst.element_size()
    page = dst.shape[1] * size
    d, s = dst.data_ptr(), src.data_ptr()
    ds, ss = dst.stride(0) * size, src.stride(0) * size
    for i in range(dst.shape[0]):
        ctypes.memmove(d + i * ds, s + i * ss, page)
    return True


def _whole(piece: int, pieces: int) -> None:
    if (piece, pieces) != (0, 1):
        raise ValueError(f"kvtier: engine blocks are copied whole (piece 0 of 1), not piece {piece} of {pieces}: "
                         "a piece would be keyed by fewer tokens than its bytes depend on")


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _end(lease, stream, quiet: bool = True) -> None:
    """Ends a read or write lease: after `stream`'s copies (cuda), or now. quiet:
    a kvtierd already gone is no error (the lease went with it)."""
    try:
        if stream is not None:
            lease.release_after(stream)
        else:
            lease.release()
    except kvtier.Error:
        if not quiet:
            raise


def _gpu_stream(client, paged: PagedKV, stream):
    """The stream copies run on when they are device to device, else None."""
    if client.backend == "cuda" and paged.is_cuda:
        return stream if stream is not None else torch.cuda.current_stream(paged.device)
    return None


def load_blocks(client, paged: PagedKV, tokens: list[int], session: str, first: int, block_ids: list[int],
                stream=None, timings: dict | None = None) -> tuple[list[int], int]:
    """Fills engine blocks `block_ids` (the prompt's blocks first, first+1, ...)
    from kvtierd's blocks of `tokens` (the prompt's tokens through block
    first + len(block_ids)); the lease becomes `session`'s chain. Returns the
    engine block ids filled (a prefix of block_ids: kvtierd may hold fewer than
    were probed) and the blocks the session now holds. Raises kvtier.Error when
    the lease did not end well, or kvtierd's profile (after a reconnect: perhaps
    another kvtierd's) does not fit: then nothing counts as filled. On the GPU,
    the copies are queued on `stream` (default: the current one). `timings`,
    when given, gets the seconds of each stage: acquire, wait, copy, release."""
    clock = _Stages(timings)
    gpu = _gpu_stream(client, paged, stream)
    lease = client.acquire(tokens, session=session, promote=True if gpu is not None else "after_read")
    clock.lap("acquire")
    try:
        paged.check(client.profile)  # The kvtierd that answered, whichever it is.
        if gpu is not None:
            lease.wait_on_stream(gpu)  # Promotions land before the copies read them.
        else:
            lease.wait()
        clock.lap("wait")
        got = len(lease)
        done = []
        with _on(gpu):
            for i, b in enumerate(block_ids):
                if first + i >= got:
                    break
                paged.copy_in(block_tensor(client, lease, first + i, device=paged.device), b,
                              non_blocking=gpu is not None)
                done.append(b)
        clock.lap("copy")
    except BaseException:
        _end(lease, gpu)  # After any copies already queued.
        raise
    _end(lease, gpu, quiet=False)
    clock.lap("release")
    return done, got


class _Stages:
    """Seconds since the last lap, per named stage, into `out` (nothing when out is None)."""

    def __init__(self, out: dict | None):
        self._out = out
        self._t = time.perf_counter() if out is not None else 0.0

    def lap(self, name: str) -> None:
        if self._out is not None:
            now = time.perf_counter()
            self._out[name], self._t = now - self._t, now


def save_blocks(client, paged: PagedKV, tokens: list[int], session: str, block_ids: list[int], have: int = 0,
                stream=None) -> tuple[int, int]:
    """Writes engine blocks `block_ids` (the prompt's first len(block_ids)
    blocks, `tokens` their tokens) to kvtierd as `session`'s chain, skipping
    the prefix kvtierd holds already; `have`: blocks the session holds of them
    (from a load or an earlier save; the cached prefix is adopted as the
    session's chain when it is not). Every block is written whole, from the
    first one kvtierd lacks. Returns (blocks the session holds now, blocks
    stored). Raises kvtier.Error, as load_blocks."""
    gpu = _gpu_stream(client, paged, stream)
    bt = client.block_tokens
    total = len(block_ids)
    cached = client.probe(tokens[: total * bt])
    if cached >= total:
        return have, 0  # Every block is in kvtierd already (another engine's, an earlier request's).
    if 0 < cached != have:
        # What kvtierd holds of this prefix becomes the session's chain; only the rest is written.
        with client.acquire(tokens[: cached * bt], session=session, promote=False) as lease:
            cached = len(lease)
    start = cached
    w = client.allocate(total - start)
    try:
        paged.check(client.profile)
        with _on(gpu):
            for i in range(total - start):
                dst = block_tensor(client, w, i, writable=True, device=paged.device)
                paged.copy_out(dst, block_ids[start + i], non_blocking=gpu is not None)
        if gpu is not None:  # kvtierd serves them once the copies are done.
            w.record_written(gpu)
        parent = client.keys(tokens[: start * bt])[-1] if start else None
        stored, _ = client.commit(w, session, tokens[start * bt: total * bt], start_block=start, parent=parent)
    finally:
        _end(w, gpu)
    return total, stored


def save_new_blocks(client, paged: PagedKV, lease, tokens: list[int], session: str, block_ids: list[int],
                    start: int, parent: str | None, refill: int = 0, stream=None) -> tuple[int, int, int, str]:
    """Writes engine blocks block_ids[start:] (the prompt's blocks from `start`,
    `tokens` its tokens through them) into the first slots of write `lease` and
    saves them as blocks start, start+1, ... of `session`, chained from
    `parent` (the key of block start - 1; None for block 0), in one round trip
    whose cost does not grow with the prefix: no probe, no re-hashing, and a
    session that does not hold the prefix yet takes kvtierd's cached chain
    ending at `parent` (client.save's adopt). The lease comes back holding up
    to `refill` slots (a new id; none: it ended). Returns client.save's
    (stored, duplicates, adopted, the last block's key). Raises kvtier.Error:
    kvtier.FailedPreconditionError when part of that prefix is no longer
    cached (then save_blocks does it the long way)."""
    gpu = _gpu_stream(client, paged, stream)
    bt = client.block_tokens
    total = len(block_ids)
    profile = client.profile
    paged.check(profile)  # The kvtierd that answered, whichever it is.
    with _on(gpu):
        for i in range(total - start):
            dst = view(lease, i, True, profile, gpu is not None, paged.device)
            paged.copy_out(dst, block_ids[start + i], non_blocking=gpu is not None)
    if gpu is not None:  # kvtierd serves them once the copies are done.
        lease.record_written(gpu)
    return client.save(lease, session, tokens[start * bt: total * bt], start, parent, adopt=True, refill=refill)

