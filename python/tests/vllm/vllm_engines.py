"""Helpers for the vLLM tests and benchmark: engine processes (engine.py) and the
small models they run."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, HERE)
from engine import RESULT_PREFIX  # noqa: E402

# vLLM's block size on its CPU backend: a kvtier block is one vLLM block.
BLOCK = 128

# The tiny model's KV: 4 layers x 4 KV heads x 64, fp32 (per tensor-parallel rank: kv_heads / tp),
# in blocks of vLLM's (1 MiB each).
PROFILE = """\
  - name: {name}
    layers: 4
    kv_heads: {kv_heads}
    head_dim: 64
    dtype: fp32
    block_tokens: {block_tokens}
    gpu_blocks: {gpu}
    host_blocks: {host}"""


def profile(gpu, host, name="tiny", block_tokens=BLOCK, kv_heads=4):
    return PROFILE.format(name=name, gpu=gpu, host=host, block_tokens=block_tokens, kv_heads=kv_heads)


def make_model(directory, seed=1):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tiny_model.py"), directory, "--seed",
                    str(seed), "--layers", "4", "--hidden", "256", "--heads", "4", "--kv-heads", "4", "--head-dim",
                    "64"], check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return directory


class Engine:
    """One vLLM engine process (an LLM); generate() sends it a batch of prompts."""

    def __init__(self, model, log_path, socket=None, extra=None, llm=None, kv_cache_bytes=128 << 20,
                 start_timeout=300, env=None, prefix=(), kv_transfer=None, python=None):
        """prefix: a command the engine runs under (a network namespace's `ip netns exec NAME`).
        kv_transfer: KVTransferConfig's arguments, for a connector other than kvtier's (then
        socket stays None); python: the interpreter to run it with (another environment's)."""
        # Replies come on a pipe of their own: vLLM's processes log to stdout and stderr, and a
        # long reply written there was once cut by another process's log line (its JSON unreadable).
        replies, replies_w = os.pipe()
        cfg = {"model": model, "socket": socket, "extra": extra or {}, "llm": llm or {},
               "kv_cache_bytes": kv_cache_bytes, "kv_transfer": kv_transfer, "result_fd": replies_w}
        env = {"HF_HUB_OFFLINE": "1", "VLLM_USE_V2_MODEL_RUNNER": "0", "TOKENIZERS_PARALLELISM": "false",
               # Every engine on every core. vLLM's automatic binding keeps two cores back from
               # an engine with a KV connector and one from one without (here, on two cores,
               # that left the connector's engines both cores and the others one): engines
               # compared with each other must get the same cores.
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
               **os.environ, **(env or {})}
        self.log_path = log_path
        self._log = open(log_path, "w")
        try:
            self.proc = subprocess.Popen([*prefix, python or sys.executable, os.path.join(HERE, "engine.py"),
                                          json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                                         pass_fds=(replies_w,))
        except BaseException:
            os.close(replies)
            raise
        finally:
            os.close(replies_w)
        self._results = queue.Queue()
        self._replies = os.fdopen(replies, "r")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._logger = threading.Thread(target=self._copy_log, daemon=True)
        self._logger.start()
        try:
            self.pid = self._next(start_timeout)["pid"]
        except BaseException:
            self.kill()
            raise

    def _read(self):
        try:
            for line in self._replies:
                if line.startswith(RESULT_PREFIX):
                    self._results.put(json.loads(line[len(RESULT_PREFIX):]))
        finally:  # The engine exited, or a reply was unreadable: whoever waits is told at once.
            self._results.put(None)

    def _copy_log(self):
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()

    def _next(self, timeout):
        try:
            r = self._results.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"vLLM engine gave no answer in {timeout} s; log {self.log_path}") from None
        if r is None:
            raise RuntimeError(f"vLLM engine exited ({self.proc.poll()}):\n" + self.log_tail())
        return r

    def log_tail(self, n=40):
        with open(self.log_path) as f:
            return "".join(f.readlines()[-n:])

    def generate(self, prompts, max_tokens=8, salts=None, timeout=300):
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_tokens": max_tokens, "salts": salts}) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout)["outputs"]

    def stream(self, prompts, at, events=(), max_tokens=8, timeout=600, salts=None):
        """Prompt i arrives at at[i] seconds while the engine steps (with salts[i]
        as its cache_salt, if given), and each event ({"at": s, "pid": p,
        "signal": "SIGKILL"}) is sent at its time (engine.py's stream)."""
        self.proc.stdin.write(json.dumps({"stream": True, "prompts": prompts, "at": list(at), "events": list(events),
                                          "max_tokens": max_tokens, "salts": salts}) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout)

    def metrics(self):
        """vLLM's metrics and the connector's (vllm:kvtier_*), summed over their labels."""
        self.proc.stdin.write(json.dumps({"metrics": True}) + "\n")
        self.proc.stdin.flush()
        return self._next(60)["metrics"]

    def quit(self):
        """Asks the engine to shut down, without waiting (stop() waits)."""
        if self.proc.poll() is None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass

    def stop(self):
        self.quit()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self):
        """SIGKILL to the engine and every process it started (its process group),
        except Python's resource tracker: once the others are gone it unlinks the
        shared memory and semaphores they registered (vLLM's message queues between
        its processes are hundreds of MiB of /dev/shm), as it does after any crash.
        What the engine's processes had mapped is unlinked here too, in case."""
        group = _group(self.proc.pid)
        tracker = [p for p in group if "resource_tracker" in _cmdline(p)]
        shm = set()
        for pid in group:
            shm |= _mapped_shm(pid)
        for pid in group:
            if pid not in tracker:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait()
        deadline = time.monotonic() + 10
        while any(_group_of(p) == self.proc.pid for p in group) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # Whatever is left, the tracker included.
        except ProcessLookupError:
            pass
        for path in shm:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._reader.join(10)
        self._logger.join(10)  # It writes the last lines of the log.
        self._log.close()


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


def process_state(pid):
    """The state letter /proc gives process pid ("T": stopped), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _group_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _group(pgid):
    """The live processes of process group pgid."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _group_of(int(p)) == pgid]


def _mapped_shm(pid):
    """Python multiprocessing's shared memory (/dev/shm/psm_*, sem.mp-*) that pid maps."""
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                path = parts[5].strip() if len(parts) == 6 else ""
                if path.startswith(("/dev/shm/psm_", "/dev/shm/sem.mp-")):
                    out.add(path.replace(" (deleted)", ""))
    except OSError:
        pass
    return {p for p in out if os.path.exists(p)}


def difference(got, want, tolerance=1e-3):
    """How one engine's output differs from another's for the same prompt, or None:
    greedy tokens equal, and each step's top-5 logprobs name the same tokens (a
    near tie at the fifth place may swap it) with values within fp32 rounding of
    a prefix computed in another pass."""
    if got["tokens"] != want["tokens"]:
        return f"tokens {got['tokens']} != {want['tokens']}"
    for step, (g, w) in enumerate(zip(got["logprobs"], want["logprobs"])):
        common = set(g) & set(w)
        if len(common) < 4:
            return f"step {step}: top-5 tokens {sorted(g)} against {sorted(w)}"
        for t in common:
            if abs(g[t] - w[t]) > tolerance:
                return f"step {step}: logprob of token {t} {g[t]} against {w[t]} (off by {abs(g[t] - w[t]):.2e})"
    return None


def same(outputs, expected, tolerance=1e-3):
    """Asserts that every output is its expected one's (difference)."""
    assert len(outputs) == len(expected)
    for i, (got, want) in enumerate(zip(outputs, expected)):
        why = difference(got, want, tolerance)
        assert why is None, f"output {i}: {why}"


NO_APC = {"enable_prefix_caching": False}  # An engine without its own prefix cache: every hit comes from kvtierd.


def hit(n):
    """What a prompt of n tokens loads when all of it is cached: every whole vLLM
    block except the one holding its last token."""
    return (n - 1) // BLOCK * BLOCK


def kvtierd_stats(sock):
    """kvtierd's figures (cachectl --json stats)."""
    return json.loads(subprocess.run([os.environ["CACHECTL"], "--socket", sock, "--json", "stats"],
                                     capture_output=True, text=True, check=True).stdout)


def store_total(stats, suffix):
    """A per-store counter (store.<name>.<suffix>) summed over kvtierd's stores."""
    return sum(v for k, v in stats.items() if k.startswith("store.") and k.endswith("." + suffix))


def prompt(seed, n, vocab=190):
    """n token ids of the tiny model's vocabulary, a function of seed."""
    return [7 + (seed * 7919 + i * 37 + (i * i) % 11) % (vocab - 7) for i in range(n)]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
