"""KvtierConnector's planning and every byte it moves, fast: vLLM's own
scheduler and the connector's two sides around a KV cache of real tensors, no
model (pipeline.Pipeline), over a real kvtierd. After every step, every token a
running request computed or loaded must hold that request's own K/V; the
engine tests (test_vllm.py, test_vllm_configs.py) check the same end to end
through logprobs, in minutes rather than seconds."""

import os
import signal
import sys
import time

import pytest

import kvtier

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipeline import BLOCK, Pipeline  # noqa: E402
from vllm_engines import kvtierd_stats, make_model, profile, prompt, store_total  # noqa: E402

from conftest import Daemon, until  # noqa: E402

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("models") / "tiny"), seed=1)


@pytest.fixture
def kvtierd(tmp_path):
    made = [Daemon(tmp_path, profiles=profile(64, 256))]
    yield made
    for d in made:
        d.stop()


@pytest.fixture
def pipe(model, kvtierd):
    p = Pipeline(model, kvtierd[0].socket)
    yield p
    p.close()


# A write-through disk store below kvtierd's host tier (blocks of the tiny model: 1 MiB each).
DISK_STORE = """stores:
  locate_budget_ms: 5000
  tiers:
    - kind: disk
      path: {path}
      max_bytes: 64MiB
      write: through
"""


def test_a_hit_loads_whole_blocks_of_the_requests_own_kv(pipe):
    a = pipe.add(prompt(1, 700))
    pipe.run()
    pipe.drain()
    assert pipe.metric("saved_blocks") == 700 // BLOCK
    b = pipe.add(prompt(1, 700) + prompt(2, 30))
    out = pipe.schedule()
    loads = out.kv_connector_metadata.loads
    assert [(x.req_id, x.first, len(x.block_ids)) for x in loads] == [(b, 0, 5)]
    assert loads[0].block_ids == pipe.block_ids(b)[:5]
    assert pipe.metric("store_lookups") == 0  # kvtierd has no stores: no lookup but the probe.
    pipe.execute(out)
    pipe.check(b)  # Loaded bytes are b's own tokens' K/V.
    pipe.run()
    assert pipe.metric("loaded_blocks") == 5 and pipe.metric("load_error_blocks") == 0
    assert pipe.outputs[a] and pipe.outputs[b]


