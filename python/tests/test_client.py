"""kvtier.Client against a real kvtierd: the write and read paths through numpy
views of the pools, sessions, errors as exceptions, model identities, threads."""

import os
import threading
import time

import numpy as np
import pytest

import kvtier

BT = 4  # block_tokens of the test profile (conftest.PROFILE)


def tokens(seed, blocks):
    return [seed * 1000 + i for i in range(blocks * BT)]


def pattern(seed, block, shape):
    rng = np.random.default_rng(seed * 7919 + block)
    return rng.standard_normal(shape).astype(np.float32)


def put(client, session, toks, seed):
    """Writes blocks whose K/V are a function of (seed, block) and commits them."""
    n = len(toks) // BT
    with client.allocate(n) as w:
        for i in range(n):
            view = w.block(i)
            view[...] = pattern(seed, i, view.shape)
        return client.commit(w, session, toks)


def test_write_then_read_through_views_of_the_pools(daemon):
    c = daemon.client()
    assert c.block_tokens == BT
    assert c.profile["layers"] == 2 and c.profile["dtype"] == "fp32"
    assert c.backend == "host"
    t = tokens(1, 3)
    assert len(c.keys(t)) == 3 and all(len(k) == 32 for k in c.keys(t))
    assert c.probe(t) == 0
    assert put(c, "chat-1", t, seed=1) == (3, 0)
    assert c.probe(t) == 3
    assert c.probe(t + [5] * BT) == 3, "an uncached tail block"
    with c.acquire(t + tokens(2, 1), session="chat-1") as lease:
        lease.wait()
        assert lease.matched == 3 and len(lease) == 3
        assert [tier for tier, _ in lease.blocks] == ["gpu"] * 3
        for i in range(3):
            block = lease.block(i)
            assert block.shape == (2, 2, BT, 2, 8)
            assert not block.flags.writeable
            np.testing.assert_array_equal(block, pattern(1, i, block.shape))
        with pytest.raises(IndexError):
            lease.block(3)
    s = c.session("chat-1")
    assert s["blocks"] == 3 and s["tokens"] == 3 * BT and s["model"] is None
    assert [tier for _, tier in s["chain"]] == ["gpu"] * 3
    assert [key for key, _ in s["chain"]] == c.keys(t)
    assert [x["id"] for x in c.sessions()] == ["chat-1"]
    stats = c.stats()
    assert stats["committed_blocks"] == 3 and stats["hit_blocks"] == 3


def test_blocks_demoted_to_the_host_tier_read_back_the_same(daemon):
    c = daemon.client()
    t = tokens(3, 4)
    put(c, "s", t, seed=3)
    assert c.demote("s") == 4
    for _ in range(500):
        if c.session("s")["host_blocks"] == 4:
            break
    assert c.session("s")["host_blocks"] == 4
    with c.acquire(t, promote=False) as lease:
        assert [tier for tier, _ in lease.blocks] == ["host"] * 4
        for i in range(4):
            np.testing.assert_array_equal(lease.block(i), pattern(3, i, lease.block(i).shape))
    with c.acquire(t, promote=True) as lease:
        lease.wait(timeout=10)
        assert lease.promoted == 4
        np.testing.assert_array_equal(lease.block(2), pattern(3, 2, lease.block(2).shape))


def test_errors_are_exceptions_named_after_their_status(daemon):
    c = daemon.client()
    with pytest.raises(kvtier.NotFoundError) as e:
        c.session("nope")
    assert e.value.code == "not_found" and "nope" in str(e.value)
    assert isinstance(e.value, kvtier.Error)
    with pytest.raises(kvtier.InvalidArgumentError):
        c.allocate(0)
    with pytest.raises(ValueError):
        c.probe([-1])
    with pytest.raises(ValueError):
        kvtier.Client(socket=daemon.socket, model_id="xyz")
    with pytest.raises(kvtier.UnavailableError):
        kvtier.Client(socket=daemon.socket + ".absent", connect_timeout=0.1)
    w = c.allocate(1)
    w.release()
    with pytest.raises(kvtier.FailedPreconditionError):
        c.commit(w, "s", tokens(4, 1))
    lease = c.acquire(tokens(4, 1))
    lease.release()
    lease.release()  # Idempotent.


def test_a_view_asked_for_after_release_is_an_error_and_old_views_stay_readable(daemon):
    c = daemon.client()
    t = tokens(6, 2)
    put(c, "s", t, seed=6)
    lease = c.acquire(t)
    view = lease.block(1)
    assert lease.address(1)[0] == "gpu" and lease.address(1)[1] != 0
    lease.release()
    with pytest.raises(kvtier.FailedPreconditionError) as e:
        lease.block(0)
    assert "released" in str(e.value)
    assert view.shape == (2, 2, BT, 2, 8)
    float(view.sum())  # Still mapped: reading it is no crash (the bytes may be another block's by now).
    with c.allocate(1) as w:
        assert w.address(0) != 0
    with pytest.raises(kvtier.FailedPreconditionError):
        w.block(0)
    with pytest.raises(kvtier.FailedPreconditionError) as e:
        w.record_written(0)
    assert "released" in str(e.value) or "CPU" in str(e.value)


def test_models_of_equal_geometry_never_share_blocks(daemon):
    a = daemon.client(model_id="11" * 16)
    a_again = daemon.client(model_id=bytes.fromhex("11" * 16) + b"rest of a longer digest")
    b = daemon.client(model_id="22" * 16)
    none = daemon.client()
    assert a.model_id == "11" * 16 and none.model_id is None
    t = tokens(5, 2)
    put(a, "chat", t, seed=5)
    assert a.probe(t) == 2 and a_again.probe(t) == 2
    assert b.probe(t) == 0 and none.probe(t) == 0
    assert b.acquire(t).matched == 0
    assert a.keys(t) != b.keys(t)
    assert a.session("chat")["model"] == "11" * 16


