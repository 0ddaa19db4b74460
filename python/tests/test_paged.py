"""kvtier.paged: vLLM-shaped paged KV caches (each of vLLM's physical layouts)
written to a real kvtierd by one "engine" and read back into another's blocks.
The same tests run on a GPU against a cuda-backend kvtierd (test_gpu.py)."""

import pytest

torch = pytest.importorskip("torch")

import kvtier  # noqa: E402
from kvtier.paged import PagedKV, load_blocks, save_blocks  # noqa: E402

# vLLM's KV cache layouts: the physical order of the logical axes [L, B, H, N, C].
LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
}
# Not one dense page per block and layer: refused.
SCATTERED = {"LHBNC": (0, 2, 1, 3, 4), "BHLNC": (1, 2, 0, 3, 4)}

LAYERS, HEADS, DIM = 2, 2, 8  # conftest's profile "py": 4-token blocks.


def vllm_cache(layout, blocks, block_size, device="cpu", seed=0, separate=False):
    """Per-layer views [blocks, heads, block_size, 2 x dim] of one buffer laid out
    as `layout` (or, separate: one buffer per layer), filled with random values."""
    order = {**LAYOUTS, **SCATTERED}[layout]
    shape = (LAYERS, blocks, HEADS, block_size, 2 * DIM)
    g = torch.Generator().manual_seed(seed)
    if separate:
        per = [torch.randn(shape[1:], generator=g).to(device) for _ in range(LAYERS)]
        return per
    buf = torch.randn([shape[d] for d in order], generator=g).to(device)
    t = buf.permute(*[order.index(i) for i in range(5)])
    return [t[layer] for layer in range(LAYERS)]


def tokens(n, base=1000):
    return [base + i for i in range(n)]


def exchange(d, layout, block_size, device="cpu", separate=False, stream=None):
    """d: a kvtierd whose profile's blocks are block_size tokens (one kvtier block per engine block)."""
    client = d.client()
    assert client.block_tokens == block_size
    a = PagedKV(vllm_cache(layout, 16, block_size, device, seed=1, separate=separate), block_size, layout)
    b = PagedKV(vllm_cache(layout, 16, block_size, device, seed=2, separate=separate), block_size, layout)
    prompt = tokens(3 * block_size)
    # Engine A computed the prompt's three blocks into its blocks 5, 9, 2.
    have, stored = save_blocks(client, a, prompt, "a", [5, 9, 2], stream=stream)
    assert (have, stored) == (3, 3)
    assert client.probe(prompt) == 3
    # Saved again (another request, the same prefix): nothing is written.
    assert save_blocks(client, a, prompt, "a2", [5, 9, 2], stream=stream)[1] == 0
    # Engine B has the first block itself and loads the other two into its 11 and 0.
    done, chain = load_blocks(client, b, prompt, "b", 1, [11, 0], stream=stream)
    if device != "cpu":
        torch.cuda.synchronize()
    assert done == [11, 0] and chain == 3
    for layer in range(LAYERS):
        torch.testing.assert_close(b._views and _layer(b, layer, 11), _layer(a, layer, 9), rtol=0, atol=0)
        torch.testing.assert_close(_layer(b, layer, 0), _layer(a, layer, 2), rtol=0, atol=0)
        assert not torch.equal(_layer(b, layer, 1), _layer(a, layer, 1))  # Untouched.
    # B then computes a fourth block (its 12) and saves on from the chain it loaded.
    longer = prompt + tokens(block_size, base=5000)
    assert save_blocks(client, b, longer, "b", [3, 11, 0, 12], have=chain, stream=stream) == (4, 1)
    # A loads all four, including B's, into fresh blocks.
    done, _ = load_blocks(client, a, longer, "a3", 0, [13, 14, 15, 7], stream=stream)
    if device != "cpu":
        torch.cuda.synchronize()
    assert done == [13, 14, 15, 7]
    for layer in range(LAYERS):
        torch.testing.assert_close(_layer(a, layer, 7), _layer(b, layer, 12), rtol=0, atol=0)
        torch.testing.assert_close(_layer(a, layer, 13), _layer(a, layer, 5), rtol=0, atol=0)
    return client, a, b


