"""The "chat" and "faults" cases of the side-by-side benchmark (peer_bench.py).

chat: multi-turn conversations from several concurrent clients through a real
router (vllm-router, round_robin and cache_aware) in front of two
OpenAI-compatible vLLM servers per system, each server's own KV cache smaller
than the conversations' working set, so that its prefix cache evicts. Every
conversation shares one system prompt and has a document of its own in its
first turn; each turn a user message, a streamed reply (greedy) that is
appended to the history. Per system and policy: requests/s, output tokens/s,
TTFT p50 and p99 (client side: the first content chunk), the hit rate (vLLM's
/metrics: prompt tokens from the server's own prefix cache and from the
connector), and the replies that differ from those of the "none" system (no
connector) for the same conversations. A conversation whose reply differed has
another history from then on: it is counted as diverged and compared no
further. A calibration runs "none" on the round_robin conversations again
through the cache_aware router: how often the reference differs from itself
(batches differ; on CPU a near tie can flip).

Each round draws new conversations per policy (a tag at the start of the
system prompt keeps one set's blocks from matching another's); every system
serves the same set, in an order that rotates from round to round. One
system's two vLLM servers run at a time (Fleet), started for its turn in a
round and stopped after it: six at once (~3 GiB each) do not fit beside the
cache servers in 24 GiB.

faults: the same chat, through the round_robin router, while the cache server
is SIGKILLed and restarted after a pause (and, for kvtier, SIGSTOPped for a few
seconds and continued). Counted: failed requests, replies that differ from the
reference, and the seconds from the restart (or SIGCONT) until the connector's
hits come back. Whatever happens is recorded as it happens.

run_cases(...) runs both (run_chat and run_faults: one) and returns JSON-able dicts; add_args(parser)
registers their options. Run as a script for a small stand-alone run:
  PYTHONPATH=build/python python bench/peer_chat.py --kvtierd build/daemon/kvtierd --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python", "tests", "vllm"))
import vllm_engines  # noqa: E402
from peers import VLLM_CPU_BLOCK, System, free_port, peer_env  # noqa: E402

SERVED_NAME = "chat-model"
POLICIES = ("round_robin", "cache_aware")
SUFFIX = {"round_robin": "rr", "cache_aware": "cache_aware"}

# The words the prompts are drawn from (each mostly one token of a Llama-style vocabulary).
WORDS = """able about above across after again against almost along already also always among animal another answer
any appear area around ask away back base bear beauty bed before began begin behind believe below best better between big
bird black blue boat body book both bottom box boy bring brought build busy call came can car care carry case cat cause
center certain change check child children city class clear close cloud cold color come common complete contain correct
could country course cover cross cry current dark day decide deep develop did differ direction distant does dog door down
draw dream drive dry during each early earth east eat edge egg end enough even evening ever every example eye face fact
fall family far farm fast father feel feet few field figure fill final find fine fire first fish five floor follow food
foot force form found four free friend front full game garden gave general get girl give glass gold good govern great
green ground group grow half hand happen hard have head hear heard heat heavy help here high hill hold hole home hope horse
hot hour house however hundred idea inch interest island just keep kind king knew know land language large last late laugh
lay lead learn least leave left less letter level life light line list listen little live long look love low machine made
main make many map mark matter mean measure meet metal middle might mile mind minute miss money moon more morning most
mother mountain move much music must name near need never new next night north note nothing notice number object ocean
off often old once open order other over own page paper part party pass past pattern people perhaps person picture piece
place plain plan plant play point port pose possible pound power press pretty problem produce product pull put question
quick rain ran reach read ready real reason record red remember rest rich ride right river road rock room round rule run
safe said sail same sand saw say school science sea season seat second see seem sell send sense sentence serve set several
shape share ship short should show side sign simple since sing sister sit six size sleep slow small snow some song soon
sound south space speak special spell spring square stand star start state stay step still stone stood stop store story
street strong study such summer sun sure surface table tail take talk teach tell ten test than that their them then there
these thing think third those though thought thousand three through time tiny together told too took top total toward
town track trade train travel tree true try turn two under unit until upon usual valley very voice vowel wait walk wall
want warm wash watch water wave way weather week weight well went west what wheel where which while white whole why wide
wild will wind window winter wish with without woman wonder wood word work world would write year yellow young""".split()


def add_args(p: argparse.ArgumentParser) -> None:
    """The chat and faults options (defaults sized for a 2-core machine: a full
    round, three systems and both policies, in a few minutes)."""
    g = p.add_argument_group("chat and faults")
    g.add_argument("--chat-conversations", type=int, default=6, help="conversations per system, policy and round")
    g.add_argument("--chat-clients", type=int, default=3, help="concurrent clients (each runs conversations in turn)")
    g.add_argument("--chat-turns", default="3-4", help="turns per conversation (a range, drawn per conversation)")
    g.add_argument("--chat-system-tokens", type=int, default=500, help="tokens of the shared system prompt")
    g.add_argument("--chat-document-tokens", type=int, default=1000, help="tokens of each conversation's document")
    g.add_argument("--chat-user-tokens", default="120-160", help="tokens of each user message (a range)")
    g.add_argument("--chat-reply-tokens", default="32-64", help="max_tokens of each reply (a range)")
    g.add_argument("--chat-kv-cache-mib", type=int, default=160,
                   help="each vLLM server's KV cache (MiB): smaller than the conversations' working set")
    g.add_argument("--chat-max-model-len", type=int, default=3072)
    g.add_argument("--chat-rounds", type=int, default=0, help="chat rounds (default: --rounds, else 3)")
    g.add_argument("--chat-policies", default=",".join(POLICIES), help="the router's policies, comma-separated")
    g.add_argument("--chat-no-calibrate", action="store_true",
                   help="skip the reference's run against itself (none, round_robin's conversations, cache_aware)")
    g.add_argument("--chat-request-timeout", type=float, default=180.0, help="seconds a request may take")
    g.add_argument("--chat-run-timeout", type=float, default=900.0,
                   help="seconds one system's chat run may take; turns not started by then are skipped and counted")
    g.add_argument("--chat-server-timeout", type=float, default=900.0, help="seconds to wait for the vLLM servers")
    g.add_argument("--chat-settle", type=float, default=1.5,
                   help="seconds between runs (a vLLM worker busy-polls a core for a second after its last step)")
    g.add_argument("--faults-conversations", type=int, default=0, help="default: 2 x --chat-conversations")
    g.add_argument("--faults-kill-after", type=float, default=0.3,
                   help="SIGKILL the cache server once this fraction of the requests completed")
    g.add_argument("--faults-stop-after", type=float, default=0.6,
                   help="kvtier: SIGSTOP kvtierd once this fraction of the requests completed")
    g.add_argument("--faults-pause", type=float, default=1.0, help="seconds between the SIGKILL and the restart")
    g.add_argument("--faults-stop-seconds", type=float, default=3.0, help="seconds kvtierd stays stopped")
    g.add_argument("--faults-policy", default="round_robin", choices=POLICIES)


def _range(spec: str) -> tuple[int, int]:
    lo, _, hi = str(spec).partition("-")
    return int(lo), int(hi or lo)


def smoke_args(args: argparse.Namespace) -> argparse.Namespace:
    """The smoke mode's sizes: one round of two tiny conversations."""
    a = argparse.Namespace(**vars(args))
    a.chat_conversations, a.chat_clients, a.chat_turns = 3, 3, "2-2"
    # A system prompt past one 128-token block, so that the faults case's probe has a block to ask for.
    a.chat_system_tokens, a.chat_document_tokens, a.chat_user_tokens, a.chat_reply_tokens = 160, 160, "24-32", "4-8"
    a.chat_rounds, a.faults_conversations = 1, 3
    a.chat_kv_cache_mib, a.chat_max_model_len = 64, 1024
    a.faults_stop_seconds = 2.0
    # A request that hangs (LMCache's engines wait on a server that was killed) fails
    # in 30 s, and a run ends in 90 s, rather than the full run's 180 s and 900 s.
    a.chat_request_timeout, a.chat_run_timeout = 30.0, 90.0
    return a


