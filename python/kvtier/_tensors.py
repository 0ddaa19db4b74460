"""kvtier's blocks as torch tensors (torch and numpy only: kvtier.hf,
kvtier.paged and kvtier.vllm share it, and none of them pays for another's
imports).

DTYPES names each torch dtype as a kvtier profile and as safetensors do.
block_tensor views a pool block in place: [layers, 2 (K, V), block_tokens,
kv_heads, head_dim] of the profile's dtype. Host-tier (and host-backend) blocks
are CPU tensors over the shared memory; a GPU-tier block of a cuda-backend
kvtierd is a CUDA tensor over the pool this process maps through CUDA IPC.
Valid while the lease is held."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

# A torch dtype's kvtier profile name and safetensors name.
DTYPES: dict[torch.dtype, tuple[str, str]] = {
    torch.float32: ("fp32", "F32"),
    torch.float16: ("fp16", "F16"),
    torch.bfloat16: ("bf16", "BF16"),
}

# A profile dtype's torch dtype, and how __cuda_array_interface__ spells its elements (bf16 as its bits).
TORCH_DTYPE: dict[str, torch.dtype] = {name: dtype for dtype, (name, _) in DTYPES.items()}
_TYPESTR = {"fp32": "<f4", "fp16": "<f2", "bf16": "<u2"}


class _CudaBlock:
    """A GPU-tier block (the cuda backend's pool, mapped through CUDA IPC) as
    torch.as_tensor reads it: [layers, 2, block_tokens, kv_heads, head_dim]."""

    def __init__(self, address: int, profile: dict[str, Any]):
        e = TORCH_DTYPE[profile["dtype"]].itemsize
        bt, kvh, hd = profile["block_tokens"], profile["kv_heads"], profile["head_dim"]
        plane = bt * kvh * hd * e
        self.__cuda_array_interface__ = {
            "shape": (profile["layers"], 2, bt, kvh, hd),
            "typestr": _TYPESTR[profile["dtype"]],
            "data": (address, False),
            "strides": (2 * plane, plane, kvh * hd * e, hd * e, e),
            "version": 3,
        }


def block_tensor(client: Any, lease: Any, i: int, writable: bool = False,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Block i of a lease (or slot i of a write lease) as a torch tensor viewing
    the pool in place: [layers, 2 (K, V), block_tokens, kv_heads, head_dim] of
    the profile's dtype. A GPU-tier block of a cuda-backend kvtierd is a CUDA
    tensor on `device` (default: the current one); others are CPU tensors over
    the shared memory. Valid while the lease is held."""
    return view(lease, i, writable, client.profile, client.backend == "cuda", device)


def view(lease: Any, i: int, writable: bool, profile: dict[str, Any], gpu: bool,
         device: torch.device | str | None) -> torch.Tensor:
    """block_tensor with the profile and backend given (no native calls for them)."""
    dtype = TORCH_DTYPE[profile["dtype"]]
    if gpu:
        tier, address = ("gpu", lease.address(i)) if writable else lease.address(i)
        if tier == "gpu" and address:
            t = torch.as_tensor(_CudaBlock(address, profile), device=device or torch.device("cuda"))
            return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
    with warnings.catch_warnings():  # A read lease's view is read-only: torch warns, the caller only reads.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(lease.block(i))
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy (bf16 as its raw bytes, which numpy has no type for)."""
    return t.view(torch.uint8).numpy() if t.dtype == torch.bfloat16 else t.numpy()
