"""kvtier.paged: a paged KV cache (vLLM's) copied to and from kvtierd's blocks.

An engine that pages its KV keeps, per layer, a tensor of blocks of N tokens
each. kvtierd's blocks hold block_tokens tokens (N is a multiple of it), so one
engine block is N / block_tokens kvtier blocks: the block's page in layer l is
cut into that many equal pieces, piece j going to layer l of kvtier block j.
The bytes are copied as they lie (opaque): the engine's layout within a page is
its own and is part of the model identity, so only engines that lay blocks out
the same way share them, and only whole engine blocks are ever loaded.

Torch only (no vLLM import): kvtier.vllm's connector uses it, and the tests run
it against a real kvtierd on both backends without an engine. On a cuda-backend
kvtierd with the cache on the GPU, copies are device to device between the
GPU tier (CUDA IPC) and the cache, queued on the caller's stream and ordered
with kvtierd's events (a read lease waits on the stream for its promotions and
is released after the stream's copies; a write lease is committed after an
event recorded behind them). Host-tier blocks are copied host to device.
"""

from __future__ import annotations

import contextlib

import torch

import kvtier
from kvtier.hf import block_tensor

__all__ = ["PagedKV", "load_blocks", "save_blocks"]


def _page_view(t: torch.Tensor) -> torch.Tensor | None:
    """[blocks, page elements] viewing each block of a layer tensor [blocks, ...]
    as the dense run of memory it occupies (its axes in memory order), or None
    when a block's elements are not one dense run."""
    inner = sorted(range(1, t.dim()), key=lambda d: (-t.stride()[d], d))
    p = t.permute(0, *inner)
    if not p[0].is_contiguous():
        return None
    return p.flatten(1)


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

    def pieces(self, block_tokens: int) -> int:
        """kvtier blocks per engine block."""
        return self.block_size // block_tokens

    def _slices(self, block: int, piece: int, pieces: int):
        for first, v in self._views:
            yield first, v[:, block].unflatten(1, (pieces, -1))[:, piece]

    def copy_in(self, src: torch.Tensor, block: int, piece: int, pieces: int, non_blocking: bool = False) -> None:
        """kvtier block `src` [layers, ...] into piece `piece` of engine block `block`."""
        for first, d in self._slices(block, piece, pieces):
            d.copy_(src[first:first + d.shape[0]].reshape(d.shape), non_blocking=non_blocking)

    def copy_out(self, dst: torch.Tensor, block: int, piece: int, pieces: int, non_blocking: bool = False) -> None:
        """Piece `piece` of engine block `block` into kvtier block `dst` [layers, ...]."""
        for first, s in self._slices(block, piece, pieces):
            dst[first:first + s.shape[0]].view(s.shape).copy_(s, non_blocking=non_blocking)


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
                stream=None) -> tuple[list[int], int]:
    """Fills engine blocks `block_ids` (the prompt's blocks first, first+1, ...)
    from kvtierd's blocks of `tokens` (the prompt's tokens through block
    first + len(block_ids)); the lease becomes `session`'s chain. Returns the
    engine block ids filled (a prefix of block_ids: kvtierd may hold fewer than
    were probed) and the kvtier blocks the session now holds. Raises
    kvtier.Error when the lease did not end well: then nothing counts as filled.
    On the GPU, the copies are queued on `stream` (default: the current one)."""
    gpu = _gpu_stream(client, paged, stream)
    pieces = paged.pieces(client.block_tokens)
    lease = client.acquire(tokens, session=session, promote=True if gpu is not None else "after_read")
    try:
        got = len(lease) // pieces  # Whole engine blocks the lease holds.
        if gpu is not None:
            lease.wait_on_stream(gpu)  # Promotions land before the copies read them.
        else:
            lease.wait()
        done = []
        with _on(gpu):
            for i, b in enumerate(block_ids):
                vb = first + i
                if vb >= got:
                    break
                for j in range(pieces):
                    src = block_tensor(client, lease, vb * pieces + j, device=paged.device)
                    paged.copy_in(src, b, j, pieces, non_blocking=gpu is not None)
                done.append(b)
        chain = len(lease)
    except BaseException:
        _end(lease, gpu)  # After any copies already queued.
        raise
    _end(lease, gpu, quiet=False)
    return done, chain


def save_blocks(client, paged: PagedKV, tokens: list[int], session: str, block_ids: list[int], have: int = 0,
                stream=None) -> tuple[int, int]:
    """Writes engine blocks `block_ids` (the prompt's first len(block_ids)
    blocks, `tokens` their tokens) to kvtierd as `session`'s chain, skipping
    what kvtierd holds already; `have`: kvtier blocks the session holds of them
    (from a load or an earlier save). Returns (kvtier blocks the session holds
    now, blocks stored). Raises kvtier.Error."""
    gpu = _gpu_stream(client, paged, stream)
    pieces = paged.pieces(client.block_tokens)
    bt = client.block_tokens
    total = len(block_ids) * pieces
    cached = client.probe(tokens[: total * bt]) if have < total else have
    if cached >= total:
        return have, 0  # Every block is in kvtierd already (another engine's, an earlier request's).
    if cached == 0:
        have = 0  # Nothing of it is cached (kvtierd may have restarted): written from the start.
    else:
        # What kvtierd holds of this prefix becomes the session's chain; only the rest is written.
        with client.acquire(tokens[: total * bt], session=session, promote=False) as lease:
            have = len(lease)
    if have >= total:
        return have, 0
    n = total - have
    w = client.allocate(n)
    try:
        with _on(gpu):
            for i in range(n):
                vb, j = divmod(have + i, pieces)
                dst = block_tensor(client, w, i, writable=True, device=paged.device)
                paged.copy_out(dst, block_ids[vb], j, pieces, non_blocking=gpu is not None)
        if gpu is not None:  # kvtierd serves them once the copies are done.
            w.record_written(gpu)
        parent = client.keys(tokens[: have * bt])[-1] if have else None
        stored, _ = client.commit(w, session, tokens[have * bt: total * bt], start_block=have, parent=parent)
    finally:
        _end(w, gpu)
    return total, stored