@pytest.mark.parametrize("shared", [208, 200, 256])
def test_prompts_sharing_a_prefix_that_ends_anywhere_never_mix_in_a_block(pipe, shared):
    """S+X saved, then S+Y (S ends inside a vLLM block on a 16-token boundary, off
    every boundary, on a vLLM boundary), then S+Y+Z loads S+Y: every byte it
    loads is S+Y's (pipeline's check after every step)."""
    s = prompt(40, shared)
    for tail in (prompt(50, 100), prompt(60, 100)):
        pipe.add(s + tail)
        pipe.run()
        pipe.drain()
    c = pipe.add(s + prompt(60, 100) + prompt(70, 40))
    loads = pipe.step().kv_connector_metadata.loads  # Checked: what it loaded is S+Y's.
    assert [(x.req_id, len(x.block_ids)) for x in loads] == [(c, (shared + 100) // BLOCK)]
    pipe.run()
    assert pipe.metric("load_error_blocks") == 0


def test_a_profile_whose_blocks_are_not_vllms_is_refused_naming_both(model, tmp_path):
    d = Daemon(tmp_path, profiles=profile(64, 256, block_tokens=16))
    try:
        with pytest.raises(ValueError, match="a kvtier block must be one engine block, 128 tokens, not 16"):
            Pipeline(model, d.socket)
    finally:
        d.stop()


def test_a_failed_load_is_recomputed_and_then_saved_again(pipe, kvtierd, tmp_path):
    """The lookup hits; before the load runs, kvtierd is replaced by an empty one.
    The load fails (every block reported), vLLM recomputes, and once the links
    find the new kvtierd the recomputed blocks are saved there."""
    p = prompt(3, 700)
    pipe.add(p)
    pipe.run()
    pipe.drain()
    pipe.add(p + prompt(4, 20), max_tokens=3)
    out = pipe.schedule()
    assert len(out.kv_connector_metadata.loads) == 1  # Planned against the old kvtierd.
    kvtierd[0].proc.kill()
    kvtierd[0].proc.wait()
    kvtierd[0].stop()
    kvtierd.append(Daemon(tmp_path, profiles=profile(64, 256)))
    pipe.execute(out)
    assert pipe.failed_blocks == sorted(out.kv_connector_metadata.loads[0].block_ids)
    assert pipe.metric("load_error_blocks") == 5
    # Back: both links find the new kvtierd within a second; b decodes on and saves.
    until(lambda: all(link.up for link in pipe.connector._links) and pipe.worker._link.up, 3, "the links")
    pipe.add(prompt(9, 50), max_tokens=2)  # A step to plan b's saves in.
    pipe.run()
    pipe.drain()
    assert kvtierd_stats(kvtierd[1].socket)["committed_blocks"] >= 5, "the recomputed prefix was not saved again"
    c = pipe.add(p + prompt(5, 10))
    loads = pipe.step().kv_connector_metadata.loads
    assert [(x.req_id, len(x.block_ids)) for x in loads] == [(c, 5)]
    pipe.run()


def test_no_save_is_planned_while_kvtierd_is_away(pipe, kvtierd):
    kvtierd[0].proc.kill()
    kvtierd[0].proc.wait()
    until(lambda: not pipe.connector._links[0].up, 3, "the scheduler's link to see kvtierd gone")
    pipe.add(prompt(6, 600))
    outs = pipe.run()
    assert not any(o.kv_connector_metadata.saves for o in outs)
    assert not any(o.kv_connector_metadata.loads for o in outs)
    assert pipe.metric("lookups") == 0 and pipe.metric("save_errors") == 0


def test_a_long_prompt_is_saved_once_its_prefill_ends(model, kvtierd):
    p = Pipeline(model, kvtierd[0].socket, max_num_batched_tokens=256)
    try:
        rid = p.add(prompt(7, 1000))
        outs = p.run()
        planned = [(i, [len(s.block_ids) for s in o.kv_connector_metadata.saves]) for i, o in enumerate(outs)]
        planned = [x for x in planned if x[1]]
        chunks = (1000 + 255) // 256
        assert planned[0] == (chunks - 1, [1000 // BLOCK]), planned  # The step that ends the prefill: all 7 blocks.
        assert p.outputs[rid]
    finally:
        p.close()


def test_preempted_requests_are_freed_and_each_request_looked_up_once(model, kvtierd):
    """A KV cache of 12 blocks for requests that grow past it as they decode:
    vLLM preempts some, frees their blocks (the metadata names them), and
    resumes them later, asking the connector again; every byte stays right."""
    p = Pipeline(model, kvtierd[0].socket, blocks=12, max_num_seqs=6)
    try:
        shared = prompt(8, 256)
        rids = [p.add(shared + prompt(100 + i, 100), max_tokens=200) for i in range(5)]
        outs = p.run()
        assert p.preempted > 0, "nothing was preempted: the test did not test preemption"
        freed = set().union(*(o.kv_connector_metadata.freed for o in outs))
        preempted = set().union(*(o.preempted_req_ids or set() for o in outs))
        assert preempted and preempted <= freed and set(rids) <= freed
        assert p.metric("lookups") == len(rids)
        assert all(len(p.outputs[r]) == 200 for r in rids)
    finally:
        p.close()


def test_each_requests_session_ends_with_it(pipe, kvtierd):
    for i in range(4):
        pipe.add(prompt(20 + i, 300))
    pipe.run()
    pipe.add(prompt(30, 10), max_tokens=1)  # get_finished of the last ones runs in a later step.
    pipe.run()
    pipe.drain()
    s = kvtierd_stats(kvtierd[0].socket)
    assert s["ended_sessions"] >= 4 and s["sessions"] == 4, s  # Ended, their blocks kept.
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline and kvtierd_stats(kvtierd[0].socket)["committed_blocks"] < 8:
        time.sleep(0.05)
    assert kvtierd_stats(kvtierd[0].socket)["committed_blocks"] == 8


def restart_cold_with_the_disk(p, made, tmp_path, shared):
    """Runs `shared` on `p` until the disk store below made[0] holds it, then
    starts kvtierd again cold (its tiers lost, the disk kept), appends it to
    `made`, and waits for the connector's link to follow it."""
    p.add(shared)
    p.run()
    p.drain()
    until(lambda: store_total(kvtierd_stats(made[0].socket), "put_blocks") >= len(shared) // BLOCK, 5,
          "the disk store to hold the prefix")
    made[0].stop()
    made.append(Daemon(tmp_path, DISK_STORE.format(path=tmp_path / "disk"), profiles=profile(64, 256)))
    instance = kvtier.Client(socket=made[1].socket).instance_id
    link = p.connector._links[0]
    until(lambda: getattr(link.get(), "instance_id", 0) == instance, 3, "the link to follow it")
    assert link.get().probe(shared) == 0  # A cold kvtierd: only the disk store holds the prefix.


def test_what_only_the_disk_store_holds_is_brought_in_off_the_step_then_loaded(model, tmp_path):
    """kvtierd restarted cold: its tiers lost, its disk store kept. The index
    misses; the scheduler has kvtierd bring the prefix in from disk while the
    request waits unscheduled and another request runs; then the prefix loads
    like any hit, every byte the request's own."""
    disk = tmp_path / "disk"
    made = [Daemon(tmp_path, DISK_STORE.format(path=disk), profiles=profile(64, 256))]
    p = Pipeline(model, made[0].socket, extra={"store_lookup_wait": 0})  # Never scheduled in the asking step.
    try:
        shared = prompt(40, 700)
        restart_cold_with_the_disk(p, made, tmp_path, shared)
        other = p.add(prompt(41, 300), max_tokens=30)
        for _ in range(200):  # It misses too, and asks the stores first.
            if other in p.step().num_scheduled_tokens:
                break
            time.sleep(0.005)
        b = p.add(shared + prompt(42, 20), max_tokens=3)
        waited, loads = 0, []
        for _ in range(200):
            out = p.step()
            if b in out.num_scheduled_tokens:
                loads = out.kv_connector_metadata.loads
                break
            waited += 1
            assert other in out.num_scheduled_tokens  # The others go on meanwhile.
            time.sleep(0.005)
        assert waited >= 1, "the request was scheduled before the stores answered"
        assert [(x.req_id, x.first, len(x.block_ids)) for x in loads] == [(b, 0, 5)]
        p.run()
        assert kvtierd_stats(made[1].socket)["store_fetched_blocks"] == 5
        assert p.metric("store_lookup_hit_tokens") == 5 * BLOCK
        assert p.metric("loaded_blocks") == 5 and p.metric("load_error_blocks") == 0
        # Each request missed the index (the first, on the first kvtierd, too) and asked the stores once.
        assert p.metric("store_lookups") == 3 and p.metric("lookups") == 3
    finally:
        p.close()
        for d in made:
            d.stop()


def test_a_lookup_the_stores_answer_while_the_scheduler_waits_is_scheduled_in_that_step(model, tmp_path):
    """store_lookup_wait: the scheduler waits that long, once per request, for
    the stores' answer (a miss in a local store comes in well under a ms); one
    that comes in time is scheduled in the same step."""
    d = Daemon(tmp_path, DISK_STORE.format(path=tmp_path / "disk"), profiles=profile(64, 256))
    p = Pipeline(model, d.socket, extra={"store_lookup_wait": 5.0})  # Longer than any answer takes.
    try:
        rid = p.add(prompt(43, 700))
        assert rid in p.step().num_scheduled_tokens
        assert p.metric("store_lookups") == 1 and p.metric("lookup_hit_tokens") == 0
    finally:
        p.close()
        d.stop()


def test_a_hit_the_stores_answer_while_the_scheduler_waits_is_loaded_in_that_step(model, tmp_path):
    """The same wait, on a hit: the stores' answer comes while the scheduler
    waits, and the request is scheduled in that step with what they held.
    Before, the lookup went on with the probe it made before asking (a miss):
    the request computed a prefix kvtierd had just brought in from disk."""
    disk = tmp_path / "disk"
    made = [Daemon(tmp_path, DISK_STORE.format(path=disk), profiles=profile(64, 256))]
    p = Pipeline(model, made[0].socket, extra={"store_lookup_wait": 5.0})  # Longer than any answer takes.
    try:
        shared = prompt(44, 700)
        restart_cold_with_the_disk(p, made, tmp_path, shared)
        b = p.add(shared + prompt(45, 20), max_tokens=3)
        out = p.step()  # Checks that the loaded bytes are b's own tokens' K/V.
        assert b in out.num_scheduled_tokens
        assert [(x.req_id, x.first, len(x.block_ids)) for x in out.kv_connector_metadata.loads] == [(b, 0, 5)]
        p.run()
        assert kvtierd_stats(made[1].socket)["store_fetched_blocks"] == 5
        assert p.metric("store_lookup_hit_tokens") == 5 * BLOCK and p.metric("loaded_blocks") == 5
    finally:
        p.close()
        for d in made:
            d.stop()


def test_a_lookup_kvtierd_never_answers_is_a_miss_after_its_timeout(model, tmp_path):
    """kvtierd stops answering (SIGSTOP) as a request's lookup asks its stores:
    the lookup times out (store_lookup_timeout), is counted as an error, and the
    request computes its prompt rather than wait for good."""
    d = Daemon(tmp_path, DISK_STORE.format(path=tmp_path / "disk"), profiles=profile(64, 256))
    p = Pipeline(model, d.socket, extra={"store_lookup_wait": 0, "store_lookup_timeout": 0.5})
    try:
        d.proc.send_signal(signal.SIGSTOP)
        rid = p.add(prompt(44, 700))
        started = time.monotonic()
        while rid not in p.step().num_scheduled_tokens:
            assert time.monotonic() - started < 10, "the request waited past its lookup's timeout"
            time.sleep(0.01)
        assert p.metric("store_lookup_errors") == 1, "the lookup did not fail: the test did not test a hung kvtierd"
        assert p.metric("loaded_blocks") == 0
    finally:
        d.proc.send_signal(signal.SIGCONT)
        p.close()
        d.stop()
