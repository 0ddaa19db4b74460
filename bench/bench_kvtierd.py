"""What the Python benchmarks share: their kvtierd (a host-backend daemon on one
fp32 profile, of 16-token blocks unless told, configured and started in a scratch
directory), a scratch redis-server, their seeded Llama model, the bootstrap
interval of a median, and how a benchmark gives its result."""

import json
import os
import socket
import statistics
import subprocess
import time
import uuid

import kvtier

CONFIG = """\
instance: {instance}
socket: {socket}
backend: host
log_level: warn
profiles:
  - name: bench
    layers: {layers}
    kv_heads: {kv_heads}
    head_dim: {head_dim}
    dtype: fp32
    block_tokens: {block_tokens}
    gpu_blocks: {blocks}
    host_blocks: {blocks}
{extra}"""


def start_kvtierd(binary, tmp, layers, kv_heads, head_dim, blocks, extra="", block_tokens=16):
    """Starts kvtierd with `blocks` slots per tier (and `extra` configuration
    text, such as a stores: section); returns (process, socket) once it answers."""
    sock = os.path.join(tmp, "kvtierd.sock")
    path = os.path.join(tmp, "kvtierd.yaml")
    with open(path, "w") as f:
        f.write(CONFIG.format(instance="bench-" + uuid.uuid4().hex[:10], socket=sock, layers=layers,
                              kv_heads=kv_heads, head_dim=head_dim, blocks=blocks, extra=extra,
                              block_tokens=block_tokens))
    log = open(os.path.join(tmp, "kvtierd.log"), "a")  # A restart's log follows the killed one's.
    proc = subprocess.Popen([binary, "--config", path], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            kvtier.Client(socket=sock, connect_timeout=0.2).ping()
            return proc, sock
        except kvtier.UnavailableError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("kvtierd did not start; see " + log.name)


def start_redis(binary, tmp, pin=None):
    """Starts `binary` (redis-server) on a free loopback port with no persistence,
    held to CPU `pin` if given; returns (process, port) once it answers PING."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=None if pin is None else lambda: os.sched_setaffinity(0, {pin}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def bench_llama(layers, hidden, max_positions):
    """A seeded Llama of `layers` layers and width `hidden` (64-wide heads, as
    many KV heads as query heads), fp32, in eval mode."""
    import torch
    import transformers
    torch.manual_seed(0)
    heads = hidden // 64
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 3,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=heads, head_dim=64, max_position_embeddings=max_positions)
    return transformers.LlamaForCausalLM(config).eval()


def bootstrap_median_ci(x, rng, n=2000):
    """The median of `x` and its 95% percentile-bootstrap interval."""
    import numpy as np
    x = np.asarray(x)
    meds = np.median(rng.choice(x, size=(n, len(x)), replace=True), axis=1)
    return float(np.median(x)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def spread(xs):
    """The median of `xs`, its smallest and largest, and how many."""
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 3), "min": round(xs[0], 3), "max": round(xs[-1], 3),
            "n": len(xs)}


def ratio(xs, seed=0):
    """spread() of per-round ratios `xs`, with the median's 95% bootstrap interval (lo, hi)."""
    import numpy as np
    _, lo, hi = bootstrap_median_ci(xs, np.random.default_rng(seed))
    return {**spread(xs), "lo": round(lo, 3), "hi": round(hi, 3)}


def emit(result, out=""):
    """A benchmark's result: one JSON object as the last line of its output, and in
    the file `out` too when given."""
    line = json.dumps(result)
    if out:
        with open(out, "w") as f:
            f.write(line + "\n")
    print(line)
