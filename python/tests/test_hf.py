"""kvtier.hf with a real transformers model (a small seeded Llama, built here:
no download) and a real kvtierd: cached prefixes give the same logits and the
same greedy replies as recomputing, in a forward loop and through generate()."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvtier  # noqa: E402
import kvtier.hf  # noqa: E402

BT = 4  # The test profile (conftest.CONFIG): 2 layers x 2 KV heads x 8 dims, fp32.


def tiny_llama(seed=0, layers=2):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=8, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 96, (1, n), generator=g)


@torch.no_grad()
def test_a_forward_loop_over_a_cached_prefix_gives_the_full_passes_logits(daemon):
    model = tiny_llama()
    client = daemon.client(model_id=kvtier.hf.model_identity(model))
    cache = kvtier.hf.PrefixCache(client, model)
    ids = prompt(1, 23)
    past, cached = cache.load("chat", ids)
    assert cached == 0
    out = model(ids, past_key_values=past, use_cache=True)
    assert cache.store("chat", ids, out.past_key_values) == 5  # 23 tokens: 5 full blocks
    assert cache.store("chat", ids, out.past_key_values) == 0  # already held

    longer = torch.cat([ids, prompt(2, 9)], dim=1)
    full = model(longer).logits[0, -1]
    past, cached = cache.load("chat", longer)
    assert cached == 20
    assert past.get_seq_length() == 20
    step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
    assert client.session("chat")["blocks"] == 5


@torch.no_grad()
def test_generate_over_kvtier_replies_as_recomputing_does(daemon):
    model = tiny_llama(seed=1)
    client = daemon.client(model_id=kvtier.hf.model_identity(model))
    cache = kvtier.hf.PrefixCache(client, model)
    history = prompt(10, 11)
    for turn in range(3):
        ids = torch.cat([history, prompt(20 + turn, 6)], dim=1)
        reference = model.generate(ids, max_new_tokens=5, do_sample=False)
        past, cached = cache.load("chat", ids)
        if turn > 0:
            assert cached >= (history.size(1) // BT) * BT - BT, f"turn {turn}: {cached} cached"
            assert cached > 0
        got = model.generate(ids, past_key_values=past, max_new_tokens=5, do_sample=False)
        assert torch.equal(got, reference), f"turn {turn}"
        cache.store("chat", got, past)
        history = got


@torch.no_grad()
def test_another_models_blocks_are_never_loaded(daemon):
    a, b = tiny_llama(seed=3), tiny_llama(seed=4)
    ida, idb = kvtier.hf.model_identity(a), kvtier.hf.model_identity(b)
    assert ida != idb and ida == kvtier.hf.model_identity(tiny_llama(seed=3))
    ca = kvtier.hf.PrefixCache(daemon.client(model_id=ida), a)
    cb = kvtier.hf.PrefixCache(daemon.client(model_id=idb), b)
    ids = prompt(5, 17)
    ca.store("s", ids, a(ids, use_cache=True).past_key_values)
    assert ca.load("s2", ids)[1] == 16
    assert cb.load("s3", ids)[1] == 0


def test_a_model_that_does_not_fit_the_profile_is_refused_naming_both(daemon):
    model = tiny_llama(layers=3)
    with pytest.raises(kvtier.FailedPreconditionError) as e:
        kvtier.hf.PrefixCache(daemon.client(), model)
    assert "'layers': 3" in str(e.value) and "'layers': 2" in str(e.value)


# kvtier-worker's byte-level tokenizer, as its model identity describes it
# (model_worker/src/tokenizer.h, kTokenizerDescription).
WORKER_TOKENIZER = b"kvtier byte-level tokenizer v1: token = byte value 0-255, 256 = bos, 257 = end of turn"
# A kvtier-worker model of the test profile's geometry.
WORKER_MODEL = ["--set", "layers=2", "--set", "hidden=32", "--set", "heads=4", "--set", "kv_heads=2",
                "--set", "head_dim=8", "--set", "intermediate=64", "--set", "seed=5"]


def test_the_cpp_worker_and_python_compute_one_identity_for_one_model(daemon, tmp_path):
    """The same weights give the same identity in the C++ worker and in Python,
    so a Python worker and a C++ worker of one model share blocks."""
    import os
    import subprocess

    from safetensors.torch import load_file

    worker = os.environ.get("KVTIER_WORKER")
    if not worker:
        pytest.skip("built without the C++ model worker")
    weights = tmp_path / "w.safetensors"
    subprocess.run([worker, *WORKER_MODEL, "--save-weights", str(weights)], check=True, capture_output=True)
    printed = subprocess.run([worker, *WORKER_MODEL, "--print-model-id"], check=True, capture_output=True,
                             text=True).stdout.strip()
    ident = kvtier._native.ModelIdentity()
    for name, t in sorted(load_file(str(weights)).items()):
        ident.add_tensor(name, "F32", list(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy())
    ident.add_tokenizer(WORKER_TOKENIZER)
    assert ident.finish() == printed

    # The worker commits a chat; a Python client of that identity sees its session's model.
    subprocess.run([worker, *WORKER_MODEL, "--cache", "kvtier", "--socket", daemon.socket, "--json",
                    "--sessions", "1", "--turns", "1", "--system-tokens", "20", "--first-tokens", "12",
                    "--user-tokens", "4", "--output-tokens", "2"], check=True, capture_output=True)
    client = daemon.client(model_id=printed)
    sessions = client.sessions()
    assert sessions and all(s["model"] == printed for s in sessions), sessions
