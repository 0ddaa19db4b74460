#!/usr/bin/env python3
"""Floods against kvtierd, each measured by a bystander: does any endpoint let
one client slow everyone else?

One kvtierd (host backend, a real redis-server below it as a write-through
store, KV events on) serves a bystander tenant that loops three requests and
times each: an Acquire of its prefix held in the local tiers (`acquire`), an
Acquire of a prefix that lives only in Redis (`store_acquire`: the session is
evicted first, so the blocks come back through the store I/O thread), and an
Allocate of one GPU slot (`allocate`, whose failures are counted). Meanwhile
one flood runs, or none (quiet):

  events_connections  plain connect()s held open on the events sockets (replay
                      and publish), as many as the attacker's descriptors allow
  events_replays      pipelined replay requests on one ZMQ DEALER
  events_big_messages 64 MiB messages sent to the replay socket
  socket_garbage      connections to kvtierd's socket sending bytes that are no
                      frame, or a header that declares a huge one
  hello_churn         clients connecting, saying Hello and leaving, in a loop
  store_hog           another tenant looping Acquire on its own 256-block prefix
                      held only in Redis (each turn evicts and refetches it)
  gpu_hog             another tenant renewing read leases on a 512-block prefix
                      (the whole GPU tier) every 50 ms

Each round runs every phase once, quiet first and the floods in a rotated
order, so a flood's figures are compared with the quiet phase of its own round
(interleaved). A flood runs in its own processes; on a machine of 2 or more
cores they and redis-server (a remote tier's server, on another host in a
deployment) are held to the last core unless --no-pin, so the figures measure
kvtierd's defences rather than how the kernel shares a small machine's cores.
The last line is one JSON object: per flood, the bystander's p50 under the
flood over its round's quiet p50 (median over rounds, with min and max), the
absolute p50s, and the allocate failures.

  bench/flood_bench.py --kvtierd build/daemon/kvtierd --rounds 5
"""

import argparse
import datetime
import errno
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kvtierd import start_kvtierd, start_redis  # noqa: E402

import kvtier  # noqa: E402

BLOCK_TOKENS = 16
KINDS = ["events_connections", "events_replays", "events_big_messages", "socket_garbage", "hello_churn",
         "store_hog", "gpu_hog"]


def evict(client, session):
    try:
        client.evict(session)
    except kvtier.NotFoundError:
        pass  # Its last Acquire found nothing, so it holds nothing.


def tokens_for(seed, blocks):
    return [(seed * 7919 + i) % 50000 + 1 for i in range(blocks * BLOCK_TOKENS)]


def commit_prefix(client, session, tokens):
    """Commits tokens' blocks under session, in GPU-tier leases of at most 32 blocks."""
    n = len(tokens) // BLOCK_TOKENS
    keys = client.keys(tokens)
    done = 0
    while done < n:
        k = min(32, n - done)
        w = client.allocate(k)
        for i in range(k):
            w.block(i)[...] = (done + i) % 251
        parent = keys[done - 1] if done else None
        client.commit(w, session, tokens[done * BLOCK_TOKENS:(done + k) * BLOCK_TOKENS], start_block=done,
                      parent=parent)
        w.release()
        done += k


def wait_in_store(client, tokens, session, timeout=20.0):
    """Waits until the stores hold tokens' blocks: evicts the session and acquires until all come back."""
    want = len(tokens) // BLOCK_TOKENS
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evict(client, session)
        with client.acquire(tokens, session, promote=False) as lease:
            if len(lease) == want:
                return
        time.sleep(0.2)
    raise SystemExit(f"the store did not hold {want} blocks of {session} in {timeout} s")


# --- floods: each runs in its own process until `stop` is set ----------------------------------

def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def flood_events_connections(sock, stop, _):
    raise_nofile()
    held = []
    targets = [sock + ".replay", sock + ".events"]
    i = 0
    while not stop.is_set():
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            s = None
        try:
            if s is None:
                raise OSError(errno.EMFILE, "out of descriptors")
            # Blocking, so that each connect is one kvtierd accepted (a full backlog makes it wait).
            s.settimeout(0.5)
            s.connect(targets[i % 2])
            held.append(s)
            i += 1
        except OSError as e:
            if s is not None:
                s.close()
            if e.errno in (errno.EMFILE, errno.ENFILE):
                time.sleep(0.05)  # Out of our own descriptors: hold what we have (another process goes on).
            else:
                time.sleep(0.01)  # Refused: the socket is gone (a restart) or its backlog full.
    print(f"events_connections: {i} connects, {len(held)} held", file=sys.stderr)
    for s in held:
        s.close()