def _layer(paged, layer, block):
    """Layer `layer` of engine block `block`, as the bytes it holds."""
    for first, v in paged._views:
        if first <= layer < first + v.shape[0]:
            return v[layer - first, block].clone()
    raise AssertionError(layer)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("block_size", [4, 8])
def test_each_dense_layout_round_trips_through_kvtierd(make_daemon, layout, block_size):
    d = make_daemon(head_dim=DIM, block_tokens=block_size)
    _, a, _ = exchange(d, layout, block_size)
    assert len(a._views) == 1  # One buffer: every layer is one strided view.


def test_layers_in_separate_buffers_round_trip(make_daemon):
    d = make_daemon(head_dim=DIM, block_tokens=8)
    _, a, _ = exchange(d, "LBHNC", 8, separate=True)
    assert len(a._views) == LAYERS


def test_a_profile_whose_blocks_are_not_the_engines_is_refused_naming_both(make_daemon):
    """One kvtier block is one engine block: a profile of 4-token blocks cannot
    hold an engine's 8-token blocks (in pieces, a piece of a heads-first page
    would hold some heads of all 8 tokens under a key of 4)."""
    d = make_daemon(head_dim=DIM, block_tokens=4)
    client = d.client()
    a = PagedKV(vllm_cache("LBHNC", 4, 8), 8, "LBHNC")
    why = a.mismatch(client.profile)
    assert why is not None and "one engine block, 8 tokens, not 4" in why and "block_tokens: 8" in why, why
    with pytest.raises(kvtier.FailedPreconditionError, match="8 tokens, not 4"):
        save_blocks(client, a, tokens(16), "a", [0, 1])
    assert client.probe(tokens(16)) == 0  # Nothing was committed.
    with pytest.raises(kvtier.FailedPreconditionError, match="8 tokens, not 4"):
        load_blocks(client, a, tokens(16), "b", 0, [0, 1])
    assert client.stats()["leased_slots"] == 0 and client.stats()["read_leases"] == 0


@pytest.mark.parametrize("layout", sorted(SCATTERED))
def test_a_layout_without_dense_pages_is_refused_by_name(layout):
    with pytest.raises(ValueError, match=f"unsupported KV cache layout {layout}"):
        PagedKV(vllm_cache(layout, 4, 8), 8, layout)


def test_a_block_size_that_is_not_the_tensors_is_refused():
    with pytest.raises(ValueError, match=r"expected \[blocks, kv_heads, 16, 2 x head_dim\]"):
        PagedKV(vllm_cache("LBHNC", 4, 8), 16, "LBHNC")


def test_a_load_fills_only_what_kvtierd_holds(make_daemon):
    d = make_daemon(head_dim=DIM, block_tokens=8)
    client = d.client()
    a = PagedKV(vllm_cache("LBNHC", 8, 8, seed=1), 8, "LBNHC")
    b = PagedKV(vllm_cache("LBNHC", 8, 8, seed=2), 8, "LBNHC")
    prompt = tokens(24)
    save_blocks(client, a, prompt[:8], "a", [4])
    timings: dict = {}
    done, chain = load_blocks(client, b, prompt, "b", 0, [1, 2, 3], timings=timings)
    assert done == [1] and chain == 1
    torch.testing.assert_close(_layer(b, 0, 1), _layer(a, 0, 4), rtol=0, atol=0)
    # Where the load's time went, stage by stage (the connector's debug log).
    assert list(timings) == ["acquire", "wait", "copy", "release"] and all(v >= 0 for v in timings.values())