# ---------------------------------------------------------------- conversations

class Texts:
    """Text of a given number of tokens (the model's tokenizer), from WORDS."""

    def __init__(self, model: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(model)

    def make(self, rng: random.Random, n: int) -> str:
        words = []
        while True:
            words += [rng.choice(WORDS) for _ in range(n + 8)]
            text = " ".join(words)
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            if len(enc["input_ids"]) > n:
                cut = enc["offset_mapping"][n][0]
                return text[:cut].rstrip()

    def count(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])


def make_conversations(texts: Texts, rng: random.Random, n: int, tag: str, a: argparse.Namespace) -> dict:
    """n conversations that share one system prompt (tagged, so that no other set
    shares its blocks): {"system": str, "conversations": [{"id", "turns": [{"user",
    "max_tokens"}]}]}. The document is the start of each first user message."""
    system = (f"Session {tag}. You are a careful assistant who answers questions about the document the user gives. "
              + texts.make(rng, a.chat_system_tokens))
    turns_lo, turns_hi = _range(a.chat_turns)
    user_lo, user_hi = _range(a.chat_user_tokens)
    reply_lo, reply_hi = _range(a.chat_reply_tokens)
    convs = []
    for i in range(n):
        turns = []
        for t in range(rng.randint(turns_lo, turns_hi)):
            user = texts.make(rng, rng.randint(user_lo, user_hi))
            if t == 0:
                user = "Here is a document.\n\n" + texts.make(rng, a.chat_document_tokens) + "\n\nQuestion: " + user
            turns.append({"user": user, "max_tokens": rng.randint(reply_lo, reply_hi)})
        convs.append({"id": i, "turns": turns})
    return {"tag": tag, "system": system, "conversations": convs}


# ---------------------------------------------------------------- processes

def _group_pids(pgid: int) -> list[int]:
    return vllm_engines._group(pgid)


def _mapped_shm(pids: list[int]) -> set[str]:
    """Python multiprocessing's shared memory that any of pids maps (vllm_engines's)."""
    return set().union(*(vllm_engines._mapped_shm(p) for p in pids))


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to proc's process group, SIGKILL to whatever is left after `grace`
    seconds; then the POSIX shared memory its processes had mapped is unlinked
    (vLLM's message queues), in case a killed process left it."""
    if proc.poll() is None or _group_pids(proc.pid):
        shm = _mapped_shm(_group_pids(proc.pid))
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while _group_pids(proc.pid) and time.monotonic() < deadline:
            proc.poll()
            time.sleep(0.2)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for path in shm:
            try:
                os.unlink(path)
            except OSError:
                pass


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value summed over labels}; the counters split by
    source (prompt tokens) are also kept as name[source]."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        try:
            v = float(value)
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + v
        if 'source="' in labels:
            source = labels.split('source="', 1)[1].split('"', 1)[0]
            out[f"{name}[{source}]"] = out.get(f"{name}[{source}]", 0.0) + v
    return out


class Server:
    """One OpenAI-compatible vLLM server of a system (its connector, its interpreter)."""

    def __init__(self, system: System, model: str, log: str, a: argparse.Namespace):
        self.system, self.model, self.log_path = system, model, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [system.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--enforce-eager", "--seed", "0", "--max-model-len", str(a.chat_max_model_len),
               "--kv-cache-memory-bytes", str(a.chat_kv_cache_mib << 20), "--enable-prompt-tokens-details",
               "--disable-uvicorn-access-log", "--generation-config", "vllm"]
        kv = system.kv_transfer()
        if kv:
            cmd += ["--kv-transfer-config", json.dumps(kv)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_USE_V2_MODEL_RUNNER": "0", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND",
                                                           f"0-{(os.cpu_count() or 1) - 1}")}
        self._log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()
        self.ready_s: float | None = None

    def poll_ready(self) -> bool:
        if self.ready_s is not None:
            return True
        if self.proc.poll() is not None:
            raise RuntimeError(f"vLLM server of {self.system.name} exited ({self.proc.returncode}): {self.log_tail()}")
        try:
            _get(self.url + "/health", 1)
        except OSError:
            return False
        self.ready_s = round(time.monotonic() - self.started, 1)
        return True

    def log_tail(self, n: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def metrics(self) -> dict[str, float]:
        return parse_metrics(_get(self.url + "/metrics").decode())

    def lost(self, why: BaseException) -> dict:
        """What is known of a server that stopped answering: its exit status and
        the last error its log gives."""
        code = self.proc.poll()
        lines = [x.strip() for x in self.log_tail(200).splitlines() if "Error" in x or "error" in x]
        return {"url": self.url, "exit_code": code, "unreachable": f"{type(why).__name__}: {why}"[:200],
                "last_error": lines[-1][-400:] if lines else None}

    def stop(self) -> None:
        stop_group(self.proc)
        self._log.close()


class Router:
    """vllm-router (the peers' environment) with one policy in front of `urls`."""

    def __init__(self, urls: list[str], policy: str, log: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "a")
        binary = os.path.join(peer_env(), "bin", "vllm-router")
        self.proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                                      "--worker-urls", *urls, "--worker-startup-check-interval", "1"],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited ({self.proc.returncode}); see {log}")
            try:
                _get(self.url + "/health", 1)
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"vllm-router did not answer in 180 s; see {log}")

    def stop(self) -> None:
        stop_group(self.proc, grace=5)
        self._log.close()


