"""What kvtier.vllm needs of an engine: the configurations it understands (and
refuses the rest of at start-up, by name), and the identity its blocks are
shared under. kvtier.vllm re-exports model_identity."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Any

from kvtier._tensors import DTYPES

try:  # vLLM's own log format and level.
    from vllm.logger import init_logger

    _log = init_logger("vllm.kvtier")
except ImportError:  # pragma: no cover
    _log = logging.getLogger("kvtier.vllm")

_SAMPLE_BYTES = 1 << 16  # Of each weight file, at each of _SAMPLES offsets.
_SAMPLES = 16
_WITHOUT = "run this engine without the kvtier connector (no --kv-transfer-config), or with another connector"


# --- what is understood ----------------------------------------------------------------

def refusal(vllm_config, kv_cache_config=None) -> str | None:
    """Why the connector cannot cache this engine's KV, or None when it can.

    Understood: one group of full-attention layers (vLLM's FullAttentionSpec,
    no window, no chunking, causal) whose KV is fp32, fp16 or bf16 as the model
    computes it, with tensor parallelism of any size (every rank its own
    identity) and no pipeline or context parallelism. Everything else is
    refused before the first request, rather than cached wrongly: a sliding
    window frees blocks mid-request (vLLM puts its null block in their place), a
    quantized KV cache (fp8) and MLA have other pages, Mamba and hybrid models
    keep state that is not per token, pipeline stages each hold some layers,
    and context parallelism splits a block's tokens across ranks."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    model = os.path.basename(os.path.normpath(str(mc.model)))
    if pc.pipeline_parallel_size > 1:
        return (f"kvtier: pipeline parallelism (pipeline_parallel_size {pc.pipeline_parallel_size}) is not "
                f"supported: each stage holds some layers' KV and kvtier's blocks are all layers'; run with "
                f"pipeline_parallel_size 1 (tensor parallelism is supported), or {_WITHOUT}")
    for what in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        size = getattr(pc, what, 1) or 1
        if size > 1:
            return (f"kvtier: context parallelism ({what} {size}) splits a block's tokens across ranks, which "
                    f"kvtier does not support; run with {what} 1, or {_WITHOUT}")
    dtype = str(cc.cache_dtype)
    if dtype not in ("auto", ""):
        return (f"kvtier: the KV cache dtype {dtype!r} (a quantized KV cache) is not supported: kvtier caches KV in "
                f"the model's dtype (fp32, fp16, bf16); run with kv_cache_dtype 'auto', or {_WITHOUT}")
    if getattr(mc, "use_mla", False):
        return f"kvtier: {model} uses multi-head latent attention (MLA), which kvtier does not cache; {_WITHOUT}"
    if getattr(mc, "is_attention_free", False) or getattr(mc, "is_hybrid", False) or \
            getattr(mc, "has_inner_state", False):
        return (f"kvtier: {model} keeps recurrent state (Mamba, linear attention or a hybrid of them with "
                f"attention), which kvtier does not cache: it caches full attention only; {_WITHOUT}")
    window = _sliding_window(mc)
    if window:
        told = f" (a window of {window} tokens)" if window > 0 else ""
        return (f"kvtier: {model} uses sliding-window attention{told}, which kvtier does not cache: it caches full "
                f"attention only; {_WITHOUT}")
    types = getattr(getattr(mc, "hf_text_config", None), "layer_types", None) or ()
    odd = sorted({str(t) for t in types} - {"attention", "full_attention"})
    if odd:
        return (f"kvtier: {model} has layers of kind {', '.join(odd)} beside full attention, which kvtier does not "
                f"cache: it caches full attention only; {_WITHOUT}")
    if kv_cache_config is None:
        return None
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        kinds = ", ".join(sorted({type(g.kv_cache_spec).__name__ for g in groups}))
        return (f"kvtier: {model} has {len(groups)} KV cache groups ({kinds}): kvtier caches one group of "
                f"full-attention layers; {_WITHOUT}")
    return spec_refusal(model, groups[0].kv_cache_spec)


def spec_refusal(model: str, spec: Any) -> str | None:
    """Why a KV cache spec is not one kvtier understands (see refusal)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    kind = type(spec).__name__
    if type(spec) is not FullAttentionSpec:
        return (f"kvtier: {model}'s attention is {kind}; kvtier caches full attention (FullAttentionSpec) only; "
                f"{_WITHOUT}")
    odd = [f"{name} {getattr(spec, name)!r}" for name, usual in (
        ("sliding_window", None), ("attention_chunk_size", None), ("non_causal", False),
        ("page_size_padded", None), ("num_head_slots", None), ("state_content_bytes", None), ("tokens_per_state", 1))
        if getattr(spec, name, usual) != usual]
    if getattr(spec, "head_size_v", spec.head_size) != spec.head_size:
        odd.append(f"head_size_v {spec.head_size_v} (head_size {spec.head_size})")
    quant = getattr(spec, "kv_quant_mode", None)
    if quant is not None and getattr(quant, "value", quant) not in (0, "NONE", None):
        odd.append(f"kv_quant_mode {quant!r}")
    if odd:
        return f"kvtier: {model}'s full attention has {', '.join(odd)}: kvtier caches plain full attention only; " \
               f"{_WITHOUT}"
    if spec.dtype not in DTYPES:
        return f"kvtier: {model}'s KV cache dtype {spec.dtype} has no kvtier profile dtype (fp32, fp16, bf16)"
    return None


def _sliding_window(mc) -> int | None:
    """The model's sliding window, if any of its layers uses one."""
    window = None
    try:
        window = mc.get_sliding_window()
    except Exception:  # noqa: BLE001 - a config without one
        window = None
    text = getattr(mc, "hf_text_config", None)
    if not window and text is not None:
        window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) else None
        types = getattr(text, "layer_types", None) or ()
        if not window and any("sliding" in str(t) for t in types):
            window = getattr(text, "sliding_window", None) or -1
    return window or None