def flood_events_replays(sock, stop, _):
    import zmq
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.SNDHWM, 100000)
    d.connect("ipc://" + sock + ".replay")
    start = struct.pack(">Q", 1)
    while not stop.is_set():
        for _ in range(100):
            try:
                d.send_multipart([b"", start], flags=zmq.NOBLOCK)
            except zmq.Again:
                break
        try:
            while True:
                d.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
    d.close()
    ctx.term()


def flood_events_big_messages(sock, stop, _):
    import zmq
    ctx = zmq.Context()
    big = b"\0" * (64 << 20)
    socks = []
    while not stop.is_set():
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect("ipc://" + sock + ".replay")
        try:
            d.send_multipart([b"", big], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass
        socks.append(d)
        if len(socks) > 8:
            socks.pop(0).close()
        time.sleep(0.05)
    for d in socks:
        d.close()
    ctx.term()


def flood_socket_garbage(sock, stop, _):
    raise_nofile()
    garbage = os.urandom(4096)
    # A frame header (magic "KVT1", version, type, request id, payload length, flags) declaring 16 MiB.
    huge = struct.pack("<IHHQII", 0x3154564B, 3, 1, 1, 16 << 20, 0) + garbage
    i = 0
    while not stop.is_set():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.2)
                s.connect(sock)
                s.sendall(huge if i % 2 else garbage)
                try:
                    s.recv(4096)
                except OSError:
                    pass
        except OSError:
            time.sleep(0.001)
        i += 1


def flood_hello_churn(sock, stop, _):
    while not stop.is_set():
        try:
            kvtier.Client(socket=sock, tenant="churn", connect_timeout=0.5).ping()
        except kvtier.Error:
            time.sleep(0.001)


def flood_store_hog(sock, stop, tokens):
    c = kvtier.Client(socket=sock, tenant="hog")
    while not stop.is_set():
        try:
            evict(c, "hog-store")
            with c.acquire(tokens, "hog-store", promote=False):
                pass
        except kvtier.Error:
            time.sleep(0.001)


def flood_gpu_hog(sock, stop, _):
    c = kvtier.Client(socket=sock, tenant="hog")
    tokens = tokens_for(77, 512)
    try:
        commit_prefix(c, "hog-gpu", tokens)
    except kvtier.Error:
        pass  # As much of it as the GPU tier took.
    held = None
    while not stop.is_set():
        try:
            lease = c.acquire(tokens, "hog-gpu", promote=True)
            lease.wait()
        except kvtier.Error:
            time.sleep(0.01)
            continue
        if held is not None:
            held.release()
        held = lease
        # Fill whatever GPU room is left with write leases, as a greedy tenant would.
        try:
            extra = c.allocate(8)
            commit_tokens = tokens_for(int(time.monotonic() * 1000) % 100000, 8)
            c.commit(extra, "hog-gpu-" + str(time.monotonic_ns() % 16), commit_tokens)
            extra.release()
        except kvtier.Error:
            pass
        time.sleep(0.05)
    if held is not None:
        held.release()


FLOODS = {
    "events_connections": (flood_events_connections, 3),  # Three: more descriptors than kvtierd has.
    "events_replays": (flood_events_replays, 1),
    "events_big_messages": (flood_events_big_messages, 1),
    "socket_garbage": (flood_socket_garbage, 2),
    "hello_churn": (flood_hello_churn, 2),
    "store_hog": (flood_store_hog, 1),
    "gpu_hog": (flood_gpu_hog, 1),
}


def flood_main(kind, sock, stop, arg, pin):
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    try:
        FLOODS[kind][0](sock, stop, arg)
    except Exception as e:  # A flood that fails is reported, never hangs the benchmark.
        print(f"flood {kind}: {type(e).__name__}: {e}", file=sys.stderr)


# --- the bystander ---------------------------------------------------------------------------