class Fleet:
    """Two vLLM servers per system, started together and kept until close(); the
    systems' cache servers are started here if they were not already (and then
    stopped by close())."""

    def __init__(self, systems: list[System], model: str, run_dir: str, a: argparse.Namespace, smoke: bool = False):
        self.systems = {s.name: s for s in systems}
        self.model, self.run_dir, self.args = model, run_dir, smoke_args(a) if smoke else a
        self.servers: dict[str, list[Server]] = {}
        self._started: list[System] = []

    def start(self) -> dict:
        """Starts every system's servers at once and waits for all; returns how long each took."""
        t0 = time.monotonic()
        try:
            for s in self.systems.values():
                if s.name != "none" and not s.alive():
                    s.start(self.run_dir)
                    self._started.append(s)
            for s in self.systems.values():
                os.makedirs(os.path.join(self.run_dir, "chat"), exist_ok=True)
                self.servers[s.name] = [Server(s, self.model, os.path.join(self.run_dir, "chat", f"{s.name}-{i}.log"),
                                               self.args) for i in range(2)]
            every = [v for vs in self.servers.values() for v in vs]
            deadline = time.monotonic() + self.args.chat_server_timeout
            while not all(v.poll_ready() for v in every):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM servers not ready in {self.args.chat_server_timeout} s")
                time.sleep(1)
            for v in every:  # A server's first request pays for its set-up.
                _chat_once(v.url, [{"role": "user", "content": "Say hello."}], 4, 300)
        except BaseException:
            self.close()
            raise
        return {"seconds": round(time.monotonic() - t0, 1),
                "ready_s": {k: [v.ready_s for v in vs] for k, vs in self.servers.items()}}

    def urls(self, name: str) -> list[str]:
        return [v.url for v in self.servers[name]]

    def metrics(self, name: str) -> list[dict[str, float]]:
        return [v.metrics() for v in self.servers[name]]

    def poll(self, name: str) -> list[tuple[Server, dict[str, float] | OSError]]:
        """Each server's counters, or the error of one that no longer answers."""
        out: list[tuple[Server, dict[str, float] | OSError]] = []
        for v in self.servers[name]:
            try:
                out.append((v, v.metrics()))
            except OSError as e:
                out.append((v, e))
        return out

    def metrics_after(self, name: str, before: list[dict[str, float]]) -> tuple[list[dict[str, float]], list[dict]]:
        """The servers' counters after a run, and what is known of each server that
        no longer answers (its counters are taken as they were before: the run's
        requests and failures still count, its hit rates are lost)."""
        polled = self.poll(name)
        out = [b if isinstance(m, OSError) else m for (_, m), b in zip(polled, before)]
        return out, [v.lost(m) for v, m in polled if isinstance(m, OSError)]

    def cpu_seconds(self, name: str) -> dict:
        """CPU seconds (user + system) so far of the system's vLLM servers (each
        with every process under it) and of its cache server (with its pid: a
        restarted one starts again from zero)."""
        from peers import proc_footprint
        system = self.systems[name]
        pid = system.pid()
        return {"engines": sum(proc_footprint(v.proc.pid)["cpu_seconds"] for v in self.servers[name]),
                "cache_server": proc_footprint(pid)["cpu_seconds"] if pid else None, "cache_server_pid": pid}

    def footprint(self) -> dict:
        from peers import proc_footprint
        return {k: [proc_footprint(v.proc.pid) for v in vs] for k, vs in self.servers.items()}

    def close(self) -> None:
        threads = [threading.Thread(target=v.stop) for vs in self.servers.values() for v in vs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.servers = {}
        for s in self._started:
            s.stop()
        self._started = []


# ---------------------------------------------------------------- clients

def _client(url: str, timeout: float):
    import openai
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=timeout)


def _chat_once(url: str, messages: list[dict], max_tokens: int, timeout: float, client=None) -> dict:
    """One streamed chat completion: its reply, TTFT (first content chunk) and usage."""
    client = client or _client(url, timeout)
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=max_tokens,
                                            temperature=0, seed=0, stream=True,
                                            stream_options={"include_usage": True}, timeout=timeout)
    ttft = None
    parts: list[str] = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    return {"reply": "".join(parts), "ttft": ttft if ttft is not None else time.perf_counter() - t0,
            "latency": time.perf_counter() - t0, "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "cached_tokens": getattr(details, "cached_tokens", None) if details else None}


def converse(url: str, convset: dict, clients: int, request_timeout: float, run_timeout: float,
             progress=None) -> dict:
    """Every conversation of `convset` through `url` (a router), `clients` at a
    time, each turn after the last one's reply; returns per-turn records and the
    run's wall time. A turn that fails is recorded and the conversation goes on
    without it (its history then differs from the reference's)."""
    convs = list(convset["conversations"])
    lock = threading.Lock()
    records: dict[int, list[dict]] = {c["id"]: [] for c in convs}
    t0 = time.monotonic()
    deadline = t0 + run_timeout

    def worker() -> None:
        client = _client(url, request_timeout)
        while True:
            with lock:
                if not convs:
                    return
                conv = convs.pop(0)
            history = [{"role": "system", "content": convset["system"]}]
            for t, turn in enumerate(conv["turns"]):
                rec: dict = {"conv": conv["id"], "turn": t, "start": round(time.monotonic() - t0, 3)}
                left = deadline - time.monotonic()
                if left <= 0:
                    rec["skipped"] = True
                else:
                    msgs = history + [{"role": "user", "content": turn["user"]}]
                    try:
                        rec.update(_chat_once(url, msgs, turn["max_tokens"], min(request_timeout, left), client))
                        history = msgs + [{"role": "assistant", "content": rec["reply"]}]
                    except Exception as e:  # Any failure of the request, as the client saw it.
                        rec["error"] = f"{type(e).__name__}: {e}"[:300]
                rec["end"] = round(time.monotonic() - t0, 3)
                with lock:
                    records[conv["id"]].append(rec)
                if progress:
                    progress(rec)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"records": records, "wall_s": time.monotonic() - t0, "t0": t0}


