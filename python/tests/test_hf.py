"""kvtier.hf with a real transformers model (a small seeded Llama, built here:
no download) and a real kvtierd: cached prefixes give the same logits and the
same greedy replies as recomputing, in a forward loop and through generate()."""

import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvtier  # noqa: E402
import kvtier.hf  # noqa: E402

BT = 4  # The test profile (conftest.PROFILE): 2 layers x 2 KV heads x 8 dims, fp32.


def tiny_llama(seed=0, layers=2):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=8, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


def cached_llama(daemon, seed=0):
    """A tiny Llama, a client carrying its identity, and a PrefixCache over both."""
    model = tiny_llama(seed=seed)
    client = daemon.client(model_id=kvtier.hf.model_identity(model))
    return model, client, kvtier.hf.PrefixCache(client, model)


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 96, (1, n), generator=g)


@torch.no_grad()
def test_a_forward_loop_over_a_cached_prefix_gives_the_full_passes_logits(daemon):
    model, client, cache = cached_llama(daemon)
    ids = prompt(1, 23)
    past, cached = cache.load("chat", ids)
    assert cached == 0
    out = model(ids, past_key_values=past, use_cache=True)
    assert cache.store("chat", ids, out.past_key_values) == 5  # 23 tokens: 5 full blocks
    assert cache.store("chat", ids, out.past_key_values) == 0  # already held

    longer = torch.cat([ids, prompt(2, 9)], dim=1)
    full = model(longer).logits[0, -1]
    # This object kept the 3 tokens past the last full block; another (in
    # another process, say) finds the 5 blocks kvtierd holds.
    for c, want in ((cache, 23), (kvtier.hf.PrefixCache(client, model), 20),
                    (kvtier.hf.PrefixCache(client, model, tail_sessions=0), 20)):
        past, cached = c.load("chat", longer)
        assert cached == want
        assert past.get_seq_length() == want
        step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
        torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
    assert client.session("chat")["blocks"] == 5
    # A prompt that departs from the history inside the tail gets the blocks only.
    other = torch.cat([ids[:, :21], prompt(3, 9)], dim=1)
    past, cached = cache.load("chat", other)
    assert cached == 20
    step = model(other[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, model(other).logits[0, -1], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_loaded_cache_takes_new_tokens_in_place_then_grows_past_its_room(daemon):
    model, client, cache = cached_llama(daemon, seed=3)
    ids = prompt(5, 23)
    cache.store("chat", ids, model(ids, use_cache=True).past_key_values)
    longer = torch.cat([ids, prompt(6, 9)], dim=1)
    past, cached = cache.load("chat", longer, max_new_tokens=2)
    assert cached == 23  # 5 blocks and the 3-token tail this object kept.
    start = [layer.keys.data_ptr() for layer in past.layers]
    out = model(longer[:, cached:], past_key_values=past, use_cache=True)
    torch.testing.assert_close(out.logits[0, -1], model(longer).logits[0, -1], rtol=1e-5, atol=1e-5)
    seq = longer
    for step in range(3):  # Room for the prompt and two more tokens: the third outgrows it.
        nxt = out.logits[:, -1:].argmax(-1)
        seq = torch.cat([seq, nxt], dim=1)
        out = model(nxt, past_key_values=past, use_cache=True)
        torch.testing.assert_close(out.logits[0, -1], model(seq).logits[0, -1], rtol=1e-5, atol=1e-5)
        in_place = [layer.keys.data_ptr() for layer in past.layers] == start
        assert in_place == (step < 2), f"step {step}"
        assert past.get_seq_length() == seq.size(1)
    assert cache.store("chat", seq, past) == seq.size(1) // BT - 5


@torch.no_grad()
def test_generate_over_kvtier_replies_as_recomputing_does(daemon):
    model, client, cache = cached_llama(daemon, seed=1)
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
    # Same weights, another norm epsilon: other outputs, so another identity.
    a2 = tiny_llama(seed=3)
    a2.config.rms_norm_eps = 1e-5
    assert kvtier.hf.model_identity(a2) != ida
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


def _worker_model(tmp_path):
    """kvtier-worker (skips without it), the weights it saves for WORKER_MODEL, and its identity."""
    import os
    import subprocess

    worker = os.environ.get("KVTIER_WORKER")
    if not worker:
        pytest.skip("built without the C++ model worker")
    weights = tmp_path / "w.safetensors"
    subprocess.run([worker, *WORKER_MODEL, "--save-weights", str(weights)], check=True, capture_output=True)
    identity = subprocess.run([worker, *WORKER_MODEL, "--print-model-id"], check=True, capture_output=True,
                              text=True).stdout.strip()
    return worker, weights, identity


def test_the_cpp_worker_and_python_compute_one_identity_for_one_model(daemon, tmp_path):
    """The same weights give the same identity in the C++ worker and in Python,
    so a Python worker and a C++ worker of one model share blocks."""
    import subprocess

    from safetensors.torch import load_file

    worker, weights, printed = _worker_model(tmp_path)
    ident = kvtier._native.ModelIdentity()
    for name, t in sorted(load_file(str(weights)).items()):
        ident.add_tensor(name, "F32", list(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy())
    # The settings as kvtier.hf reads them from the transformers config of the same model.
    ident.add_config(kvtier.hf.config_settings(_worker_as_hf(weights).config))
    ident.add_tokenizer(WORKER_TOKENIZER)
    assert ident.finish() == printed

    # The worker commits a chat; a Python client of that identity sees its session's model.
    subprocess.run([worker, *WORKER_MODEL, "--cache", "kvtier", "--socket", daemon.socket, "--json",
                    "--sessions", "1", "--turns", "1", "--system-tokens", "20", "--first-tokens", "12",
                    "--user-tokens", "4", "--output-tokens", "2"], check=True, capture_output=True)
    client = daemon.client(model_id=printed)
    sessions = client.sessions()
    assert sessions and all(s["model"] == printed for s in sessions), sessions


@torch.no_grad()
def test_logits_agree_with_an_in_process_cache_and_after_a_round_trip_through_the_host_tier(daemon):
    """Every turn's last logits: no cache, an in-process DynamicCache (the
    starting design), and kvtier, also after the session went to the host tier."""
    model, client, cache = cached_llama(daemon, seed=11)
    local = None
    ids = prompt(30, 9)
    for turn in range(4):
        if turn:
            ids = torch.cat([ids, prompt(30 + turn, 7)], dim=1)
        full = model(ids).logits[0, -1]
        seen = 0 if local is None else local.get_seq_length()
        local_out = model(ids[:, seen:], past_key_values=local, use_cache=True)
        local = local_out.past_key_values
        if turn == 2:
            assert client.demote("chat") > 0
            for _ in range(1000):  # The demotion finishes on kvtierd's mover: wait for it.
                if client.session("chat")["gpu_blocks"] == 0:
                    break
                time.sleep(0.005)
            assert client.session("chat")["gpu_blocks"] == 0
        past, cached = cache.load("chat", ids)
        if turn:
            assert cached > 0
        if turn == 2:
            # Read in the host tier, where they lay; promoted once the load released them.
            session = client.session("chat")
            for _ in range(1000):
                if session["gpu_blocks"] == session["blocks"]:
                    break
                time.sleep(0.005)
                session = client.session("chat")
            assert session["gpu_blocks"] == session["blocks"]
        out = model(ids[:, cached:], past_key_values=past, use_cache=True)
        torch.testing.assert_close(local_out.logits[0, -1], full, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.logits[0, -1], full, rtol=1e-4, atol=1e-4)
        cache.store("chat", ids, out.past_key_values)


@torch.no_grad()
def test_a_qwen2_model_works_too(daemon):
    torch.manual_seed(12)
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.Qwen2ForCausalLM(config).eval()
    cache = kvtier.hf.PrefixCache(daemon.client(model_id=kvtier.hf.model_identity(model)), model)
    ids = prompt(40, 14)
    cache.store("q", ids, model(ids, use_cache=True).past_key_values)
    longer = torch.cat([ids, prompt(41, 3)], dim=1)
    past, cached = cache.load("q", longer)
    assert cached == 14  # 3 blocks and the 2-token tail this object kept.
    torch.testing.assert_close(model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1],
                               model(longer).logits[0, -1], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_daemon_that_goes_away_mid_chat_means_recomputing_not_failing(tmp_path):
    from conftest import Daemon

    model = tiny_llama(seed=13)
    d = Daemon(tmp_path)
    try:
        client = d.client(model_id=kvtier.hf.model_identity(model), connect_timeout=0.5)
        cache = kvtier.hf.PrefixCache(client, model)
        ids = prompt(50, 13)
        cache.store("c", ids, model(ids, use_cache=True).past_key_values)
        assert cache.load("c", ids)[1] == 12
        d.stop()
        longer = torch.cat([ids, prompt(51, 4)], dim=1)
        past, cached = cache.load("c", longer)  # Warns; no exception.
        assert cached == 0
        out = model(longer, past_key_values=past, use_cache=True)
        assert cache.store("c", longer, out.past_key_values) == 0
        torch.testing.assert_close(out.logits[0, -1], model(longer).logits[0, -1])
        d = Daemon(tmp_path)  # A fresh kvtierd on the same socket: the client reconnects.
        assert cache.store("c", longer, out.past_key_values) == 4
        assert cache.load("c", longer)[1] == 16
    finally:
        d.stop()


WORKER_SCRIPT = """
import sys, torch, kvtier, kvtier.hf
sys.path.insert(0, {tests!r})
from test_hf import prompt, tiny_llama
model = tiny_llama(seed=14)
cache = kvtier.hf.PrefixCache(kvtier.Client(socket={socket!r}, model_id=kvtier.hf.model_identity(model)), model)
ids = torch.cat([prompt(60, 18), prompt(61, 5)], dim=1)  # The shared system prompt, then its own user turn.
with torch.no_grad():
    past, cached = cache.load("worker-1", ids)
    out = model(ids[:, cached:], past_key_values=past, use_cache=True)
print(cached, cache.store("worker-1", ids, out.past_key_values))
"""


@torch.no_grad()
def test_a_second_worker_process_hits_the_system_prompt_the_first_computed(daemon):
    import os
    import subprocess
    import sys

    script = WORKER_SCRIPT.format(tests=os.path.dirname(__file__), socket=daemon.socket)
    first = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert first.stdout.split() == ["0", "5"], first.stdout + first.stderr  # 23 tokens: 5 full blocks
    model = tiny_llama(seed=14)
    cache = kvtier.hf.PrefixCache(daemon.client(model_id=kvtier.hf.model_identity(model)), model)
    ids = torch.cat([prompt(60, 18), prompt(62, 6)], dim=1)  # Same system prompt, another user.
    past, cached = cache.load("worker-2", ids)
    assert cached == 16, "the system prompt's 4 full blocks, computed by the other process"
    torch.testing.assert_close(model(ids[:, cached:], past_key_values=past, use_cache=True).logits[0, -1],
                               model(ids).logits[0, -1], rtol=1e-4, atol=1e-4)


def _worker_as_hf(weights):
    """kvtier-worker's model (WORKER_MODEL) as a transformers Llama, from the weights it saved."""
    from safetensors.torch import load_file

    config = transformers.LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


@torch.no_grad()
def test_a_prefix_the_cpp_worker_committed_is_read_from_python(daemon, tmp_path):
    """kvtier-worker computes and commits a prompt's K/V; a transformers model of
    the same weights (and identity) loads that prefix and gets the logits of its
    own full pass: the C++ worker's cache is the Hugging Face model's. Under
    another identity the prefix is a miss."""
    import subprocess

    worker, weights, identity = _worker_model(tmp_path)
    tokens = [256] + list(b"kvtier shares one GPU tier between worker processes.")  # BOS + bytes: 53 tokens
    served = subprocess.run([worker, *WORKER_MODEL, "--cache", "kvtier", "--socket", daemon.socket,
                             "--prompt-tokens", ",".join(map(str, tokens)), "--prompt-session", "from-cpp",
                             "--output-tokens", "1"], check=True, capture_output=True, text=True)
    assert '"committed_blocks":13' in served.stdout, served.stdout  # 53 tokens: 13 full 4-token blocks

    model = _worker_as_hf(weights)
    ids = torch.tensor([tokens + [101, 102, 103]])
    cache = kvtier.hf.PrefixCache(daemon.client(model_id=identity), model)
    past, cached = cache.load("from-python", ids)
    assert cached == 52
    step = model(ids[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, model(ids).logits[0, -1], rtol=1e-4, atol=1e-4)
    # The K/V themselves: what the worker wrote is what transformers computes.
    reference = model(ids[:, :cached], use_cache=True).past_key_values
    for layer in range(2):
        for mine, theirs in zip(kvtier.hf._layer_kv(past, layer), kvtier.hf._layer_kv(reference, layer)):
            torch.testing.assert_close(mine[..., :cached, :], theirs, rtol=1e-4, atol=1e-4)

    other = kvtier.hf.PrefixCache(daemon.client(model_id="ab" * 16), model)
    assert other.load("elsewhere", ids)[1] == 0


@torch.no_grad()
def test_a_session_past_the_daemons_length_limit_is_served_not_cached(make_daemon):
    d = make_daemon("limits:\n  max_session_blocks: 2\n")
    model = tiny_llama(seed=15)
    cache = kvtier.hf.PrefixCache(d.client(model_id=kvtier.hf.model_identity(model)), model)
    ids = prompt(70, 17)
    out = model(ids, use_cache=True)
    assert cache.store("long", ids, out.past_key_values) == 0  # 4 blocks > 2: refused, warned, no exception
    assert cache.load("long", ids)[1] == 0
    short = ids[:, :9]
    assert cache.store("short", short, model(short, use_cache=True).past_key_values) == 2


def test_the_identity_settings_are_spelled_as_before_for_a_llama_and_name_a_gpt2s_own():
    """A Llama's settings text is the one identities were made with (changing it
    would orphan every cached block); GPT-2's has its LayerNorm and no rotary lines."""
    assert kvtier.hf.config_settings(tiny_llama().config) == (
        "model_type=llama\nhidden_act=silu\nrms_norm_eps=1e-06\nrope_theta=10000\nrope_type=default\n")
    assert kvtier.hf.config_settings(tiny_gpt2().config) == "model_type=gpt2\nhidden_act=gelu_new\nlayer_norm_eps=1e-05\n"
    assert kvtier._native.model_settings_text("llama", rms_norm_eps=1e-5, rope_theta=1e4, rope_type="default") == (
        "model_type=llama\nhidden_act=silu\nrms_norm_eps=1e-05\nrope_theta=10000\nrope_type=default\n")


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=96, n_embd=16, n_head=2, n_layer=2, n_positions=256,
                                     bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(config).eval()


@torch.no_grad()
def test_a_gpt2_model_caches_its_prefix_and_reuses_it_with_the_logits_of_recomputing(daemon):
    model = tiny_gpt2(seed=21)
    client = daemon.client(model_id=kvtier.hf.model_identity(model))
    cache = kvtier.hf.PrefixCache(client, model)
    ids = prompt(80, 19)
    past, cached = cache.load("g", ids)
    assert cached == 0
    out = model(ids, past_key_values=past, use_cache=True)
    assert cache.store("g", ids, out.past_key_values) == 4  # 19 tokens: 4 full blocks
    longer = torch.cat([ids, prompt(81, 6)], dim=1)
    for c, want in ((cache, 19), (kvtier.hf.PrefixCache(client, model, tail_sessions=0), 16)):
        past, cached = c.load("g", longer)
        assert cached == want
        step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
        torch.testing.assert_close(step, model(longer).logits[0, -1], rtol=1e-5, atol=1e-5)
    past, cached = cache.load("g", longer)
    got = model.generate(longer, past_key_values=past, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, model.generate(longer, max_new_tokens=4, do_sample=False))
    assert kvtier.hf.model_identity(model) != kvtier.hf.model_identity(tiny_gpt2(seed=22))


@torch.no_grad()
def test_a_sliding_window_model_past_its_window_reuses_its_prefix_with_the_logits_of_recomputing(daemon):
    torch.manual_seed(23)
    config = transformers.MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                        max_position_embeddings=256, sliding_window=6)
    model = transformers.MistralForCausalLM(config).eval()
    assert "sliding_window=6" in kvtier.hf.config_settings(model.config)
    cache = kvtier.hf.PrefixCache(daemon.client(model_id=kvtier.hf.model_identity(model)), model)
    ids = prompt(90, 15)
    past, cached = cache.load("w", ids)  # Its cache keeps every token (the mask applies the window).
    out = model(ids, past_key_values=past, use_cache=True)
    assert cache.store("w", ids, out.past_key_values) == 3
    longer = torch.cat([ids, prompt(91, 6)], dim=1)
    for tails in (64, 0):
        past, cached = kvtier.hf.PrefixCache(cache.client, model, tail_sessions=tails).load("w", longer)
        assert cached == 12
        step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
        torch.testing.assert_close(step, model(longer).logits[0, -1], rtol=1e-5, atol=1e-5)
    # The model's own cache past the window dropped its first tokens: nothing to commit, no wrong bytes.
    assert cache.store("w2", longer, model(longer, use_cache=True).past_key_values) == 0


def _lfm2():
    return transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["conv", "full_attention"]))


def _qwen3_next():
    return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"],
        linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16))


