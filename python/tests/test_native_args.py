"""Property tests of kvtier._native's argument checks, against a real kvtierd.

Every integer or float a caller passes reaches C++ through one conversion or
another; a size computed from them that wraps writes out of bounds (a gather
with capacity 2**51 + n once did). These tests throw arbitrary numbers at each
entry point that takes one and require one of two outcomes: the call works and
writes only where it said it would, or it raises a Python exception that names
the problem (never a crash, never a silently wrong value).

Runs are derandomized: the same examples every run, so CI cannot flake, and
the search still reaches far past the values a person would write down.
"""

import math
import pathlib
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvtier
from conftest import Daemon

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=150,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# What a refused argument may raise: pybind11's conversions raise TypeError,
# the module's own checks ValueError or IndexError, kvtierd's kvtier.Error.
REFUSED = (TypeError, ValueError, IndexError, OverflowError, kvtier.Error)

# Integers around every boundary a size computation could wrap at.
EDGES = [0, 1, 2, 3, 4, 255, 256, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**51 + 1, 2**53,
         2**56 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 2**100]
INTS = st.one_of(st.sampled_from(EDGES), st.sampled_from([-e for e in EDGES]), st.integers(), st.integers(0, 64))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 1e-12, 0.001, 0.5, 1e9, 1e12, 1e17, 1e300, math.inf, -math.inf,
                                    math.nan, 2.0**63, 2.0**64]))

# The profile conftest's daemon serves: 2 layers x 2 KV heads x 8 dims, fp32, 4-token blocks.
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS = 2, 2, 8, 4


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(pathlib.Path(tempfile.mkdtemp(prefix="kvtier-args-")))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return daemon.client()


@pytest.fixture(scope="module")
def leased(client):
    """A read lease on two committed blocks, kept for the module."""
    tokens = list(range(1000, 1000 + 2 * BLOCK_TOKENS))
    w = client.allocate(2)
    for i in range(2):
        w.block(i)[...] = i + 1
    client.commit(w, "args", tokens)
    lease = client.acquire(tokens, "args", promote=False)
    assert len(lease) == 2
    yield lease
    lease.release()


# Capacities whose product with the other sizes passes 2**64 by a little: 2**64 / 2**shift * j + k.
WRAPPING = st.builds(lambda shift, j, k: (2**64 >> shift) * j + k, st.integers(1, 12), st.integers(1, 3),
                     st.integers(0, 64))


@SETTINGS
@given(first_layer=INTS, layers=st.one_of(st.none(), INTS), capacity=st.one_of(st.none(), INTS, WRAPPING),
       extra=st.one_of(st.just(0), st.integers(-64, 64)), dtype=st.sampled_from(["float32", "uint8", "float64", "uint16"]))