def compare(records: dict, reference: dict | None) -> dict:
    """Replies that differ from the reference's, turn by turn; a conversation
    whose reply differed (or whose turn failed on either side) is compared no further."""
    if reference is None:
        return {"compared": 0, "different": None, "diverged_conversations": None}
    compared = different = diverged = 0
    for cid, recs in records.items():
        ref = {r["turn"]: r for r in reference.get(cid, [])}
        for r in sorted(recs, key=lambda r: r["turn"]):
            want = ref.get(r["turn"])
            if "reply" not in r or want is None or "reply" not in want:
                diverged += 1
                break
            compared += 1
            if r["reply"] != want["reply"]:
                different += 1
                diverged += 1
                break
    return {"compared": compared, "different": different, "diverged_conversations": diverged}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _delta(after: list[dict], before: list[dict], key: str) -> float:
    return sum(a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before))


def profile(ok: list[dict], before: list[dict], after: list[dict], cpu: tuple[dict, dict], computed: float) -> dict:
    """Where a run's time went: the CPU seconds the system's two vLLM servers and
    its cache server spent (the machine's two cores are the budget both systems
    share), the prompt tokens the engines computed, the seconds vLLM counts per
    request in its queue, its prefill and its decode (summed over requests:
    requests overlap, so these add to more than the run's wall time), and the
    seconds kvtier's connector counts in its loads and saves."""
    n = len(ok) or 1
    out: dict = {"computed_prompt_tokens": int(computed)}
    for k in ("queue", "prefill", "decode"):
        out[f"{k}_s"] = round(_delta(after, before, f"vllm:request_{k}_time_seconds_sum"), 2)
    for k in ("load", "save"):
        key = f"vllm:kvtier_{k}_seconds_total"
        if key in after[0]:
            out[f"connector_{k}_s"] = round(_delta(after, before, key), 3)
    b, a = cpu
    out["engine_cpu_s"] = round(a["engines"] - b["engines"], 2)
    same = a["cache_server_pid"] is not None and a["cache_server_pid"] == b["cache_server_pid"]
    out["cache_server_cpu_s"] = round(a["cache_server"] - b["cache_server"], 2) if same else None
    tokens = sum(r["completion_tokens"] for r in ok)
    per = {"engine_cpu_s_per_request": out["engine_cpu_s"] / n, "computed_prompt_tokens_per_request": computed / n,
           "prefill_s_per_request": out["prefill_s"] / n, "decode_s_per_request": out["decode_s"] / n,
           "queue_s_per_request": out["queue_s"] / n}
    if tokens:
        per["engine_cpu_ms_per_output_token"] = 1000 * out["engine_cpu_s"] / tokens
    out.update({k: round(v, 4) for k, v in per.items()})
    return out


PROFILE_KEYS = ("engine_cpu_s_per_request", "engine_cpu_ms_per_output_token", "computed_prompt_tokens_per_request",
                "prefill_s_per_request", "decode_s_per_request", "queue_s_per_request")


def summarize(run: dict, before: list[dict], after: list[dict], cpu: tuple[dict, dict]) -> dict:
    """A run's figures: throughput, TTFT, failures, the servers' hit rates, and
    where the time went (profile)."""
    recs = [r for rs in run["records"].values() for r in rs]
    ok = [r for r in recs if "reply" in r]
    ttft = [r["ttft"] * 1000 for r in ok]
    prompt = _delta(after, before, "vllm:prompt_tokens_total")
    local = _delta(after, before, "vllm:prompt_tokens_by_source_total[local_cache_hit]")
    external = _delta(after, before, "vllm:prompt_tokens_by_source_total[external_kv_transfer]")
    out = {
        "requests": len(ok), "failed": sum(1 for r in recs if "error" in r),
        "skipped": sum(1 for r in recs if r.get("skipped")), "wall_s": round(run["wall_s"], 2),
        "requests_per_s": round(len(ok) / run["wall_s"], 4),
        "output_tokens_per_s": round(sum(r["completion_tokens"] for r in ok) / run["wall_s"], 3),
        "output_tokens": sum(r["completion_tokens"] for r in ok),
        "ttft_p50_ms": round(_pct(ttft, 0.5), 1) if ttft else None,
        "ttft_p99_ms": round(_pct(ttft, 0.99), 1) if ttft else None,
        "prompt_tokens": int(prompt),
        "hit_rate": round((local + external) / prompt, 4) if prompt else None,
        "own_cache_hit_rate": round(local / prompt, 4) if prompt else None,
        "connector_hit_rate": round(external / prompt, 4) if prompt else None,
        "external_queries": int(_delta(after, before, "vllm:external_prefix_cache_queries_total")),
        "external_hits": int(_delta(after, before, "vllm:external_prefix_cache_hits_total")),
        "preemptions": int(_delta(after, before, "vllm:num_preemptions_total")),
        "requests_per_server": [int(a.get("vllm:request_success_total", 0) - b.get("vllm:request_success_total", 0))
                                for a, b in zip(after, before)],
    }
    kv = {k.split(":", 1)[1]: int(_delta(after, before, k)) for k in after[0]
          if k.startswith("vllm:kvtier_") and k.endswith("_total") and not k.endswith("seconds_total")}
    if kv:
        out["kvtier_counters"] = kv
    out["profile"] = profile(ok, before, after, cpu, prompt - local - external)
    errors = sorted({r["error"] for r in recs if "error" in r})
    if errors:
        out["errors"] = errors[:5]
    out["ttft_ms"] = [round(x, 1) for x in ttft]  # Every request's, in completion order (the plots' distributions).
    return out


