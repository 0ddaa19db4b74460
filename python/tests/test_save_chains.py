"""kvtier.vllm's saves (kvtier._vllm_saver.Chains, no vLLM needed) against a
real kvtierd: a request's saves while it decodes are one round trip each and
send only the new blocks, however long the context; a prefix kvtierd caches
under another session is adopted by its last key; and the long way (acquire,
allocate, commit) is taken, with the same bytes, when part of that prefix is
gone or the kept lease has grown stale."""

import time

import pytest

torch = pytest.importorskip("torch")

import kvtier  # noqa: E402
from kvtier._vllm_saver import Chains  # noqa: E402
from kvtier.paged import PagedKV, load_blocks  # noqa: E402

LAYERS, HEADS, DIM, BT = 2, 2, 8, 4  # conftest's profile "py".
# Calls that are a round trip to kvtierd (probe and keys are not: the shared index, local hashing).
ROUND_TRIPS = {"allocate", "save", "commit", "acquire", "release", "locate"}


class Counted:
    """A client whose calls are counted (name -> [arguments]); the rest forwards to the real one."""

    def __init__(self, client, on_probe=None):
        self._client = client
        self._on_probe = on_probe
        self.calls: dict[str, list] = {}

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kw):
            self.calls.setdefault(name, []).append(args)
            out = attr(*args, **kw)
            if name == "probe" and self._on_probe is not None:
                self._on_probe()
            return out

        return call

    def trips(self):
        return {k: len(v) for k, v in self.calls.items() if k in ROUND_TRIPS}