def test_a_save_writes_whole_blocks_from_the_first_one_kvtierd_lacks(make_daemon):
    """Two prompts share a prefix that ends inside their second block: the first
    saves both its blocks; the second finds only block 0 cached, adopts it, and
    writes its own block 1 whole, under a key of its own tokens. A third engine
    asking for the second prompt loads the second prompt's bytes, never a mix."""
    d = make_daemon(head_dim=DIM, block_tokens=8)
    client = d.client()
    x = PagedKV(vllm_cache("LBHNC", 4, 8, seed=1), 8, "LBHNC")
    y = PagedKV(vllm_cache("LBHNC", 4, 8, seed=2), 8, "LBHNC")
    shared = tokens(12)
    px, py = shared + tokens(4, base=7000), shared + tokens(4, base=8000)
    assert save_blocks(client, x, px, "x", [0, 1]) == (2, 2)
    assert client.probe(py) == 1  # Block 0 only: block 1's tokens differ after the shared 12.
    assert save_blocks(client, y, py, "y", [2, 3]) == (2, 1)
    assert client.session("y")["blocks"] == 2
    z = PagedKV(vllm_cache("LBHNC", 4, 8, seed=3), 8, "LBHNC")
    done, _ = load_blocks(client, z, py, "z", 0, [0, 1])
    assert done == [0, 1]
    for layer in range(LAYERS):
        torch.testing.assert_close(_layer(z, layer, 0), _layer(x, layer, 0), rtol=0, atol=0)
        torch.testing.assert_close(_layer(z, layer, 1), _layer(y, layer, 3), rtol=0, atol=0)


def test_a_load_from_a_kvtierd_gone_raises_and_fills_nothing(make_daemon):
    d = make_daemon(head_dim=DIM)
    client = d.client()
    a = PagedKV(vllm_cache("LBHNC", 4, 4, seed=1), 4, "LBHNC")
    save_blocks(client, a, tokens(4), "a", [0])
    d.stop()
    with pytest.raises(kvtier.Error):
        load_blocks(client, a, tokens(4), "b", 0, [1])


def test_calls_written_against_the_older_api_still_work(make_daemon):
    """Before a kvtier block was one engine block, copy_in/copy_out took a piece and
    a piece count, and pieces() said how many: a whole block (piece 0 of 1) still
    copies, pieces() still answers (deprecated), and a real piece is refused."""
    d = make_daemon(head_dim=DIM, block_tokens=8)
    client = d.client()
    a = PagedKV(vllm_cache("LBHNC", 4, 8, seed=1), 8, "LBHNC")
    b = PagedKV(vllm_cache("LBHNC", 4, 8, seed=2), 8, "LBHNC")
    with pytest.warns(DeprecationWarning):
        assert a.pieces(client.block_tokens) == 1
    with client.allocate(1) as w:
        from kvtier._tensors import block_tensor

        dst = block_tensor(client, w, 0, writable=True)
        a.copy_out(dst, 2, 0, 1)
        b.copy_in(dst, 3, 0, 1)
        for layer in range(LAYERS):
            torch.testing.assert_close(_layer(b, layer, 3), _layer(a, layer, 2), rtol=0, atol=0)
        with pytest.raises(ValueError, match="copied whole"):
            a.copy_out(dst, 2, 1, 2)


def _threads() -> int:
    import os
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="torch runs one thread here: no team to start")
def test_a_save_copy_on_a_thread_of_its_own_starts_no_openmp_team():
    """kvtier.vllm saves on a thread of its own. torch's parallel copy there
    started a second OpenMP team beside the engine's; libgomp, with more threads
    than cores, then stops letting threads spin at barriers, and a vLLM CPU
    engine decoded 13% slower with the connector than without it. A save's CPU
    copy is plain memmoves: the thread count stays as it is, and the bytes are
    the engine block's."""
    import threading

    layers = [torch.randn(6, 4, 64, 256) for _ in range(16)]  # A block: 16 x 65,536 elements, past torch's grain.
    paged = PagedKV(layers, 64)
    torch.ones(1 << 20).add_(1)  # The main thread's own team exists first, as an engine's does.
    dst = torch.zeros(16, 4 * 64 * 256)
    before = []

    def save():
        before.append(_threads())
        paged.copy_out(dst, 3)
        before.append(_threads())

    t = threading.Thread(target=save)
    t.start()
    t.join()
    assert before[1] == before[0], "the copy started threads (an OpenMP team) on the saving thread"
    for i, layer in enumerate(layers):
        assert torch.equal(dst[i], layer[3].flatten())