def run_one(fleet: Fleet, name: str, policy: str, convset: dict, a: argparse.Namespace, label: str,
            during=None) -> dict:
    """One system's chat run on `convset` through a new router of `policy`;
    during(run_context) runs beside it on a thread (the faults)."""
    urls = fleet.urls(name)
    router = Router(urls, policy, os.path.join(fleet.run_dir, "chat", f"router-{name}-{policy}.log"))
    try:
        before = fleet.metrics(name)
        cpu_before = fleet.cpu_seconds(name)
        done = {"n": 0, "t0": time.monotonic()}
        cond = threading.Condition()

        def progress(rec: dict) -> None:
            with cond:
                done["n"] += 1
                cond.notify_all()

        side = None
        if during:
            side = threading.Thread(target=during, args=(fleet, done, cond), daemon=True)
            side.start()
        run = converse(router.url, convset, a.chat_clients, a.chat_request_timeout, a.chat_run_timeout, progress)
        with cond:
            done["finished"] = True
            cond.notify_all()
        if side:
            side.join(120)
        after, lost = fleet.metrics_after(name, before)
        cpu_after = fleet.cpu_seconds(name)
    finally:
        router.stop()
    s = summarize(run, before, after, (cpu_before, cpu_after))
    if lost:
        s["servers_lost"] = lost
    print(f"  chat {label} {name:8s} {SUFFIX[policy]:11s}: {s['requests']} requests in {s['wall_s']:.1f} s, "
          f"{s['requests_per_s']:.3f} req/s, {s['output_tokens_per_s']:.1f} tok/s, TTFT p50 {s['ttft_p50_ms']} p99 "
          f"{s['ttft_p99_ms']} ms, hit rate {s['hit_rate']} (own {s['own_cache_hit_rate']}, connector "
          f"{s['connector_hit_rate']}), failed {s['failed']}; engines' CPU {s['profile'].get('engine_cpu_s')} s, "
          f"{s['profile']['computed_prompt_tokens']} prompt tokens computed", file=sys.stderr, flush=True)
    return {"summary": s, "records": run["records"], "t0": run["t0"]}


# ---------------------------------------------------------------- aggregation

def spread(xs: list[float]) -> dict | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return {"median": round(statistics.median(xs), 4), "min": round(xs[0], 4), "max": round(xs[-1], 4), "n": len(xs)}


def _ratio(xs: list, ys: list) -> list[float]:
    return [x / y for x, y in zip(xs, ys) if x is not None and y]


def _rounds(a: argparse.Namespace, smoke: bool) -> int:
    if smoke:
        return 1
    return a.chat_rounds or getattr(a, "rounds", 0) or 3


def run_cases(systems: list[System], model: str, run_dir: str, args: argparse.Namespace, rng: random.Random,
              smoke: bool = False, cases: tuple = ("chat", "faults")) -> dict:
    """The chat and faults cases, round by round: each round draws its
    conversations (one set per policy), then each system in an order that rotates
    from round to round starts its two vLLM servers (one system's at a time: six
    servers at once do not fit in 24 GiB beside the cache servers), serves every
    policy's set (in a rotating order too), and stops them. "none" also serves
    the calibration run; in the first round each system also serves the faults
    set (the reference for "none"; the faults for the others). Returns
    {"chat": {...}, "faults": {...}} for the cases asked for."""
    a = smoke_args(args) if smoke else args
    policies = [p for p in a.chat_policies.split(",") if p]
    names = [s.name for s in systems]
    by_name = {s.name: s for s in systems}
    texts = Texts(model)
    t0 = time.monotonic()
    runs: dict = {n: {p: [] for p in policies} for n in names}
    again: list[tuple[int, dict]] = []
    sets: list[dict] = []
    started: list[dict] = []
    faults_set = None
    total = 0
    fault_ref = None
    faulted: dict = {}
    if "faults" in cases:
        n = a.faults_conversations or 2 * a.chat_conversations
        faults_set = make_conversations(texts, rng, n, f"faults-{rng.getrandbits(32):08x}", a)
        total = sum(len(c["turns"]) for c in faults_set["conversations"])
    rounds = _rounds(a, smoke) if "chat" in cases else 1
    for r in range(rounds):
        convsets = {p: make_conversations(texts, rng, a.chat_conversations,
                                          f"{r}-{SUFFIX[p]}-{rng.getrandbits(32):08x}", a)
                    for p in policies} if "chat" in cases else {}
        sets.append({p: {"tag": c["tag"], "turns": sum(len(x["turns"]) for x in c["conversations"])}
                     for p, c in convsets.items()})
        for n in names[r % len(names):] + names[:r % len(names)]:
            fleet = Fleet([by_name[n]], model, run_dir, args, smoke)
            try:
                started.append({"round": r + 1, "system": n, **fleet.start()})
                if "chat" in cases:
                    for p in policies[r % len(policies):] + policies[:r % len(policies)]:
                        time.sleep(a.chat_settle)
                        runs[n][p].append(run_one(fleet, n, p, convsets[p], a, f"round {r + 1}"))
                    if n == "none" and not a.chat_no_calibrate and {"round_robin", "cache_aware"} <= set(policies):
                        time.sleep(a.chat_settle)
                        again.append((r, run_one(fleet, "none", "cache_aware", convsets["round_robin"], a,
                                                 f"round {r + 1} calibration")))
                if faults_set is not None and r == 0:
                    time.sleep(a.chat_settle)
                    if n == "none":
                        fault_ref = run_one(fleet, "none", a.faults_policy, faults_set, a, "faults reference")
                    else:
                        faulted[n] = _fault_run(fleet, by_name[n], n, faults_set, total, a, texts)
            finally:
                fleet.close()
    out: dict = {}
    if "chat" in cases:
        calib = [compare(x["records"], runs["none"]["round_robin"][r]["records"]) for r, x in again]
        chat = _chat_result(runs, names, policies, calib, a, smoke)
        chat.update({"seconds": round(time.monotonic() - t0, 1), "servers_started": started, "sets": sets})
        out["chat"] = chat
    if faults_set is not None:
        out["faults"] = _faults_result(faulted, fault_ref, faults_set, total, a, smoke)
    return out


def run_chat(systems: list[System], model: str, run_dir: str, args: argparse.Namespace, rng: random.Random,
             smoke: bool = False) -> dict:
    """The chat case alone (run_cases)."""
    return run_cases(systems, model, run_dir, args, rng, smoke, ("chat",))["chat"]