# --- identity -------------------------------------------------------------------------

def _model_dir(model_config) -> str | None:
    """The local directory of the model's files (a path, or the hub's cached snapshot)."""
    model = model_config.model
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, revision=getattr(model_config, "revision", None), local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached locally: the identity says so
        return None


def _file_sample(path: str, h) -> None:
    """A weight file's size, its safetensors header, and _SAMPLES slices of its
    bytes spread over the file: any fine-tune changes them, reading them costs
    about a megabyte per file however large the model. A file of a Hugging Face
    cache is a link to a blob named by its content's hash: that name is the
    whole file's identity, for free."""
    blob = os.path.basename(os.path.realpath(path))
    if os.path.islink(path) and re.fullmatch(r"[0-9a-f]{64}", blob):
        h.update(f"{os.path.basename(path)} sha256 {blob}\n".encode())
        return
    size = os.path.getsize(path)
    h.update(f"{os.path.basename(path)} {size}\n".encode())
    with open(path, "rb") as f:
        head = f.read(8)
        if path.endswith(".safetensors") and len(head) == 8:
            n = int.from_bytes(head, "little")
            h.update(f.read(min(n, 100 << 20)))
        for i in range(_SAMPLES):
            f.seek(size * i // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))


def _plain(value: Any) -> Any:
    """A config value as JSON can hold it (dicts, lists and scalars as they are; the rest by repr)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):
        return f"callable {getattr(value, '__qualname__', repr(value))}"
    return repr(value)


def rank_identity(identity: str, rank: int, tensor_parallel_size: int) -> str:
    """Tensor-parallel rank `rank`'s identity, from the engine's: ranks hold
    different heads, so their blocks are never each other's."""
    if tensor_parallel_size <= 1:
        return identity
    return hashlib.blake2b(f"{identity} tp {tensor_parallel_size} rank {rank}".encode(), digest_size=16).hexdigest()


def model_identity(vllm_config, layout: str, rank: int = 0) -> str:
    """The identity (32 hex digits) the KV blocks of tensor-parallel rank `rank`
    of this engine are shared under: the model's files (config, tokenizer, a
    sample of every weight file), what changes its weights or KV as vLLM loads
    it (dtype, quantization, load format, config overrides such as RoPE
    scaling), the KV cache (dtype, block size, the backend's layout and ISA)
    and the parallel layout (tensor-parallel size and this rank; pipeline and
    context parallel sizes, which the connector refuses above 1, are kept too)."""
    return rank_identity(engine_identity(vllm_config, layout), rank, vllm_config.parallel_config.tensor_parallel_size)


def engine_identity(vllm_config, layout: str) -> str:
    """model_identity before the rank is mixed in."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    lc = getattr(vllm_config, "load_config", None)
    h = hashlib.blake2b(digest_size=16)
    settings = {
        # 2: one kvtier block per vLLM block; blocks saved under format 1 (vLLM blocks cut into
        # pieces, which could mix two prompts' KV) are never loaded again.
        "format": "kvtier vllm identity 2",
        "dtype": str(mc.dtype),
        "quantization": _plain(getattr(mc, "quantization", None)),
        "load_format": _plain(getattr(lc, "load_format", None)),
        "hf_overrides": _plain(getattr(mc, "hf_overrides", None)),
        "revision": _plain(getattr(mc, "revision", None)),
        "kv_cache_dtype": str(cc.cache_dtype),
        "block_size": cc.block_size,
        "layout": layout,
        "tensor_parallel_size": pc.tensor_parallel_size,
        "pipeline_parallel_size": pc.pipeline_parallel_size,
        "decode_context_parallel_size": getattr(pc, "decode_context_parallel_size", 1),
        "prefill_context_parallel_size": getattr(pc, "prefill_context_parallel_size", 1),
    }
    h.update(json.dumps(settings, sort_keys=True).encode())
    directory = _model_dir(mc)
    if directory is None:
        # Nothing to read: the name and revision must do (said once, loudly).
        _log.warning("kvtier: the files of model %s are not local: its identity covers only its name and revision",
                     mc.model)
        h.update(f"model={mc.model} revision={getattr(mc, 'revision', None)}".encode())
        return h.hexdigest()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                 "merges.txt", "chat_template.jinja", "generation_config.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    weights = sorted(f for f in os.listdir(directory) if f.endswith((".safetensors", ".bin", ".pt", ".gguf")))
    for name in weights:
        _file_sample(os.path.join(directory, name), h)
    return h.hexdigest()