def test_a_profile_that_lists_models_refuses_others(make_daemon):
    d = make_daemon("    models: [\"" + "33" * 16 + "\"]\n")
    assert d.client(model_id="33" * 16).probe(tokens(1, 1)) == 0
    with pytest.raises(kvtier.PermissionDeniedError) as e:
        d.client(model_id="44" * 16)
    assert "33" * 16 in str(e.value)


def test_one_client_serves_several_threads(daemon):
    c = daemon.client()
    errors = []

    def work(k):
        try:
            for r in range(10):
                t = tokens(100 + k * 10 + r, 2)
                assert put(c, f"t{k}-{r}", t, seed=k) == (2, 0)
                with c.acquire(t) as lease:
                    assert lease.matched == 2
                    np.testing.assert_array_equal(lease.block(1), pattern(k, 1, lease.block(1).shape))
        except Exception as ex:  # noqa: BLE001 - reported below
            errors.append(ex)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(c.sessions()) == 40


def test_blocks_as_torch_tensors_view_the_pool(daemon):
    torch = pytest.importorskip("torch")
    import kvtier.hf

    c = daemon.client()
    t = tokens(7, 1)
    with c.allocate(1) as w:
        slot = kvtier.hf.block_tensor(c, w, 0, writable=True)
        assert slot.shape == (2, 2, BT, 2, 8) and slot.dtype == torch.float32
        slot.fill_(3.5)  # Written in place: the commit publishes these bytes.
        c.commit(w, "t", t)
    with c.acquire(t) as lease:
        view = kvtier.hf.block_tensor(c, lease, 0)
        assert float(view.min()) == 3.5 and float(view.max()) == 3.5
        assert view.data_ptr() == lease.block(0).ctypes.data, "a view, not a copy"


def test_gather_checks_every_size_it_computes_from_the_callers_numbers(daemon):
    c = daemon.client()
    t = tokens(9, 2)
    put(c, "g", t, seed=9)
    with c.acquire(t, promote=False) as lease:
        layers, heads, dim = c.profile["layers"], c.profile["kv_heads"], c.profile["head_dim"]
        out = np.zeros((layers, 2, heads, 2 * BT, dim), np.float32)
        lease.gather(out)
        for i in range(2):  # [layers, 2, heads, rows, dim] from the blocks' [layers, 2, rows, heads, dim].
            np.testing.assert_array_equal(out[:, :, :, i * BT:(i + 1) * BT],
                                          pattern(9, i, (layers, 2, BT, heads, dim)).transpose(0, 1, 3, 2, 4))
        # 2 x 2 layers x 2 heads x 8 dims x 4 bytes = 256 bytes a row: 2**56 rows wrap to 0 bytes, and
        # 2**56 + 1 to 256, which once matched these small buffers and wrote far past them.
        for capacity, buf in ((2**56, np.zeros(0, np.float32)), (2**56 + 1, np.zeros(64, np.float32)),
                              (2**63, np.zeros(0, np.float32))):
            with pytest.raises(ValueError, match="capacity"):
                lease.gather(buf, capacity=capacity)
            assert not buf.any()



def _shared_mib(pid):
    """The memory the shared-memory files that pid holds open have taken (memfd
    and /dev/shm), whoever touched it, in MiB."""
    seen, total = set(), 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith(("/memfd:", "/dev/shm/")):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
        except OSError:
            pass
    return total / (1 << 20)


def _own_shared_mib():
    """Shared memory mapped in this process's page tables (RssShmem), in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:")) / 1024


@pytest.mark.parametrize("prefault", [True, False])
def test_prefault_decides_whether_the_tiers_take_memory_from_the_start(tmp_path, prefault):
    """prefault: true (the default) faults both tiers in from the start, on a
    thread, while kvtierd already serves; false leaves their memory to grow as
    slots are first written (by the clients, into the shared segments), and what
    is written reads back the same. Tiers of 1 MiB blocks: 64 + 256 MiB in all.
    A client with prefault_pools maps the pages of pools that are whole (waiting
    while kvtierd faults them in), and leaves the others alone."""
    from conftest import PROFILE, Daemon, until
    profile = PROFILE.format(head_dim=128, block_tokens=256)
    d = Daemon(tmp_path, extra=f"prefault: {str(prefault).lower()}", profiles=profile)
    try:
        before = _own_shared_mib()
        c = d.client(prefault_pools=True)  # Maps the pools' pages in the background where they are whole.
        at_start = _shared_mib(d.proc.pid)
        if prefault:
            until(lambda: _shared_mib(d.proc.pid) >= 320, 20, "kvtierd to fault both tiers in (320 MiB)")
            until(lambda: _own_shared_mib() >= before + 320, 20, "the client to map both pools' pages")
            return
        time.sleep(0.5)  # Had the client mapped the pools' pages, it would have taken their memory.
        assert at_start < 32, f"{at_start:.0f} MiB of shared memory taken before any block was written"
        assert _shared_mib(d.proc.pid) < 32 and _own_shared_mib() < before + 32
        t = [9000 + i for i in range(16 * 256)]
        with c.allocate(16) as w:
            for i in range(16):
                view = w.block(i)
                view[...] = pattern(3, i, view.shape)
            c.commit(w, "s", t)
        assert _shared_mib(d.proc.pid) >= at_start + 16, "16 slots of 1 MiB written"
        with c.acquire(t, session="s") as lease:
            lease.wait()
            for i in range(16):
                np.testing.assert_array_equal(lease.block(i), pattern(3, i, lease.block(i).shape))
    finally:
        d.stop()