def _chat_result(runs: dict, names: list[str], policies: list[str], calib: list[dict], a, smoke: bool) -> dict:
    detail: dict = {}
    for n in names:
        for p in policies:
            rs = runs[n][p]
            ref = runs.get("none", {}).get(p)
            cmp = [compare(r["records"], ref[i]["records"]) if ref and n != "none" else None for i, r in enumerate(rs)]
            sm = [r["summary"] for r in rs]
            detail.setdefault(n, {})[SUFFIX[p]] = {
                **{k: spread([s[k] for s in sm]) for k in ("requests_per_s", "output_tokens_per_s", "ttft_p50_ms",
                                                          "ttft_p99_ms", "hit_rate", "own_cache_hit_rate",
                                                          "connector_hit_rate", "wall_s")},
                "failed": sum(s["failed"] for s in sm), "skipped": sum(s["skipped"] for s in sm),
                "requests": sum(s["requests"] for s in sm),
                "different": sum(c["different"] for c in cmp) if all(cmp) else None,
                "compared": sum(c["compared"] for c in cmp) if all(cmp) else None,
                "diverged_conversations": sum(c["diverged_conversations"] for c in cmp) if all(cmp) else None,
                "profile": {k: spread([s["profile"].get(k) for s in sm]) for k in PROFILE_KEYS},
                "rounds": sm,
            }
    out: dict = {"case": "chat", "rounds": len(runs[names[0]][policies[0]]), "policies": policies,
                 "conversations": a.chat_conversations, "clients": a.chat_clients, "turns": a.chat_turns,
                 "system_tokens": a.chat_system_tokens, "document_tokens": a.chat_document_tokens,
                 "user_tokens": a.chat_user_tokens, "reply_tokens": a.chat_reply_tokens,
                 "server_kv_cache_mib": a.chat_kv_cache_mib, "servers_per_system": 2, "smoke": smoke,
                 "detail": detail}
    if calib:
        out["reference_vs_itself"] = {"compared": sum(c["compared"] for c in calib),
                                      "different": sum(c["different"] for c in calib),
                                      "diverged_conversations": sum(c["diverged_conversations"] for c in calib),
                                      "what": "none on round_robin's conversations again, through cache_aware"}
    figures: dict = {}
    targets: dict = {}
    if "kvtier" in names and "lmcache" in names:
        for p in policies:
            k = [r["summary"] for r in runs["kvtier"][p]]
            m = [r["summary"] for r in runs["lmcache"][p]]
            thr = spread(_ratio([x["requests_per_s"] for x in k], [x["requests_per_s"] for x in m]))
            tok = spread(_ratio([x["output_tokens_per_s"] for x in k], [x["output_tokens_per_s"] for x in m]))
            p99 = spread(_ratio([x["ttft_p99_ms"] for x in k], [x["ttft_p99_ms"] for x in m]))
            sfx = SUFFIX[p]
            figures[f"chat_throughput_kvtier_vs_lmcache_{sfx}"] = thr["median"] if thr else None
            figures[f"chat_ttft_p99_kvtier_vs_lmcache_{sfx}"] = p99["median"] if p99 else None
            out[f"chat_throughput_kvtier_vs_lmcache_{sfx}_spread"] = thr
            out[f"chat_output_tokens_kvtier_vs_lmcache_{sfx}_spread"] = tok
            out[f"chat_ttft_p99_kvtier_vs_lmcache_{sfx}_spread"] = p99
            # Where the difference comes from: the engines' CPU per request, and the prompt
            # tokens they computed per request (what the caches left them).
            for key in ("engine_cpu_s_per_request", "computed_prompt_tokens_per_request"):
                out[f"chat_{key}_kvtier_vs_lmcache_{sfx}_spread"] = spread(
                    _ratio([x["profile"].get(key) for x in k], [x["profile"].get(key) for x in m]))
            if not smoke and thr and p99:
                targets[f"chat_throughput_kvtier_vs_lmcache_{sfx} >= 1.10"] = thr["median"] >= 1.10
                targets[f"chat_ttft_p99_kvtier_vs_lmcache_{sfx} <= 0.90"] = p99["median"] <= 0.90
    out["figures"] = figures
    out["targets"] = targets
    return out


# ---------------------------------------------------------------- faults

def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class Watch:
    """Polls a system's servers' counters (external hits, and kvtier's loaded and
    saved tokens) every `every` seconds on a thread: (time, totals) samples."""

    KEYS = ("vllm:external_prefix_cache_hits_total", "vllm:kvtier_loaded_tokens_total",
            "vllm:kvtier_saved_tokens_total", "vllm:kvtier_load_error_blocks_total",
            "vllm:prompt_tokens_by_source_total[external_kv_transfer]", "vllm:kvtier_lookups_total",
            "vllm:kvtier_lookup_hit_tokens_total")

    def __init__(self, fleet: Fleet, name: str, every: float = 0.2):
        self.fleet, self.name, self.every = fleet, name, every
        self.samples: list[tuple[float, dict]] = []
        self.began: list[float] = []  # When each sample's poll began (a busy server answers late).
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # A server that died no longer counts; the other still does.
            began = time.monotonic()
            ms = [m for _, m in self.fleet.poll(self.name) if not isinstance(m, OSError)]
            if ms:
                self.samples.append((time.monotonic(), {k: sum(m.get(k, 0.0) for m in ms) for k in self.KEYS}))
                self.began.append(began)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _grown(self, t: float, key: str) -> int | None:
        """The first sample after t in which `key` grew past its value at t."""
        base = None
        for i, (ts, v) in enumerate(self.samples):
            if ts <= t:
                base = v[key]
            elif base is None:
                base = v[key]
            elif v[key] > base:
                return i
        return None

    def back_after(self, t: float, key: str) -> float | None:
        """Seconds from t until `key` first grew past its value at t (None: it never did)."""
        i = self._grown(t, key)
        return None if i is None else round(self.samples[i][0] - t, 3)

    def window(self, t: float, key: str) -> list[float] | None:
        """Where back_after's growth can lie, from t: after the poll of the last
        sample that still read the old value began, before the first that read the
        new one ended (a slow poll leaves a wide window)."""
        i = self._grown(t, key)
        if i is None:
            return None
        lo = max(self.began[i - 1], t) if i > 0 else t
        return [round(lo - t, 3), round(self.samples[i][0] - t, 3)]

    def counted(self, t0: float, t1: float, key: str) -> float:
        """How much `key` grew from t0 to the first sample at or after t1."""
        base = next((v[key] for ts, v in reversed(self.samples) if ts <= t0), None)
        if base is None and self.samples:
            base = self.samples[0][1][key]
        end = next((v[key] for ts, v in self.samples if ts >= t1), None)
        return 0.0 if base is None or end is None else end - base