def engine(blocks, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(LAYERS, blocks, HEADS, BT, 2 * DIM, generator=g)
    return PagedKV([t[layer] for layer in range(LAYERS)], BT, "LBHNC")


def tokens(n, base=1000):
    return [base + i for i in range(n)]


def page(paged, layer, block):
    return paged._views[0][1][layer, block].clone()


def expect_blocks(client, src, prompt, blocks):
    """A fresh engine loads `prompt` from kvtierd: its blocks hold src's engine blocks `blocks`."""
    dst = engine(len(blocks) + 1, seed=99)
    done, _ = load_blocks(client, dst, prompt, f"check-{time.monotonic_ns()}", 0, list(range(len(blocks))))
    assert done == list(range(len(blocks)))
    for i, b in enumerate(blocks):
        for layer in range(LAYERS):
            torch.testing.assert_close(page(dst, layer, i), page(src, layer, b), rtol=0, atol=0)


def test_decode_saves_are_one_round_trip_each_and_send_only_the_new_block(make_daemon):
    d = make_daemon(head_dim=DIM, block_tokens=BT)
    client = Counted(d.client())
    a = engine(40, seed=1)
    chains = Chains(refill=2)
    prompt = tokens(16 * BT)
    # The prefill: 16 blocks, a new lease for them.
    assert chains.save(client, a, prompt, "s", "r", list(range(16))) == 16
    assert client.trips() == {"allocate": 1, "save": 1}
    client.calls.clear()
    # Decode: a block completes every BT tokens; each save is one call with BT tokens.
    for n in range(17, 33):
        prompt = prompt + tokens(BT, base=5000 + n * BT)
        assert chains.save(client, a, prompt, "s", "r", list(range(n))) == 1
    assert client.trips() == {"save": 16}
    assert {len(args[2]) for args in client.calls["save"]} == {BT}, "only the new block's tokens travel"
    assert "keys" not in client.calls and "probe" not in client.calls, "nothing hashes the prefix again"
    assert d.client().session("s")["blocks"] == 32
    expect_blocks(d.client(), a, prompt, list(range(32)))


def test_a_prefix_cached_under_another_session_is_adopted_by_its_last_key(make_daemon):
    d = make_daemon(head_dim=DIM, block_tokens=BT)
    a, b = engine(8, seed=1), engine(8, seed=2)
    shared = tokens(3 * BT)
    Chains().save(d.client(), a, shared, "a", "ra", [0, 1, 2])
    # Engine B had the prefix in its own cache (no load) and computed one block more.
    client = Counted(d.client())
    longer = shared + tokens(BT, base=7000)
    assert Chains().save(client, b, longer, "b", "rb", [4, 5, 6, 7]) == 1
    assert client.trips() == {"allocate": 1, "save": 1}, "no acquire and release to adopt the prefix"
    assert d.client().session("b")["blocks"] == 4
    expect_blocks(d.client(), a, shared, [0, 1, 2])
    dst = engine(5, seed=3)
    assert load_blocks(d.client(), dst, longer, "z", 3, [4])[0] == [4]
    torch.testing.assert_close(page(dst, 0, 4), page(b, 0, 7), rtol=0, atol=0)


def test_a_prefix_evicted_before_the_save_takes_the_long_way_with_the_same_bytes(make_daemon):
    d = make_daemon(head_dim=DIM, block_tokens=BT)
    admin = d.client()
    a, b = engine(8, seed=1), engine(8, seed=2)
    shared = tokens(3 * BT)
    Chains().save(admin, a, shared, "a", "ra", [0, 1, 2])
    # Between B's probe (which finds A's three blocks) and its save, they are evicted.
    client = Counted(d.client(), on_probe=lambda: admin.evict("a") if admin.probe(shared) else None)
    longer = shared + tokens(BT, base=7000)
    assert Chains().save(client, b, longer, "b", "rb", [4, 5, 6, 7]) == 4
    assert client.calls["save"] and client.trips().get("commit") == 1, "the one-trip save was refused, then committed"
    assert d.client().session("b")["blocks"] == 4
    expect_blocks(d.client(), b, longer, [4, 5, 6, 7])


def test_a_kept_lease_past_half_the_lease_timeout_is_never_written(make_daemon):
    d = make_daemon("limits:\n  lease_timeout_ms: 200\n", head_dim=DIM, block_tokens=BT)
    client = Counted(d.client())
    a = engine(8, seed=1)
    chains = Chains(refill=2)
    prompt = tokens(2 * BT)
    chains.save(client, a, prompt, "s", "r", [0, 1])
    time.sleep(0.15)  # Past half of 200 ms: the kept lease is stale.
    client.calls.clear()
    prompt = prompt + tokens(BT, base=9000)
    assert chains.save(client, a, prompt, "s", "r", [0, 1, 2]) == 1
    assert client.trips() == {"allocate": 1, "save": 1}, "a new lease, not the stale one"
    expect_blocks(d.client(), a, prompt, [0, 1, 2])
    # Client.save itself refuses a stale lease: its slots may be another writer's soon.
    c2 = d.client()
    lease = c2.allocate(1)
    last = c2.save(lease, "t", tokens(BT), 0, None, refill=2)[3]
    assert lease.fresh and len(lease) == 2
    time.sleep(0.15)
    assert not lease.fresh
    with pytest.raises(kvtier.FailedPreconditionError, match="half its timeout"):
        c2.save(lease, "t", tokens(BT, base=3000), 1, last, adopt=True)


def test_a_kept_lease_whose_kvtierd_restarted_is_dropped_and_the_save_connects_again(make_daemon):
    d = make_daemon(head_dim=DIM, block_tokens=BT)
    client = d.client()
    a = engine(8, seed=1)
    chains = Chains(refill=2)
    prompt = tokens(2 * BT)
    chains.save(client, a, prompt, "s", "r", [0, 1])
    before = client.instance_id
    d.stop()
    d2 = make_daemon(head_dim=DIM, block_tokens=BT)
    assert d2.socket == d.socket
    prompt = prompt + tokens(BT, base=9000)
    # The kept lease was the old kvtierd's: its save cannot be sent; the save is made anew.
    assert chains.save(client, a, prompt, "s", "r", [0, 1, 2]) == 3
    assert client.instance_id != before
    expect_blocks(d2.client(), a, prompt, [0, 1, 2])