def _deepseek_v3():
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=2, num_experts_per_tok=1, first_k_dense_replace=2,
        n_group=1, topk_group=1))


def _mamba():
    return transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=96, hidden_size=32,
                                                                  num_hidden_layers=2, state_size=4))


@pytest.mark.parametrize("make, named", [
    (_lfm2, "'conv' layers (LinearAttentionLayer): layers [0]"),
    (_qwen3_next, "'linear_attention' layers (LinearAttentionLayer): layers [0]"),
    (_deepseek_v3, "multi-head latent attention (MLA"),
    (_mamba, "takes no past_key_values"),
], ids=["lfm2-conv", "qwen3-next-linear-attention", "deepseek-v3-mla", "mamba"])
def test_a_model_whose_cache_kvtier_cannot_hold_is_refused_naming_what(daemon, make, named):
    model = make().eval()
    with pytest.raises(kvtier.InvalidArgumentError) as e:
        kvtier.hf.PrefixCache(daemon.client(), model)
    assert "kvtier.hf does not support model" in str(e.value) and named in str(e.value), str(e.value)


def test_the_services_older_link_call_still_connects(daemon):
    """kvtier.serve.KvtierLink.prefix_cache() (before the link had a thread of its
    own) still connects and gives the PrefixCache; it is deprecated for start()
    and usable()."""
    pytest.importorskip("fastapi")
    from kvtier.serve.cache import KvtierLink

    model = tiny_llama()
    link = KvtierLink(model, kvtier.hf.model_identity(model), "tiny", daemon.socket)
    try:
        with pytest.warns(DeprecationWarning):
            cache = link.prefix_cache()
        assert isinstance(cache, kvtier.hf.PrefixCache) and link.connected() and link.usable() is cache
    finally:
        link.link.close()