class CacheProbe:
    """Asks kvtierd, as an engine's lookup would, how much of the conversations'
    shared prefix (the system prompt's whole blocks, tokenized as the servers do)
    it can serve: one Locate, a round trip that leases nothing and brings what
    only kvtierd's stores hold into its host tier. So it says when hits are back
    after a fault whatever the servers' queues do (vLLM looks a request up once,
    when it is first scheduled). The engines' model identity comes from their
    log."""

    def __init__(self, system: System, server_log: str, texts: Texts, convset: dict, block: int = VLLM_CPU_BLOCK):
        import re
        with open(server_log, errors="replace") as f:
            m = re.search(r"model identity ([0-9a-f]{32})", f.read())
        if m is None:
            raise RuntimeError(f"no kvtier model identity in {server_log}")
        self.system, self.model_id = system, m.group(1)
        prompts = [texts.tok.apply_chat_template(
            [{"role": "system", "content": convset["system"]}, {"role": "user", "content": c["turns"][0]["user"]}],
            add_generation_prompt=True, tokenize=True) for c in convset["conversations"][:2]]
        prompts = [list(getattr(x, "input_ids", x)) for x in prompts]
        common = next((i for i, (x, y) in enumerate(zip(*prompts)) if x != y), min(map(len, prompts)))
        self.blocks = common // block  # Whole blocks every conversation's first prompt begins with.
        if self.blocks < 1:
            raise RuntimeError(f"the conversations share {common} tokens: less than a block")
        self.tokens = prompts[0][:self.blocks * block]
        self._client = None

    def served(self) -> int | None:
        """Blocks of the shared prefix kvtierd serves now; None: it did not answer."""
        import kvtier
        try:
            if self._client is None:
                extra = self.system.kv_transfer()["kv_connector_extra_config"]
                self._client = kvtier.Client(socket=extra["socket"], tenant=extra.get("tenant", ""),
                                             profile=extra.get("profile", ""), model_id=self.model_id,
                                             client_name="peer_chat-probe", connect_timeout=0.3,
                                             request_timeout=1.0)
            return self._client.locate(self.tokens)
        except kvtier.Error:
            self._client = None  # A new connection next time (kvtierd restarted, or it hung).
            return None

    def until_served(self, back: float, limit: float = 60.0, every: float = 0.05) -> dict:
        """Asks from `back` until the whole shared prefix is served (or `limit`
        seconds): when, with the window the answer lies in, and how many asks."""
        asks, prev = 0, back
        while time.monotonic() - back < limit:
            began = time.monotonic()
            n = self.served()
            asks += 1
            if n is not None and n >= self.blocks:
                end = time.monotonic()
                return {"cache_hits_back_s": round(end - back, 3),
                        "cache_hits_back_window_s": [round(max(prev, back) - back, 3), round(end - back, 3)],
                        "probe_asks": asks}
            prev = began
            time.sleep(every)
        return {"cache_hits_back_s": None, "probe_asks": asks}


def _faulter(system: System, plan: list[dict], total: int, log: list[dict], probe: CacheProbe | None = None):
    """The thread that injects `plan`'s faults once their fraction of `total`
    requests completed; each fault's record goes to `log`. With `probe`, each
    fault first shows the probe served the shared prefix, and after it, when
    it does again."""

    def run(fleet: Fleet, done: dict, cond: threading.Condition) -> None:
        for f in plan:
            need = max(1, int(round(f["after"] * total)))
            with cond:
                while done["n"] < need and not done.get("finished"):
                    cond.wait(1)
                if done.get("finished"):
                    log.append({"fault": f["kind"], "happened": False, "why": "the run ended first"})
                    continue
            rec: dict = {"fault": f["kind"], "after_requests": done["n"]}
            if probe is not None:  # What the probe reads before the fault: else it measures nothing.
                rec["probe_blocks"] = probe.blocks
                rec["probe_served_before"] = probe.served()
            pid = system.pid()
            rec["pid"] = pid
            try:
                if f["kind"] == "sigkill":
                    rec["at"] = time.monotonic()
                    system.kill(signal.SIGKILL)
                    state = _proc_state(pid) if pid else None
                    rec["dead"] = pid is not None and state in (None, "Z") and not system.alive()
                    time.sleep(f["pause"])
                    t = time.monotonic()
                    system.restart()
                    rec["restart_s"] = round(time.monotonic() - t, 3)
                    rec["back"] = time.monotonic()
                    rec["new_pid"] = system.pid()
                else:
                    rec["at"] = time.monotonic()
                    system.kill(signal.SIGSTOP)
                    time.sleep(0.05)
                    rec["stopped"] = _proc_state(pid) == "T" if pid else False
                    time.sleep(f["seconds"])
                    system.kill(signal.SIGCONT)
                    rec["back"] = time.monotonic()
                    rec["state_after_cont"] = _proc_state(pid) if pid else None
                rec["happened"] = True
                if probe is not None and rec["probe_served_before"] == probe.blocks:  # Else: no figure.
                    rec.update(probe.until_served(rec["back"]))
            except Exception as e:  # Recorded as it is.
                rec["happened"] = False
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            log.append(rec)

    return run