def measure(client, seconds, hot, cold):
    acquire, store, allocate, failures = [], [], [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        with client.acquire(hot, "by-hot", promote=False):
            pass
        acquire.append((time.perf_counter() - t) * 1e6)
        evict(client, "by-cold")
        t = time.perf_counter()
        with client.acquire(cold, "by-cold", promote=False) as lease:
            got = len(lease)
        if got == len(cold) // BLOCK_TOKENS:
            store.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        try:
            client.allocate(1).release()
            allocate.append((time.perf_counter() - t) * 1e6)
        except kvtier.Error:
            failures += 1
    p50 = lambda x: statistics.median(x) if x else None  # noqa: E731
    return {"acquire_p50_us": p50(acquire), "store_acquire_p50_us": p50(store), "allocate_p50_us": p50(allocate),
            "allocate_failures": failures, "acquires": len(acquire), "store_hits": len(store)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--phase-s", type=float, default=2.0, help="seconds each phase is measured")
    p.add_argument("--kinds", default=",".join(KINDS), help="floods to run, comma-separated")
    p.add_argument("--no-pin", action="store_true", help="let the floods run on every core")
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in FLOODS:
            p.error(f"unknown flood {k!r}; known: {', '.join(KINDS)}")
    pin = None if args.no_pin or (os.cpu_count() or 1) < 2 else (os.cpu_count() or 1) - 1

    tmp = tempfile.mkdtemp(prefix="kvtier-flood-")
    redis_server = shutil.which("redis-server")
    if not redis_server:
        raise SystemExit("redis-server is not on PATH (scripts/setup.sh installs it)")
    redis, port = start_redis(redis_server, tmp, pin)
    extra = f"""stores:
  tiers:
    - {{ kind: redis, nodes: ["127.0.0.1:{port}"], write: through }}
events:
  enabled: true
"""
    proc, sock = start_kvtierd(args.kvtierd, tmp, layers=2, kv_heads=2, head_dim=64, blocks=512, extra=extra)
    mp_ctx = mp.get_context("spawn")
    rows = []
    try:
        by = kvtier.Client(socket=sock, tenant="bystander")
        hot, cold = tokens_for(1, 8), tokens_for(2, 8)
        commit_prefix(by, "by-hot", hot)
        commit_prefix(by, "by-cold", cold)
        wait_in_store(by, cold, "by-cold")
        hog_tokens = tokens_for(3, 256)
        hog = kvtier.Client(socket=sock, tenant="hog")
        commit_prefix(hog, "hog-store", hog_tokens)
        wait_in_store(hog, hog_tokens, "hog-store", timeout=60)
        evict(hog, "hog-store")
        del hog
        measure(by, 0.5, hot, cold)  # Warm up.
        for r in range(args.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)] if kinds else []
            quiet = measure(by, args.phase_s, hot, cold)
            rows.append({"round": r, "kind": "quiet", **quiet})
            print(f"round {r} quiet: {quiet}", file=sys.stderr)
            for kind in order:
                stop = mp_ctx.Event()
                n = FLOODS[kind][1]
                procs = [mp_ctx.Process(target=flood_main, args=(kind, sock, stop, hog_tokens, pin), daemon=True)
                         for _ in range(n)]
                for pr in procs:
                    pr.start()
                time.sleep(0.5)  # The flood gets going (spawned interpreters start in ~0.2 s).
                row = measure(by, args.phase_s, hot, cold)
                stop.set()
                for pr in procs:
                    pr.join(10)
                    if pr.is_alive():
                        pr.kill()
                alive = proc.poll() is None
                rows.append({"round": r, "kind": kind, "kvtierd_alive": alive, **row})
                print(f"round {r} {kind}: {row}", file=sys.stderr)
                if not alive:
                    raise SystemExit(f"kvtierd died under {kind} (exit {proc.returncode})")
                time.sleep(0.3)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        redis.terminate()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    def ratios(kind, field):
        out = []
        for r in range(args.rounds):
            q = next(x for x in rows if x["round"] == r and x["kind"] == "quiet")[field]
            f = next((x for x in rows if x["round"] == r and x["kind"] == kind), {}).get(field)
            if q and f:
                out.append(f / q)
        return out

    summary = {}
    for kind in kinds:
        entry = {}
        for field in ("acquire_p50_us", "store_acquire_p50_us", "allocate_p50_us"):
            rs = ratios(kind, field)
            entry[field.replace("_us", "_ratio")] = (
                {"median": round(statistics.median(rs), 3), "min": round(min(rs), 3), "max": round(max(rs), 3)}
                if rs else None)
            flood = [x[field] for x in rows if x["kind"] == kind and x[field]]
            entry[field] = round(statistics.median(flood), 1) if flood else None
        entry["allocate_failures"] = sum(x["allocate_failures"] for x in rows if x["kind"] == kind)
        entry["store_hits"] = sum(x["store_hits"] for x in rows if x["kind"] == kind)
        a = entry["acquire_p50_ratio"]
        entry["acquire_within_2x"] = bool(a and a["median"] <= 2.0)
        summary[kind] = entry
    quiet = [x for x in rows if x["kind"] == "quiet"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    result = {
        "bench": "flood",
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "rounds": args.rounds,
        "phase_s": args.phase_s,
        "floods_pinned_to_cpu": pin,
        "quiet": {f: round(statistics.median([x[f] for x in quiet if x[f]]), 1)
                  for f in ("acquire_p50_us", "store_acquire_p50_us", "allocate_p50_us")
                  if any(x[f] for x in quiet)},
        "floods": summary,
        "all_within_2x": all(v["acquire_within_2x"] for v in summary.values()),
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"result": result, "rows": rows}, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
