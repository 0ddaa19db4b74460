"""kvtier.hf on a GPU: a transformers model on CUDA reads and writes a
cuda-backend kvtierd's GPU tier in place (CUDA IPC), ordered on torch's
stream; and kvtier.paged (the vLLM connector's copies) moving vLLM-shaped
caches device to device. Skips where torch sees no GPU (bench/gpu_check.sh runs it on one)."""

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

from test_hf import prompt, tiny_llama  # noqa: E402

import kvtier.hf  # noqa: E402


@torch.no_grad()
def test_a_gpu_model_reads_and_writes_the_gpu_tier_in_place(make_daemon):
    d = make_daemon(backend="cuda")
    model = tiny_llama(seed=7).cuda()
    client = d.client(model_id=kvtier.hf.model_identity(model))
    assert client.backend == "cuda"
    cache = kvtier.hf.PrefixCache(client, model)
    ids = prompt(7, 31).cuda()
    out = model(ids, past_key_values=cache.load("chat", ids)[0], use_cache=True)
    assert cache.store("chat", ids, out.past_key_values) == 7
    with client.acquire(ids[0].tolist()[:28]) as lease:
        assert [t for t, _ in lease.blocks] == ["gpu"] * 7
        assert all(addr != 0 for _, addr in (lease.address(i) for i in range(7)))

    longer = torch.cat([ids, prompt(8, 5).cuda()], dim=1)
    full = model(longer).logits[0, -1]
    past, cached = cache.load("chat", longer)
    assert cached == 28
    step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)

    # Demoted to the host tier and promoted back: still the same K/V.
    assert client.demote("chat") == 7
    for _ in range(2000):
        if client.session("chat")["host_blocks"] == 7:
            break
    past, cached = cache.load("chat", longer)
    assert cached == 28
    step = model(longer[:, cached:], past_key_values=past, use_cache=True).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC", "BLNHC"])
def test_vllm_paged_blocks_go_device_to_device_through_the_gpu_tier(make_daemon, layout):
    """kvtier.paged (KvtierConnector's copies) with vLLM-shaped caches on the GPU:
    engine A's blocks saved into the GPU tier and loaded into engine B's blocks on
    a side stream; then demoted to the host tier and loaded again, kvtierd
    promoting them ahead of the stream's copies."""
    from test_paged import _layer, exchange, tokens, vllm_cache

    from kvtier.paged import PagedKV, load_blocks

    d = make_daemon(backend="cuda", block_tokens=8)
    stream = torch.cuda.Stream()
    client, a, b = exchange(d, layout, 8, device="cuda", stream=stream)
    assert client.backend == "cuda"
    prompt = tokens(24)
    with client.acquire(prompt) as lease:
        assert [t for t, _ in lease.blocks] == ["gpu"] * 3

    assert client.demote("a") > 0
    for _ in range(2000):
        if client.session("a")["host_blocks"] == 3:
            break
        time.sleep(0.001)
    with client.acquire(prompt, promote=False) as lease:
        assert [t for t, _ in lease.blocks] == ["host"] * 3
    c = PagedKV(vllm_cache(layout, 16, 8, "cuda", seed=3), 8, layout)
    done, chain = load_blocks(client, c, prompt, "c", 0, [4, 6, 8], stream=stream)
    torch.cuda.synchronize()
    assert done == [4, 6, 8] and chain == 3
    for layer in range(2):
        for mine, theirs in ((4, 5), (6, 9), (8, 2)):
            torch.testing.assert_close(_layer(c, layer, mine), _layer(a, layer, theirs), rtol=0, atol=0)