def _fault_run(fleet: Fleet, system: System, name: str, convset: dict, total: int, a: argparse.Namespace,
               texts: Texts | None = None) -> dict:
    """One system's chat on the faults set with its cache server SIGKILLed and
    restarted (and, for kvtier, SIGSTOPped and continued) on the way; for
    kvtier, a CacheProbe says when kvtierd serves the shared prefix again."""
    plan = [{"kind": "sigkill", "after": a.faults_kill_after, "pause": a.faults_pause}]
    probe, probe_error = None, None
    if name == "kvtier":
        plan.append({"kind": "sigstop", "after": a.faults_stop_after, "seconds": a.faults_stop_seconds})
        if texts is not None:
            try:
                probe = CacheProbe(system, fleet.servers[name][0].log_path, texts, convset)
            except (RuntimeError, OSError) as e:  # Recorded: no cache_hits_back_s then (--smoke's prompts).
                probe_error = str(e)
    log: list[dict] = []
    watch = Watch(fleet, name)
    try:
        run = run_one(fleet, name, a.faults_policy, convset, a, "faults",
                      during=_faulter(system, plan, total, log, probe))
    except Exception as e:  # Recorded as it is: the run itself could not go on.
        return {"error": f"{type(e).__name__}: {e}"[:500], "faults": log, "alive_after": system.alive()}
    finally:
        watch.stop()
        if not system.alive():  # Whatever the faults left, what comes next gets a live server.
            system.restart()
    recs = [r for rs in run["records"].values() for r in rs]
    faults = []
    for f in log:
        g = {k: v for k, v in f.items() if k not in ("at", "back")}
        if f.get("happened"):
            back = f["back"]
            g["hits_back_s"] = watch.back_after(back, "vllm:external_prefix_cache_hits_total")
            g["loads_back_s"] = watch.back_after(back, "vllm:prompt_tokens_by_source_total[external_kv_transfer]")
            if name == "kvtier":
                g["kvtier_loaded_back_s"] = watch.back_after(back, "vllm:kvtier_loaded_tokens_total")
                g["kvtier_loaded_back_window_s"] = watch.window(back, "vllm:kvtier_loaded_tokens_total")
                g["kvtier_lookup_hit_back_window_s"] = watch.window(back, "vllm:kvtier_lookup_hit_tokens_total")
                g["kvtier_saves_back_s"] = watch.back_after(back, "vllm:kvtier_saved_tokens_total")
                # When hits come back depends on when a request next looks kvtierd up (vLLM asks
                # once per request, when it is first scheduled; with every server busy that can
                # be seconds): so also when the first lookup came, and how many lookups it took
                # to hit (1: the first lookup after the fault found its prefix).
                g["kvtier_first_lookup_s"] = watch.back_after(back, "vllm:kvtier_lookups_total")
                g["kvtier_lookup_hit_back_s"] = watch.back_after(back, "vllm:kvtier_lookup_hit_tokens_total")
                if g["kvtier_lookup_hit_back_s"] is not None:
                    g["kvtier_lookups_until_hit"] = int(watch.counted(
                        back, back + g["kvtier_lookup_hit_back_s"], "vllm:kvtier_lookups_total"))
            ends = [ts for ts, _ in watch.samples if back <= ts <= back + 30]
            g["watch_gap_max_s"] = round(max((b - a for a, b in zip(ends, ends[1:])), default=0.0), 3)
            at, back_rel = f["at"] - run["t0"], back - run["t0"]
            g["at_s"], g["back_at_s"] = round(at, 2), round(back_rel, 2)
            during = [r for r in recs if r["start"] <= back_rel and r["end"] >= at]
            g["requests_in_flight_or_started_during"] = len(during)
            g["failed_during"] = sum(1 for r in during if "error" in r)
        faults.append(g)
    out = {"run": run, "faults": faults, "alive_after": system.alive()}
    if probe_error:
        out["probe_error"] = probe_error
    return out


def _faults_result(faulted: dict, ref: dict | None, convset: dict, total: int, a: argparse.Namespace,
                   smoke: bool) -> dict:
    out: dict = {"case": "faults", "policy": a.faults_policy, "conversations": len(convset["conversations"]),
                 "requests": total, "smoke": smoke, "reference": ref["summary"] if ref else None, "systems": {}}
    for name, f in faulted.items():
        if "error" in f:
            out["systems"][name] = f
            continue
        run, faults = f["run"], f["faults"]
        cmp = compare(run["records"], ref["records"]) if ref else None
        s = run["summary"]
        backs = [g.get("kvtier_loaded_back_s" if name == "kvtier" else "loads_back_s") for g in faults]
        untils = [g.get("kvtier_lookups_until_hit") for g in faults]
        probed = [g.get("cache_hits_back_s") for g in faults if g.get("happened")]
        loads_back = max(backs) if backs and all(b is not None for b in backs) else None
        out["systems"][name] = {
            "failed": s["failed"], "skipped": s["skipped"], "requests": s["requests"],
            "different": cmp["different"] if cmp else None, "compared": cmp["compared"] if cmp else None,
            "diverged_conversations": cmp["diverged_conversations"] if cmp else None,
            # When the cache served the shared prefix again (kvtier's probe), and when the
            # engines next loaded from it (that waits for a request to be looked up).
            "cache_hits_back_s": max(probed) if probed and None not in probed else None,
            "loads_back_s": loads_back,
            "lookups_until_hit": max(untils) if name == "kvtier" and untils and None not in untils else None,
            "faults": faults, "summary": s, "alive_after": f["alive_after"], "probe_error": f.get("probe_error"),
        }
    k = out["systems"].get("kvtier")
    k = k if k and "error" not in k else None
    out["figures"] = {"faults_kvtier_failed": k["failed"] if k else None,
                      "faults_kvtier_different": k["different"] if k else None,
                      "faults_kvtier_hits_back_s": k["cache_hits_back_s"] if k else None,
                      "faults_kvtier_loads_back_s": k["loads_back_s"] if k else None,
                      "faults_kvtier_lookups_until_hit": k["lookups_until_hit"] if k else None}
    out["targets"] = {} if smoke or not k else {
        "faults_kvtier_failed == 0": k["failed"] == 0,
        "faults_kvtier_different == 0": k["different"] == 0,
        "faults_kvtier_hits_back_s <= 1": k["cache_hits_back_s"] is not None and k["cache_hits_back_s"] <= 1.0}
    return out


def run_faults(systems: list[System], model: str, run_dir: str, args: argparse.Namespace, rng: random.Random,
               smoke: bool = False) -> dict:
    """The faults case alone (run_cases)."""
    return run_cases(systems, model, run_dir, args, rng, smoke, ("faults",))["faults"]


# ---------------------------------------------------------------- stand-alone

def main() -> int:
    import tempfile

    from peers import systems as make_systems
    p = argparse.ArgumentParser(description="peer_bench's chat and faults cases alone")
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--model", default=os.path.expanduser("~/.cache/kvtier/models/SmolLM2-135M-Instruct"))
    p.add_argument("--systems", default="kvtier,lmcache,none")
    p.add_argument("--cases", default="chat,faults")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    p.add_argument("--kvtier-disk-mib", type=int, default=0,
                   help="also give kvtierd a disk store of this many MiB, written through (peer_bench's option)")
    add_args(p)
    a = p.parse_args()
    seed = a.seed or random.SystemRandom().randrange(1, 1 << 31)
    rng = random.Random(seed)
    run_dir = tempfile.mkdtemp(prefix="kvtier-peer-chat.")
    print(f"peer_chat: logs in {run_dir}, seed {seed}", file=sys.stderr, flush=True)
    syss = make_systems(a.kvtierd, a.model, a.systems.split(","), kvtier_disk_mib=a.kvtier_disk_mib)
    commit = subprocess.run(["git", "-C", os.path.dirname(HERE), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result: dict = {"bench": "peer_chat", "seed": seed, "commit": commit, "date": datetime.date.today().isoformat(),
                    "machine": f"{os.cpu_count()} cores", "argv": sys.argv[1:]}
    try:
        for s in syss:
            s.start(run_dir)
        result.update(run_cases(syss, a.model, run_dir, a, rng, a.smoke, tuple(a.cases.split(","))))
    finally:
        for s in syss:
            s.stop()
    from bench_kvtierd import emit
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
