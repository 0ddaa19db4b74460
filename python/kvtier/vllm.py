"""kvtier.vllm: KvtierConnector, a vLLM KV connector over kvtierd.

Engines on one host share their prefixes through kvtierd: a prompt whose
leading blocks any engine of the same model computed before (this one, another
process, an engine since restarted) loads them from kvtierd instead of
recomputing them, and every engine saves the full blocks it computes.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

    LLM(model=..., kv_transfer_config=KVTransferConfig(kv_connector="KvtierConnector",
        kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
        kv_connector_extra_config={"socket": ..., "tenant": ..., "profile": ...}))

kv_connector_extra_config keys (all optional): socket (default $KVTIER_SOCKET,
else /run/kvtier/kvtierd.sock), tenant, profile (kvtierd's profile for this
model's KV; default its first), model_id (32 hex digits instead of the computed
identity), connect_timeout (seconds, 0.5), request_timeout (seconds, 2: the
longest a kvtierd that stops answering can hold a step), load_failure_policy ("recompute",
the default here, or "fail": vLLM's own default fails a request whose load
failed; a cache that may lose its daemon wants recomputing).

How it works (docs/design.md, "vLLM connector"):
- The scheduler side answers get_num_new_matched_tokens from kvtierd's shared
  index (Client.probe: no round trip, no side effects), in whole vLLM blocks,
  leaving the prompt's last token to compute. It never waits on the socket: a
  thread keeps the connection (and pings, so a restarted kvtierd is found
  within a second); while kvtierd is away every lookup misses.
- One vLLM block of N tokens is N / block_tokens kvtier blocks. The connector
  copies whole vLLM blocks, as opaque bytes: the page of block b in layer l is
  cut into N / block_tokens equal pieces, piece j going to layer l of kvtier
  block j (kvtier.paged). vLLM lays a block out its own way (its resolved KV
  cache layout; on the CPU, packed for the ISA), so tokens are never sliced out
  of a block; the layout is part of the identity instead.
- Loads are synchronous (before the forward that needs them). Saves of the
  blocks a step completed (a long prompt's once its prefill ends) start when the
  step ends (wait_for_save) and run on a thread at a low CPU priority while vLLM
  returns the step's output and goes on. A step that may write a block a save
  still reads (its request finished or was preempted: vLLM freed its blocks)
  first waits for that save (handle_preemptions, the first thing vLLM does in a
  step), so a save never reads a block being rewritten, and it adds nothing to
  a request's time to first token. A block whose load
  failed (kvtierd gone, a prefix evicted between probe and load, a lease
  revoked) is reported by get_block_ids_with_load_errors and recomputed: a
  request never continues on bytes that were not loaded.
- Identity (model_identity): blocks are shared only between engines whose
  model (config, tokenizer, a sample of every weight file), dtype, KV dtype,
  block size, attention backend and KV layout, and tensor-parallel rank agree.
  Requests with a LoRA adapter, a cache_salt, multimodal inputs or prompt
  embeddings are not cached.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
import uuid
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

import kvtier
from kvtier._vllm_support import (  # noqa: F401 - model_identity and the stats classes are kvtier.vllm's API
    _DTYPES,
    KvtierConnectorStats,
    KvtierPromMetrics,
    _Connection,
    _log,
    _Saver,
    model_identity,
)
from kvtier.paged import PagedKV, load_blocks, save_blocks

# --- metadata -------------------------------------------------------------------------


@dataclasses.dataclass
class _Load:
    req_id: str
    session: str
    tokens: list[int]      # Of vLLM blocks [0, first + len(block_ids)): what the lease asks for.
    first: int             # The request's first vLLM block to fill...
    block_ids: list[int]   # ...and the vLLM block ids to fill, in order.


@dataclasses.dataclass
class _Save:
    req_id: str
    session: str
    tokens: list[int]      # Of vLLM blocks [0, len(block_ids)).
    block_ids: list[int]   # The request's vLLM blocks, from its first.


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list[_Load] = dataclasses.field(default_factory=list)
    saves: list[_Save] = dataclasses.field(default_factory=list)
    # Requests whose blocks vLLM freed since the last step (finished, preempted):
    # the only blocks this step may write that a save still running could read.
    freed: set[str] = dataclasses.field(default_factory=set)


# --- the connector --------------------------------------------------------------------

def _layer_index(name: str) -> int:
    m = re.findall(r"\d+", name)
    return int(m[0]) if m else 0


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvtierd (see the module docstring)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        self._socket = extra.get("socket") or os.environ.get("KVTIER_SOCKET") or "/run/kvtier/kvtierd.sock"
        self._tenant = extra.get("tenant", "")
        self._profile = extra.get("profile", "")
        self._timeout = float(extra.get("connect_timeout", 0.5))
        # A kvtierd that stops answering holds a step up to this long, no longer.
        self._request_timeout = float(extra.get("request_timeout", 2.0))
        self._block_size = vllm_config.cache_config.block_size  # Tokens per vLLM block.
        self._stats = KvtierConnectorStats()
        policy = extra.get("load_failure_policy", "recompute")
        if policy not in ("recompute", "fail"):
            raise ValueError(f"kvtier: load_failure_policy must be 'recompute' or 'fail', not {policy!r}")
        # Read by the scheduler right after it makes its connector.
        vllm_config.kv_transfer_config.kv_load_failure_policy = policy

        spec = None
        if kv_cache_config is not None and kv_cache_config.kv_cache_groups:
            if len(kv_cache_config.kv_cache_groups) != 1:
                raise ValueError("kvtier: models with several KV cache groups (hybrid attention) are not supported")
            spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
            self._layer_names = list(kv_cache_config.kv_cache_groups[0].layer_names)
        else:
            self._layer_names = []
        self._spec = spec
        tp = vllm_config.parallel_config
        rank = 0
        if role == KVConnectorRole.WORKER and tp.tensor_parallel_size > 1:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            rank = get_tensor_model_parallel_rank()
        self._rank = rank
        self._layout = self._describe_layout(vllm_config, spec)
        self._model_id = extra.get("model_id") or model_identity(vllm_config, self._layout, f"{rank}")
        name = f"vllm:{os.path.basename(os.path.normpath(vllm_config.model_config.model))}:{role.name.lower()}"

        def make() -> kvtier.Client:
            c = kvtier.Client(socket=self._socket, tenant=self._tenant, profile=self._profile, model_id=self._model_id,
                              client_name=name, connect_timeout=self._timeout,
                              request_timeout=self._request_timeout)
            self._check_geometry(c.profile)
            return c

        self._conn = _Connection(make, interval=0.5 if role == KVConnectorRole.SCHEDULER else 1.0,
                                 keep=role == KVConnectorRole.SCHEDULER)
        # Scheduler side.
        self._engine = uuid.uuid4().hex[:8]
        self._requests: dict[str, Any] = {}     # Every live request, by id.
        self._looked_up: dict[str, int] = {}    # Local prefix length given to the last lookup.
        self._loads: dict[str, _Load] = {}      # Planned, not yet sent to the workers.
        self._saved: dict[str, int] = {}        # vLLM blocks of each request in kvtierd (or loaded).
        self._uncached: set[str] = set()        # LoRA, cache_salt, multimodal, embeddings.
        # Worker side.
        self._paged: PagedKV | None = None
        self._saver: _Saver | None = None
        self._chain: dict[str, int] = {}        # kvtier blocks each request's session holds.
        self._errors: set[int] = set()
        if role == KVConnectorRole.SCHEDULER:
            client = self._conn.get()
            if client is None:
                _log.warning("kvtier: kvtierd is not reachable at %s yet: serving without it until it is",
                             self._socket)
            _log.info("kvtier: connector on %s, model identity %s, %s, vLLM blocks of %d tokens", self._socket,
                      self._model_id, self._layout, self._block_size)

    # --- geometry ------------------------------------------------------------------
    @staticmethod
    def _describe_layout(vllm_config, spec) -> str:
        from vllm.platforms import current_platform

        device = current_platform.device_type
        layout = ""
        try:
            layout = str(vllm_config.cache_config.get_resolved_kv_cache_layout())
        except Exception:  # noqa: BLE001 - older or partial configs
            layout = str(getattr(vllm_config.cache_config, "kv_cache_layout", ""))
        isa = ""
        if device == "cpu" and spec is not None:
            try:
                from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

                isa = _get_attn_isa(spec.dtype, spec.block_size, spec.head_size, str(vllm_config.cache_config.cache_dtype))
            except Exception:  # noqa: BLE001 - recorded as unknown; still part of the identity
                isa = "unknown"
        return f"{device} {layout} {isa}".strip()

    def _geometry(self) -> dict:
        s = self._spec
        if s is None:
            return {}
        return {"layers": len(self._layer_names), "kv_heads": s.num_kv_heads, "head_dim": s.head_size,
                "dtype": _DTYPES.get(s.dtype, str(s.dtype)), "block_size": s.block_size}

    def _check_geometry(self, profile: dict) -> None:
        g = self._geometry()
        if not g:
            return
        ours = f"{g['layers']} layers x {g['kv_heads']} kv_heads x {g['head_dim']} dim, {g['dtype']}, " \
               f"vLLM blocks of {g['block_size']} tokens"
        theirs = f"profile '{profile['name']}': {profile['layers']} layers x {profile['kv_heads']} kv_heads x " \
                 f"{profile['head_dim']} dim, {profile['dtype']}, {profile['block_tokens']}-token blocks"
        if (g["layers"], g["kv_heads"], g["head_dim"], g["dtype"]) != (
                profile["layers"], profile["kv_heads"], profile["head_dim"], profile["dtype"]):
            raise ValueError(f"kvtier: kvtierd's {theirs} does not fit this engine's KV ({ours}); "
                             "configure a matching profile and name it in kv_connector_extra_config.profile")
        if g["block_size"] % profile["block_tokens"]:
            raise ValueError(f"kvtier: vLLM's block size must be a multiple of the profile's block_tokens: "
                             f"{ours} against {theirs}")

    def _pieces(self, client) -> int:
        return self._block_size // client.block_tokens

    # ======================= scheduler side =========================================
    def on_new_request(self, request) -> None:
        self._requests[request.request_id] = request
        if request.lora_request is not None or request.cache_salt or request.mm_features or \
                getattr(request, "prompt_embeds", None) is not None:
            self._uncached.add(request.request_id)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        self._requests.setdefault(rid, request)
        client = self._conn.get()
        if client is None or rid in self._uncached:
            return 0, False
        bs = self._block_size
        usable = (request.num_tokens - 1) // bs * bs  # Whole vLLM blocks; the last token is computed.
        if usable <= num_computed_tokens:
            return 0, False
        tokens = list(request.all_token_ids[:usable])
        try:
            cached = client.probe(tokens)  # kvtier blocks, from the shared index: no round trip.
        except kvtier.Error:
            return 0, False
        hit = cached // self._pieces(client) * bs
        self._stats.add(lookups=1, lookup_hit_tokens=hit)
        self._looked_up[rid] = num_computed_tokens
        return max(0, hit - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        rid = request.request_id
        if num_external_tokens <= 0:
            return
        bs = self._block_size
        local = self._looked_up.get(rid, 0)
        first, count = local // bs, num_external_tokens // bs
        block_ids = list(blocks.get_block_ids()[0][first:first + count])
        end = (first + count) * bs
        self._loads[rid] = _Load(rid, self._session(rid), list(request.all_token_ids[:end]), first, block_ids)
        self._saved[rid] = max(self._saved.get(rid, 0), first + count)

    def _session(self, rid: str) -> str:
        return f"vllm-{self._engine}-{rid}"

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        freed = set(scheduler_output.finished_req_ids) | set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        meta = KvtierConnectorMetadata(loads=list(self._loads.values()), freed=freed)
        self._loads.clear()
        bs = self._block_size
        manager = self._kv_cache_manager
        scheduled = [(r.req_id, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        scheduled += list(zip(cached.req_ids, cached.num_computed_tokens))
        for rid, computed in scheduled:
            request = self._requests.get(rid)
            if request is None or rid in self._uncached or manager is None:
                continue
            end = computed + scheduler_output.num_scheduled_tokens.get(rid, 0)
            if end < request.num_prompt_tokens:
                continue  # A chunk of a long prompt: saved with the step that ends the prefill, off its TTFT.
            done = min(end // bs, request.num_tokens // bs)
            if done <= self._saved.get(rid, 0):
                continue
            block_ids = list(manager.get_blocks(rid).get_block_ids()[0][:done])
            if len(block_ids) < done:
                continue
            meta.saves.append(_Save(rid, self._session(rid), list(request.all_token_ids[:done * bs]), block_ids))
            self._saved[rid] = done
        return meta

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict | None]:
        # Saves are done by the end of the step that completed their blocks:
        # nothing is in flight when a request finishes, its blocks may go.
        rid = request.request_id
        for d in (self._requests, self._looked_up, self._loads, self._saved):
            d.pop(rid, None)
        self._uncached.discard(rid)
        return False, None

    # ======================= worker side ============================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = self._layer_names or sorted(kv_caches, key=_layer_index)
        missing = [n for n in names if n not in kv_caches]
        if missing:
            raise ValueError(f"kvtier: vLLM registered no KV cache for layers {missing}")
        paged = PagedKV([kv_caches[n] for n in names], self._block_size, self._layout, names)
        if paged.dtype not in _DTYPES:
            raise ValueError(f"kvtier: KV cache dtype {paged.dtype} has no kvtier profile dtype (fp32, fp16, bf16)")
        self._paged = paged
        self._saver = _Saver()
        client = self._conn.get_or_connect()
        if client is None:
            _log.warning("kvtier: kvtierd is not reachable at %s: loads fail (and are recomputed) until it is",
                         self._socket)

    def _planned(self, kind: str) -> list:
        """This step's loads or saves, as the scheduler planned them."""
        meta = self._connector_metadata
        return getattr(meta, kind) if isinstance(meta, KvtierConnectorMetadata) else []

    def _settle_saves(self, meta) -> None:
        """Waits for the saves still running that read blocks vLLM freed since
        (their request finished or was preempted): this step may write those."""
        if self._saver is None:
            return
        if not isinstance(meta, KvtierConnectorMetadata) or self._saver.busy(meta.freed):
            self._saver.drain()

    def handle_preemptions(self, kv_connector_metadata) -> None:
        # The first thing vLLM does in a step, before any block that a finished or
        # preempted request freed can be zeroed, copied into or written.
        self._settle_saves(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._settle_saves(self._connector_metadata)  # Also here, for a runner without handle_preemptions.
        for load in self._planned("loads"):
            self._load(load)

    def _load(self, load: _Load) -> None:
        started = time.perf_counter()
        done: list[int] = []
        client = self._conn.get_or_connect()
        assert self._paged is not None  # Registered before any load.
        try:
            if client is None:
                raise kvtier.UnavailableError("kvtierd is not connected")
            done, chain = load_blocks(client, self._paged, load.tokens, load.session, load.first, load.block_ids,
                                      self._stream())
            self._chain[load.req_id] = chain
        except kvtier.Error as e:
            _log.warning("kvtier: load for request %s failed (%s): its blocks are recomputed", load.req_id, e)
            done = []  # Nothing counts as loaded when the lease did not end well.
        filled = set(done)
        failed = [b for b in load.block_ids if b not in filled]
        self._errors.update(failed)
        pieces = self._paged.pieces(client.block_tokens) if done and client is not None else 0
        self._stats.add(loaded_blocks=len(done) * pieces, loaded_tokens=len(done) * self._block_size,
                        load_error_blocks=len(failed), load_seconds=time.perf_counter() - started)

    def _stream(self):
        """vLLM's current CUDA stream (the copies run on it), or None on the CPU."""
        assert self._paged is not None  # Registered before any load or save.
        return torch.cuda.current_stream(self._paged.device) if self._paged.is_cuda else None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # Loads are whole before the forward starts.

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs) -> None:
        return  # Saved once per step, after wait_for_save, when every layer holds the step's K/V.

    def wait_for_save(self) -> None:
        # The step's saves run on the saver's thread while vLLM returns the step's
        # output and goes on; a later step waits for one only if it may write the
        # blocks that save reads (_settle_saves).
        stream = self._stream()
        assert self._saver is not None  # Started with the kv caches' registration.
        for save in self._planned("saves"):
            self._saver.put(functools.partial(self._save, save, stream), save.req_id)

    def _save(self, save: _Save, stream) -> None:
        started = time.perf_counter()
        client = self._conn.get_or_connect()
        if client is None:
            self._stats.add(save_errors=1)
            return
        try:
            assert self._paged is not None
            have = self._chain.get(save.req_id, 0)
            have, stored = save_blocks(client, self._paged, save.tokens, save.session, save.block_ids, have, stream)
            self._chain[save.req_id] = have
            self._stats.add(saved_blocks=stored, saved_tokens=stored * client.block_tokens)
        except kvtier.Error as e:
            _log.warning("kvtier: save for request %s failed (%s)", save.req_id, e)
            self._stats.add(save_errors=1)
        finally:
            self._stats.add(save_seconds=time.perf_counter() - started)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if finished_req_ids and self._saver is not None:
            # On the saver's thread: after any save of theirs still queued.
            rids = set(finished_req_ids)
            self._saver.put(lambda: [self._chain.pop(rid, None) for rid in rids])
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    # ======================= both ===================================================
    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._stats.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict | None = None) -> KVConnectorStats | None:
        return KvtierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._saver is not None:
            self._saver.close()
        self._conn.close()
