"""What kvtier.vllm's connector stands on: the identity its blocks are shared
under (model_identity), its counters for vLLM's stats and /metrics
(KvtierConnectorStats, KvtierPromMetrics), the connection a thread keeps to
kvtierd (_Connection) and the thread that runs the saves (_Saver).
kvtier.vllm re-exports the public names."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import queue
import threading
import time
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

import kvtier

try:  # vLLM's own log format and level.
    from vllm.logger import init_logger

    _log = init_logger("vllm.kvtier")
except ImportError:  # pragma: no cover
    _log = logging.getLogger("kvtier.vllm")

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_TORCH = {v: k for k, v in _DTYPES.items()}
_SAMPLE_BYTES = 1 << 16  # Of each weight file, at each of _SAMPLES offsets.
_SAMPLES = 16


# --- identity -------------------------------------------------------------------------


def _model_dir(model_config) -> str | None:
    """The local directory of the model's files (a path, or the hub's cached snapshot)."""
    model = model_config.model
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, revision=getattr(model_config, "revision", None), local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached locally: the identity says so
        return None


def _file_sample(path: str, h) -> None:
    """A weight file's size, its safetensors header, and _SAMPLES slices of its
    bytes spread over the file: any fine-tune changes them, reading them costs
    about a megabyte per file however large the model."""
    size = os.path.getsize(path)
    h.update(f"{os.path.basename(path)} {size}\n".encode())
    with open(path, "rb") as f:
        head = f.read(8)
        if path.endswith(".safetensors") and len(head) == 8:
            n = int.from_bytes(head, "little")
            h.update(f.read(min(n, 100 << 20)))
        for i in range(_SAMPLES):
            f.seek(size * i // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))


def model_identity(vllm_config, layout: str, extra: str = "") -> str:
    """The identity (32 hex digits) this engine's KV blocks are shared under."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    h = hashlib.blake2b(digest_size=16)
    settings = {
        "format": "kvtier vllm identity 1",
        "dtype": str(mc.dtype),
        "kv_cache_dtype": str(cc.cache_dtype),
        "block_size": cc.block_size,
        "layout": layout,
        "tensor_parallel_size": pc.tensor_parallel_size,
        "tensor_parallel_rank": extra,
    }
    h.update(json.dumps(settings, sort_keys=True).encode())
    directory = _model_dir(mc)
    if directory is None:
        # Nothing to read: the name and revision must do (said once, loudly).
        _log.warning("kvtier: the files of model %s are not local: its identity covers only its name and revision",
                     mc.model)
        h.update(f"model={mc.model} revision={getattr(mc, 'revision', None)}".encode())
        return h.hexdigest()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                 "merges.txt", "chat_template.jinja", "generation_config.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    weights = sorted(f for f in os.listdir(directory) if f.endswith((".safetensors", ".bin", ".pt", ".gguf")))
    for name in weights:
        _file_sample(os.path.join(directory, name), h)
    return h.hexdigest()


# --- stats ----------------------------------------------------------------------------

_COUNTERS = ("lookups", "lookup_hit_tokens", "loaded_blocks", "loaded_tokens", "load_error_blocks", "load_seconds",
             "saved_blocks", "saved_tokens", "save_errors", "save_seconds")


_STATS_LOCK = threading.Lock()


