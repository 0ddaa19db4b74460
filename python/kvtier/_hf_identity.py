"""A transformers model's kvtier identity (kvtier/model_identity.h): its
weights, the architecture settings that change its outputs, its tokenizer.

The settings' text is spelled once, in C++ (ModelSettingsText, reached here
through kvtier._native.model_settings_text), which kvtier-worker calls too:
this module only reads the values from a Hugging Face config.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ._hf_model import DTYPES, uses_sliding_window
from ._native import ModelIdentity, model_settings_text


def tokenizer_description(tokenizer: Any) -> bytes:
    """What the model identity says of a tokenizer: its tokenizer.json, or its vocabulary."""
    if tokenizer is None:
        return b"none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.to_str().encode()
    return json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()


def _first(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def config_settings(config: Any) -> str:
    """The architecture settings the model identity covers, read from a
    transformers config: its model type, activation, norm epsilon (RMS or
    LayerNorm), rotary embedding (where it has one) and sliding window (where
    it uses one)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    rope = _first(text, "rope_parameters", "rope_scaling") or {}
    theta = _first(text, "rope_theta") or rope.get("rope_theta")
    rotary = theta is not None or bool(rope)
    rms = _first(text, "rms_norm_eps")
    layer_norm = None if rms is not None else _first(text, "layer_norm_epsilon", "layer_norm_eps")
    return model_settings_text(
        config.model_type,
        hidden_act=str(_first(text, "hidden_act", "activation_function") or "silu"),
        rms_norm_eps=None if rms is None else float(rms),
        layer_norm_eps=None if layer_norm is None else float(layer_norm),
        rope_theta=float(theta if theta is not None else 10000.0) if rotary else None,
        rope_type=str(rope.get("rope_type", rope.get("type", "default"))) if rotary else None,
        sliding_window=int(text.sliding_window) if uses_sliding_window(text) else None,
    )


def model_identity(model: Any, tokenizer: Any = None) -> str:
    """The model's identity (kvtier/model_identity.h): its weights, in name
    order, the architecture settings that change its outputs, and its
    tokenizer. 32 hex digits; equal for an equal model whichever kvtier worker
    computes it."""
    ident = ModelIdentity()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        dtype = DTYPES.get(t.dtype, (None, str(t.dtype).replace("torch.", "").upper()))[1]
        ident.add_tensor(name, dtype, list(t.shape), t.reshape(-1).view(torch.uint8).numpy())
    ident.add_config(config_settings(model.config))
    ident.add_tokenizer(tokenizer_description(tokenizer))
    return ident.finish()
