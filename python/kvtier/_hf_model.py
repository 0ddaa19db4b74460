"""What kvtier.hf needs of a model: a cache it can hold, and the KV geometry
that must be the daemon profile's.

kvtier holds per-token K/V blocks, so a model is served when its cache is a
transformers DynamicCache whose layers are all full-attention or
sliding-window attention layers (DynamicLayer, DynamicSlidingWindowLayer) of
[batch, kv_heads, seq, head_dim] tensors. Anything else (recurrent or
convolution state, multi-head latent attention, a cache of another class) is
refused at PrefixCache construction with an error naming it.
"""

from __future__ import annotations

import inspect
from typing import Any

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from . import InvalidArgumentError
from ._tensors import DTYPES

_HELD_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)


def geometry(model: Any) -> dict[str, Any]:
    """The model's KV geometry as a kvtier profile names it: layers, kv_heads, head_dim, dtype."""
    c = model.config.get_text_config(decoder=True)
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    dtype = model.dtype
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"model dtype {dtype} has no kvtier profile dtype (fp32, fp16, bf16)")
    return {
        "layers": c.num_hidden_layers,
        "kv_heads": getattr(c, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "dtype": DTYPES[dtype][0],
    }


def check_supported(model: Any) -> None:
    """Raises kvtier.InvalidArgumentError naming what of the model's cache
    kvtier cannot hold, if anything."""
    config = model.config.get_text_config(decoder=True)
    name = f"model {model.config.model_type} ({type(model).__name__})"
    rank = getattr(config, "kv_lora_rank", None)
    if rank:
        raise InvalidArgumentError(
            f"kvtier.hf does not support {name}: it uses multi-head latent attention (MLA, kv_lora_rank={rank}), "
            "whose cache holds a compressed latent rather than per-head K/V; kvtier.hf holds full-attention and "
            "sliding-window K/V only")
    if "past_key_values" not in inspect.signature(model.forward).parameters:
        raise InvalidArgumentError(
            f"kvtier.hf does not support {name}: its forward takes no past_key_values (its cache, if any, is not a "
            "transformers DynamicCache of attention layers)")
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        raise InvalidArgumentError(f"kvtier.hf does not support {name}: its cache is not a transformers DynamicCache")
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception as e:  # noqa: BLE001  (transformers' own error says which layer type it lacks)
        raise InvalidArgumentError(
            f"kvtier.hf does not support {name}: its cache is not a DynamicCache of attention layers ({e!r})") from e
    types = list(getattr(config, "layer_types", None) or [])
    unsupported: dict[str, list[int]] = {}
    for i, layer in enumerate(layers):
        if type(layer) not in _HELD_LAYERS:
            kind = f"'{types[i]}' layers" if i < len(types) else "layers"
            unsupported.setdefault(f"{kind} ({type(layer).__name__})", []).append(i)
    if unsupported:
        named = "; ".join(f"{kind}: layers {ids}" for kind, ids in unsupported.items())
        raise InvalidArgumentError(
            f"kvtier.hf does not support {name}: its cache has layers that hold no per-token K/V (recurrent, "
            f"convolution or linear-attention state): {named}; kvtier.hf holds full-attention and sliding-window "
            "layers only")
    if len(layers) != config.num_hidden_layers:
        raise InvalidArgumentError(
            f"kvtier.hf does not support {name}: its cache has {len(layers)} layers for {config.num_hidden_layers} "
            "decoder layers (layers sharing K/V)")


def uses_sliding_window(config: Any) -> bool:
    """Whether some layer of the model attends over a sliding window."""
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return True
    types = getattr(config, "layer_types", None)
    if types is None:
        return getattr(config, "sliding_window", None) is not None
    return any(t in ("sliding_attention", "chunked_attention") for t in types)