@dataclasses.dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Counters since the last report, summed across workers."""

    def __post_init__(self):
        for k in _COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in _COUNTERS}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: self.data.get(k, 0) for k in _COUNTERS}
        out["load_seconds"] = round(float(out["load_seconds"]), 4)
        out["save_seconds"] = round(float(out["save_seconds"]), 4)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in _COUNTERS)

    def add(self, **kw) -> None:
        with _STATS_LOCK:  # The saver's thread adds too.
            for k, v in kw.items():
                self.data[k] = self.data.get(k, 0) + v

    def take(self) -> KvtierConnectorStats | None:
        with _STATS_LOCK:
            if self.is_empty():
                return None
            out = KvtierConnectorStats(data=dict(self.data))
            self.reset()
            return out


class KvtierPromMetrics(KVConnectorPromMetrics):
    """vllm:kvtier_* counters on vLLM's /metrics."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from vllm.v1.metrics.utils import create_metric_per_engine

        docs = {
            "lookups": "Prompts looked up in kvtierd's index",
            "lookup_hit_tokens": "Prompt tokens the lookups found in kvtierd",
            "loaded_blocks": "kvtier blocks loaded into vLLM's KV cache",
            "loaded_tokens": "Tokens loaded from kvtierd",
            "load_error_blocks": "vLLM blocks whose load failed (recomputed)",
            "load_seconds": "Time spent loading from kvtierd",
            "saved_blocks": "kvtier blocks saved to kvtierd",
            "saved_tokens": "Tokens saved to kvtierd",
            "save_errors": "Saves kvtierd refused or could not take",
            "save_seconds": "Time spent saving to kvtierd",
        }
        self._counters = {}
        for key, doc in docs.items():
            c = self._counter_cls(name=f"vllm:kvtier_{key}", documentation=doc, labelnames=labelnames)
            self._counters[key] = create_metric_per_engine(c, self.per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for key, per_engine in self._counters.items():
            v = transfer_stats_data.get(key, 0)
            if v:
                per_engine[engine_idx].inc(v)




class _Connection:
    """A kvtier.Client kept by a thread: connected when kvtierd is there, pinged
    so that a restarted kvtierd is found within `interval`; `get()` never waits."""

    def __init__(self, make, interval: float, keep: bool):
        self._make, self._interval = make, interval
        self._client: kvtier.Client | None = None
        self._up = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next_try = 0.0
        if keep:
            self._try()
            self._thread = threading.Thread(target=self._run, name="kvtier-connection", daemon=True)
            self._thread.start()
        else:
            self._thread = None  # type: ignore[assignment]

    def _try(self) -> None:
        client = self._client
        try:
            if client is None:
                client = self._make()
            else:
                client.ping()  # A call: a client whose kvtierd went away reconnects here.
            with self._lock:
                if self._client is None:
                    _log.info("kvtier: connected to kvtierd (profile %s)", client.profile.get("name"))
                self._client, self._up = client, True
        except kvtier.Error as e:
            with self._lock:
                if self._up:
                    _log.warning("kvtier: kvtierd unreachable (%s); no hits until it is back", e)
                self._up = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._try()
            except ValueError as e:  # A kvtierd come back with a profile that does not fit.
                _log.error("%s", e)

    def get(self) -> kvtier.Client | None:
        """The client while kvtierd answered its last ping (the thread's), else None."""
        with self._lock:
            return self._client if self._up else None

    def get_or_connect(self) -> kvtier.Client | None:
        """For the worker: connects (at most once per interval) when no client exists yet."""
        if self._client is None and time.monotonic() >= self._next_try:
            self._next_try = time.monotonic() + self._interval
            self._try()
        return self._client

    def close(self) -> None:
        self._stop.set()


# The save thread's nice value: on a machine where the engine's threads take
# every core, its copies give way to the forward and the step's output path.
_SAVER_NICE = 10


class _Saver:
    """One thread that runs the steps' saves, in order. drain() returns once
    every save queued so far has ended; busy(ids) says whether a save of one
    of those requests is queued or running."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # Request id -> its saves queued or running.
        self._thread = threading.Thread(target=self._run, name="kvtier-save", daemon=True)
        self._thread.start()

    def put(self, fn, rid: str | None = None) -> None:
        if rid is not None:
            with self._lock:
                self._pending[rid] = self._pending.get(rid, 0) + 1
        self._queue.put((fn, rid))

    def _run(self) -> None:
        try:  # Behind the engine's own threads for the CPU (Linux: a thread's nice value is its own).
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _SAVER_NICE)
        except (AttributeError, OSError):
            pass
        while True:
            fn, rid = self._queue.get()
            try:
                if fn is None:
                    return
                fn()
            except Exception:  # noqa: BLE001 - a save that fails is logged; the engine goes on
                _log.exception("kvtier: a save failed")
            finally:
                if rid is not None:
                    with self._lock:
                        if self._pending[rid] == 1:
                            del self._pending[rid]
                        else:
                            self._pending[rid] -= 1
                self._queue.task_done()

    def busy(self, rids) -> bool:
        with self._lock:
            return any(r in self._pending for r in rids)

    def drain(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put((None, None))
        self._thread.join(timeout=60)