def test_gather_writes_only_its_buffer_or_refuses(leased, first_layer, layers, capacity, extra, dtype):
    # The buffer is what gather needs for these numbers (give or take `extra` items), computed modulo 2**64
    # as C++ would: for a capacity that wraps the product, that is exactly the small buffer a check that
    # wrapped would accept.
    n_layers = (LAYERS - first_layer if layers is None else layers) if 0 <= first_layer < LAYERS else 1
    rows = 2 * BLOCK_TOKENS if capacity is None else capacity
    itemsize = np.dtype(dtype).itemsize
    size = (n_layers * 2 * KV_HEADS * rows * HEAD_DIM * 4) % 2**64
    items = max(size // itemsize + extra, 0) if size < 2**22 else abs(extra)
    guard = 64
    backing = np.full((items + 2 * guard) * itemsize, 0x5A, dtype=np.uint8)
    dst = backing[guard * itemsize:(guard + items) * itemsize].view(dtype)
    try:
        leased.gather(dst, first_layer=first_layer, layers=layers, capacity=capacity)
    except REFUSED:
        pass
    # Whether it worked or not, nothing outside dst was written.
    assert (backing[:guard * itemsize] == 0x5A).all()
    assert (backing[(guard + items) * itemsize:] == 0x5A).all()


@SETTINGS
@given(first_layer=st.integers(0, LAYERS - 1), one_layer=st.booleans(), capacity=WRAPPING,
       dtype=st.sampled_from(["float32", "uint8"]))
def test_gather_capacity_that_wraps_is_refused(leased, first_layer, one_layer, capacity, dtype):
    # Sensible layers and a capacity that wraps: the buffer of the wrapped size must not be written.
    test_gather_writes_only_its_buffer_or_refuses.hypothesis.inner_test(
        leased, first_layer, 1 if one_layer else None, capacity, 0, dtype)


@SETTINGS
@given(i=INTS)
def test_block_and_address_index_checked(client, leased, i):
    for call in (leased.block, leased.address):
        try:
            call(i)
        except REFUSED:
            assert not 0 <= i < len(leased)
        else:
            assert 0 <= i < len(leased)
    w = client.allocate(1)
    try:
        for call in (w.block, w.address):
            try:
                call(i)
            except REFUSED:
                assert i != 0
            else:
                assert i == 0
    finally:
        w.release()


@SETTINGS
@given(tokens=st.lists(INTS, max_size=12), parent=st.one_of(st.none(), st.text(max_size=40),
                                                            st.sampled_from(["0" * 32, "f" * 32, "g" * 32])))
def test_token_ids_and_keys_checked(client, tokens, parent):
    valid = all(0 <= t < 2**32 for t in tokens)
    try:
        keys = client.keys(tokens, parent=parent)
    except REFUSED:
        pass
    else:
        assert valid
        assert len(keys) == len(tokens) // BLOCK_TOKENS
    try:
        assert client.probe(tokens) >= 0
    except REFUSED:
        assert not valid
    try:
        with client.acquire(tokens, "args-acquire", promote=False) as lease:
            assert len(lease) <= len(tokens) // BLOCK_TOKENS
    except REFUSED:
        pass


@SETTINGS
@given(blocks=INTS, start_block=INTS, slots=st.lists(INTS, max_size=4), ntokens=st.integers(0, 12))
def test_allocate_and_commit_sizes_checked(client, blocks, start_block, slots, ntokens):
    try:
        w = client.allocate(blocks)
    except REFUSED:
        # The profile's GPU tier holds 64 (the module's lease pins 2): any ask up to 32 is served.
        assert not 1 <= blocks <= 32, blocks
        w = client.allocate(1)
    try:
        tokens = list(range(50_000, 50_000 + ntokens))
        try:
            stored, duplicates = client.commit(w, "args-commit", tokens, start_block=start_block, slots=slots)
            assert stored + duplicates <= len(w)
        except REFUSED:
            pass
    finally:
        w.release()


@SETTINGS
@given(x=FLOATS)
def test_timeouts_take_any_float(daemon, leased, x):
    try:
        c = kvtier.Client(socket=daemon.socket, connect_timeout=x, request_timeout=x)
    except REFUSED:
        assert not x >= 0 or x < 1, x  # NaN or negative; a connect timeout under 1 ms may pass first.
        return
    # A timeout of a second or more, however large (infinity too), is long enough for a healthy kvtierd.
    if x >= 1:
        assert c.ping() >= 0
        leased.wait(timeout=x)
    limit = 720 * 3600  # The longest priority TTL kvtierd takes, in seconds.
    try:
        c.set_priority("args-none", 1, ttl=x)
    except kvtier.NotFoundError:
        assert 0 <= x <= limit  # The TTL was taken: the session is what is missing.
    except kvtier.InvalidArgumentError as e:
        # Only a TTL past the limit, and the error says so whatever its size (1e17 s once wrapped
        # to "must not be negative").
        assert x > limit and "exceeds" in str(e), (x, e)
    except kvtier.TimeoutError:
        assert x < 1  # A request timeout under a millisecond may pass before kvtierd answers.
    except ValueError:
        assert not x >= 0


@SETTINGS
@given(shape=st.lists(INTS, max_size=5), nbytes=st.integers(0, 64), dtype=st.sampled_from(["F32", "BF16", "", "x"]),
       sliding_window=st.one_of(st.none(), INTS), theta=st.one_of(st.none(), FLOATS))
def test_identity_inputs_checked(shape, nbytes, dtype, sliding_window, theta):
    ident = kvtier._native.ModelIdentity()
    try:
        ident.add_tensor("w", dtype, shape, bytes(nbytes))
    except REFUSED:
        pass
    try:
        text = kvtier._native.model_settings_text("llama", sliding_window=sliding_window, rope_theta=theta)
        assert isinstance(text, str)
        ident.add_config(text)
    except REFUSED:
        pass
    try:
        assert len(ident.finish()) == 32
    except REFUSED:
        pass
