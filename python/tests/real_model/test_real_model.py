"""The real model through every kvtier surface: kvtier-worker's transformer
against transformers on the same weights and token ids, one model identity
whichever of them computes it, and a tokenizer that is part of that identity.

The model is SmolLM2-135M-Instruct, which scripts/make_model.py makes once per
machine; scripts/test.sh makes it before the suite and hands its directory over
as KVTIER_MODEL_DIR. Nothing is downloaded here: without the directory these
tests fail, saying how to make it."""

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_serve import Service  # noqa: E402

import kvtier.hf  # noqa: E402
from conftest import Daemon  # noqa: E402 - python/tests' helpers

# The smollm2 profile of configs/kvtierd.yaml, with small tiers.
SMOLLM2 = """\
  - name: smollm2
    layers: 30
    kv_heads: 3
    head_dim: 64
    dtype: fp32
    block_tokens: 16
    gpu_blocks: 96
    host_blocks: 256"""


@pytest.fixture(scope="session")
def model_dir():
    d = os.environ.get("KVTIER_MODEL_DIR", "")
    if not d or not os.path.isfile(os.path.join(d, "config.json")):
        pytest.fail(f"KVTIER_MODEL_DIR={d!r} is not the real model's directory: run scripts/make_model.py "
                    "(scripts/test.sh does) and pass the directory it prints")
    return d


@pytest.fixture(scope="session")
def hf_model(model_dir):
    """The model and its tokenizer as transformers loads them (fp32, CPU)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    return model, tokenizer


def chat_ids(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


WORKER = os.environ.get("KVTIER_WORKER", "")
QUESTION = "请用Python写一个快速排序函数。"
FOLLOW_UP = "能加上注释吗？"


def worker(*args):
    if not WORKER:
        pytest.fail("KVTIER_WORKER is not set (CTest sets it to the built kvtier-worker)")
    out = subprocess.run([WORKER, *args], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return out.stdout


def prompts(tokenizer):
    """A few prompts: the seed's question, a two-turn chat, a long English text."""
    story = " ".join(["The cache keeps every block of keys and values it has seen, and a worker that asks for "
                      "a prefix it holds gets it back without computing it again."] * 12)
    return {
        "question": chat_ids(tokenizer, [{"role": "user", "content": QUESTION}]),
        "two_turns": chat_ids(tokenizer, [{"role": "user", "content": QUESTION},
                                          {"role": "assistant", "content": "def quick_sort(a): ..."},
                                          {"role": "user", "content": FOLLOW_UP}]),
        "long_text": tokenizer(story)["input_ids"],
    }


def test_worker_logits_equal_transformers(model_dir, hf_model):
    model, tokenizer = hf_model
    for name, ids in prompts(tokenizer).items():
        got = json.loads(worker("--model", model_dir, "--threads", "2", "--logits", ",".join(map(str, ids))))
        with torch.no_grad():
            want = model(torch.tensor([ids])).logits[0, -1].float()
        assert got["tokens"] == len(ids)
        for key in ("logits", "logits_incremental"):  # One prefill; a prefill and a one-token step.
            logits = torch.tensor(got[key])
            assert logits.shape == want.shape, (name, key)
            diff = (logits - want).abs().max().item()
            assert diff <= 1e-4, f"{name} ({len(ids)} tokens), {key}: max |worker - transformers| = {diff}"
            assert int(logits.argmax()) == int(want.argmax()), (name, key)


def test_worker_and_python_compute_one_identity(model_dir, hf_model):
    model, tokenizer = hf_model
    assert worker("--model", model_dir, "--print-model-id").strip() == kvtier.hf.model_identity(model, tokenizer)


def other_tokenizer_dir(model_dir, tmp_path, hf_model, keep):
    """The model directory with a tokenizer whose vocabulary differs from the
    real one in two entries that none of `keep`'s token ids use."""
    _, tokenizer = hf_model
    d = tmp_path / "SmolLM2-other-tokenizer"
    d.mkdir()
    for f in os.listdir(model_dir):
        if f != "tokenizer.json":
            os.symlink(os.path.join(model_dir, f), d / f)
    tok = json.loads(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8").read())
    vocab = tok["model"]["vocab"]
    used = set(keep)
    a, b = [piece for piece, i in vocab.items() if i > 1000 and i not in used][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return str(d)


def test_the_tokenizer_is_part_of_the_identity(model_dir, hf_model, tmp_path):
    import transformers

    model, tokenizer = hf_model
    messages = [{"role": "user", "content": QUESTION}]
    ids = chat_ids(tokenizer, messages)
    other_dir = other_tokenizer_dir(model_dir, tmp_path, hf_model, ids)
    other = transformers.AutoTokenizer.from_pretrained(other_dir, local_files_only=True)
    # The same prompt is the same token ids under both: only the identity keeps them apart.
    assert chat_ids(other, messages) == ids
    assert other.get_vocab() != tokenizer.get_vocab()
    first = kvtier.hf.model_identity(model, tokenizer)
    second = kvtier.hf.model_identity(model, other)
    assert first != second
    assert worker("--model", other_dir, "--print-model-id").strip() == second

    # Services: one on the real tokenizer, one on the other; same weights, same prompt ids.
    daemon = Daemon(tmp_path, profiles=SMOLLM2)
    services = []
    try:
        services = [Service(model_dir, tmp_path, "real", "--socket", daemon.socket, "--profile", "smollm2"),
                    Service(other_dir, tmp_path, "other", "--socket", daemon.socket, "--profile", "smollm2",
                            "--served-model-name", "SmolLM2-135M-Instruct")]

        def cached(service):
            r = service.client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                                       max_tokens=4, temperature=0)
            return r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens

        assert cached(services[0]) == (len(ids), 0)    # Cold.
        assert cached(services[1]) == (len(ids), 0)    # Same ids, other tokenizer: no hit.
        prompt, hit = cached(services[0])              # The control: the first tokenizer's own blocks.
        assert hit == (len(ids) - 1) // 16 * 16 and hit > 0
        # kvtier-worker on the same directory shares them: one identity.
        out = json.loads(worker("--model", model_dir, "--socket", daemon.socket, "--profile", "smollm2", "--threads", "2",
                                "--output-tokens", "2", "--prompt-tokens", ",".join(map(str, ids))).splitlines()[-1])
        assert out["cached_tokens"] == hit and out["cache_error"] == ""
    finally:
        for s in services:
            s.stop()
        daemon.stop()
