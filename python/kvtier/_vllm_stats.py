"""kvtier.vllm's counters: through vLLM's KVConnectorStats (its logs, summed
across workers) and its Prometheus hooks (vllm:kvtier_* on /metrics).
kvtier.vllm re-exports both classes."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

# name -> what it counts (also the Prometheus help text).
COUNTERS = {
    "lookups": "Requests looked up in kvtierd's index (once each)",
    "lookup_hit_tokens": "Prompt tokens the lookups found in kvtierd",
    "loaded_blocks": "Blocks loaded from kvtierd into vLLM's KV cache",
    "loaded_tokens": "Tokens loaded from kvtierd",
    "load_error_blocks": "vLLM blocks whose load failed (recomputed)",
    "load_seconds": "Time spent loading from kvtierd",
    "saved_blocks": "Blocks saved to kvtierd",
    "saved_tokens": "Tokens saved to kvtierd",
    "save_errors": "Saves kvtierd refused or could not take",
    "saves_dropped": "Saves not made: kvtierd away, or the save queue full",
    "save_seconds": "Time spent saving to kvtierd",
    "store_lookups": "Lookups that asked kvtierd's stores (disk, Redis) off the step",
    "store_lookup_hit_tokens": "Prompt tokens those lookups found beyond kvtierd's GPU and host tiers",
    "store_lookup_seconds": "Time from asking kvtierd's stores to their answer (off the step)",
    "store_lookup_errors": "Lookups in kvtierd's stores that failed or got no answer in time (computed instead)",
}
_SECONDS = ("load_seconds", "save_seconds", "store_lookup_seconds")
_LOCK = threading.Lock()


@dataclasses.dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Counters since the last report, summed across workers."""

    def __post_init__(self):
        for k in COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in COUNTERS}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: self.data.get(k, 0) for k in COUNTERS}
        for k in _SECONDS:
            out[k] = round(float(out[k]), 4)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in COUNTERS)

    def add(self, **kw) -> None:
        with _LOCK:  # The saver's thread adds too.
            for k, v in kw.items():
                self.data[k] = self.data.get(k, 0) + v

    def take(self) -> KvtierConnectorStats | None:
        with _LOCK:
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

        self._counters = {}
        for key, doc in COUNTERS.items():
            c = self._counter_cls(name=f"vllm:kvtier_{key}", documentation=doc, labelnames=labelnames)
            self._counters[key] = create_metric_per_engine(c, self.per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for key, per_engine in self._counters.items():
            v = transfer_stats_data.get(key, 0)
            if v:
                per_engine[engine_idx].inc(v)
