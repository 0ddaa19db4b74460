"""kvtier.vllm: KvtierConnector, a vLLM KV connector over kvtierd.

Engines on one host share their prefixes through kvtierd: a prompt whose
leading blocks any engine of the same model computed before (this one, another
process, an engine since restarted) loads them from kvtierd instead of
recomputing them, and every engine saves the full blocks it computes.

    vllm serve MODEL --block-size 16 --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock", "profile": "llama-16"}}'

    LLM(model=..., kv_transfer_config=KVTransferConfig(kv_connector="KvtierConnector",
        kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
        kv_connector_extra_config={"socket": ..., "tenant": ..., "profile": ...}))

The kvtierd profile must be the engine's KV geometry per tensor-parallel rank,
with block_tokens equal to vLLM's block size (16 by default on a GPU, 128 on
vLLM's CPU backend): one kvtier block is one vLLM block. Anything else is
refused at start-up with an error naming both.

kv_connector_extra_config keys (all optional): socket (default $KVTIER_SOCKET,
else /run/kvtier/kvtierd.sock), tenant, profile (kvtierd's profile for this
model's KV; default its first), model_id (32 hex digits instead of the computed
identity; with tensor parallelism, each rank's is derived from it),
connect_timeout (seconds, 0.5), request_timeout (seconds, 2: the longest a
kvtierd that stops answering can hold a step), save_queue (saves waiting at
most, 64: past it a save is dropped and counted, never waited for),
load_failure_policy ("recompute", the default here, or "fail": vLLM's own
default fails a request whose load failed; a cache that may lose its daemon
wants recomputing), store_lookups (true: look in kvtierd's stores below its
host tier, off the step), store_lookup_timeout (seconds, 10: longer than
kvtierd's stores.locate_budget_ms), store_lookup_wait (seconds, 0.002: how
long a lookup waits for the stores' answer before the request is left to wait
a step; a miss in a local store is answered sooner), save_refill (4: write
slots kvtierd hands back with each save for the next one, so a save while
decoding is one round trip).

What it caches: engines of one group of full-attention layers, KV in the
model's dtype, any tensor-parallel size. Sliding windows, MLA, Mamba and
hybrid models, quantized (fp8) KV caches, pipeline and context parallelism are
refused at start-up by name (docs/design.md, "vLLM connector"). Requests with
a LoRA adapter, a cache_salt, multimodal inputs or prompt embeddings are
served without it.

How it works:
- The scheduler side answers get_num_new_matched_tokens from kvtierd's shared
  index (Client.probe: no round trip, no side effects), in whole vLLM blocks,
  leaving the prompt's last token to compute; with tensor parallelism, the
  prefix every rank's identity holds. It never waits on the socket: a link
  (kvtier.link) keeps the connection and pings, so a restarted kvtierd is
  found within a second; while kvtierd is away every lookup misses and no
  save is planned.
- Blocks that only kvtierd's stores hold (its disk store, a Redis Cluster that
  engines on other hosts save to) are invisible to the index. When a probe
  finds less than the prompt could use and kvtierd has stores, a thread asks
  kvtierd to bring the rest into its host tier (Client.locate, one round trip,
  leasing nothing) and the lookup answers vLLM None: the request waits,
  unscheduled and holding nothing, while the other requests run; the next
  lookup probes again and loads what came like any hit (kvtier._vllm_fetch).
- One vLLM block is one kvtier block, copied whole as opaque bytes (each
  layer's page as it lies: vLLM's layout, on the CPU packed for the ISA, is
  part of the identity). So a block's bytes depend only on the tokens its key
  covers, and no save can mix two prompts' KV.
- Loads are synchronous (before the forward that needs them). Saves of the
  blocks a step completed (a long prompt's once its prefill ends) start when
  the step ends (wait_for_save) and run on a thread at a low CPU priority while
  vLLM returns the step's output and goes on. A step that may write a block a
  save still reads (its request finished or was preempted: vLLM freed its
  blocks) first waits for that request's saves (handle_preemptions, the first
  thing vLLM does in a step). A block whose load failed (kvtierd gone or hung,
  a prefix evicted between lookup and load, a lease revoked) is reported by
  get_block_ids_with_load_errors and recomputed, and then saved again: a
  request never continues on bytes that were not loaded.
- A save sends only the blocks kvtierd lacks, in one round trip that does not
  grow with the context (_vllm_saver.Chains): the request's session takes the
  cached prefix by its last key, and the write lease comes back with slots for
  the next save.
- kvtierd away costs a bounded, small amount: the first call that fails (at
  most request_timeout) takes the worker's link down, and until a ping finds
  kvtierd again no load or save tries it.
- A request's kvtierd session ends when the request does (Client.end_session):
  its blocks stay cached, and sessions never fill a tenant's limit.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
import uuid

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

import kvtier
from kvtier._tensors import DTYPES
from kvtier._vllm_fetch import StoreLookups
from kvtier._vllm_model import _log, engine_identity, model_identity, rank_identity, refusal
from kvtier._vllm_plan import KvtierConnectorMetadata, Load, Planner, Save
from kvtier._vllm_saver import Chains, Saver
from kvtier._vllm_stats import KvtierConnectorStats, KvtierPromMetrics
from kvtier.link import Link
from kvtier.paged import PagedKV, load_blocks, profile_mismatch

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierConnectorStats", "KvtierPromMetrics",
           "model_identity"]

# --- the connector --------------------------------------------------------------------

def _link_failure(e: kvtier.Error) -> bool:
    """Whether an error says the kvtierd the link reaches cannot serve this engine
    now (gone, hung, another kvtierd with another profile, another protocol), as
    opposed to one request's trouble (a full tier, an evicted prefix)."""
    return isinstance(e, (kvtier.UnavailableError, kvtier.TimeoutError, kvtier.FailedPreconditionError,
                          kvtier.ProtocolErrorError, kvtier.VersionMismatchError))


def _layer_index(name: str) -> int:
    m = re.findall(r"\d+", name)
    return int(m[0]) if m else 0


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvtierd (see the module docstring)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        why = refusal(vllm_config, kv_cache_config)
        if why is not None:
            raise ValueError(why)
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        self._socket = extra.get("socket") or os.environ.get("KVTIER_SOCKET") or "/run/kvtier/kvtierd.sock"
        self._tenant = extra.get("tenant", "")
        self._profile = extra.get("profile", "")
        self._timeout = float(extra.get("connect_timeout", 0.5))
        # A kvtierd that stops answering holds a step up to this long, no longer.
        self._request_timeout = float(extra.get("request_timeout", 2.0))
        self._save_queue = int(extra.get("save_queue", 64))
        self._block_size = vllm_config.cache_config.block_size  # Tokens per vLLM block (and kvtier block).
        self._stats = KvtierConnectorStats()
        policy = extra.get("load_failure_policy", "recompute")
        if policy not in ("recompute", "fail"):
            raise ValueError(f"kvtier: load_failure_policy must be 'recompute' or 'fail', not {policy!r}")
        # Read by the scheduler right after it makes its connector.
        vllm_config.kv_transfer_config.kv_load_failure_policy = policy

        spec = None
        if kv_cache_config is not None and kv_cache_config.kv_cache_groups:
            spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
            self._layer_names = list(kv_cache_config.kv_cache_groups[0].layer_names)
        else:
            self._layer_names = []
        self._spec = spec
        self._tp = vllm_config.parallel_config.tensor_parallel_size
        rank = 0
        if role == KVConnectorRole.WORKER and self._tp > 1:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            rank = get_tensor_model_parallel_rank()
        self._rank = rank
        self._layout = self._describe_layout(vllm_config, spec)
        base = extra.get("model_id") or engine_identity(vllm_config, self._layout)
        self._ids = [rank_identity(base, r, self._tp) for r in range(self._tp)]
        self._model_id = self._ids[rank]
        self._name = f"vllm:{os.path.basename(os.path.normpath(vllm_config.model_config.model))}:{role.name.lower()}"
        self._engine = uuid.uuid4().hex[:8]  # Names this process's sessions.
        # Scheduler side.
        self._links: list[Link] = []
        self._lookups: StoreLookups | None = None  # Asks kvtierd's stores off the step.
        # Worker side.
        self._link: Link | None = None
        self._paged: PagedKV | None = None
        self._saver: Saver | None = None
        # What each request's session holds, and the write lease kept between saves.
        self._chains = Chains(int(extra.get("save_refill", 4)))
        self._sessions: set[str] = set()        # Requests whose session kvtierd may hold (to end).
        self._to_end: set[str] = set()          # Finished requests whose session is still to end.
        self._can_end = True                    # False once a kvtierd that predates EndSession said so.
        self._errors: set[int] = set()
        if role == KVConnectorRole.SCHEDULER:
            # One link per tensor-parallel rank's identity: a lookup finds what every rank holds.
            self._links = [Link(functools.partial(self._make_client, i), interval=0.5, check=self._check_profile,
                                name=f"kvtier-link-{i}", logger=_log) for i in range(self._tp)]
            self._refuse_if_unfit(self._links)
            if extra.get("store_lookups", True):
                timeout = float(extra.get("store_lookup_timeout", 10.0))  # Past kvtierd's locate_budget_ms.
                self._lookups = StoreLookups(functools.partial(self._make_client, request_timeout=timeout),
                                             self._tp, self._stats, _log,
                                             first_wait=float(extra.get("store_lookup_wait", 0.002)),
                                             give_up=timeout + 1.0)
            if not all(link.up for link in self._links):
                _log.warning("kvtier: kvtierd is not reachable at %s yet: serving without it until it is",
                             self._socket)
            _log.info("kvtier: connector on %s, model identity %s, %s, vLLM blocks of %d tokens, %d rank(s)",
                      self._socket, self._model_id, self._layout, self._block_size, self._tp)
        self._plan = Planner(self._block_size, self._stats, self._clients, self._lookups)  # Each step's loads, saves.

    # --- kvtierd ---------------------------------------------------------------------
    def _make_client(self, rank: int, request_timeout: float | None = None, prefault: bool = False) -> kvtier.Client:
        return kvtier.Client(socket=self._socket, tenant=self._tenant, profile=self._profile,
                             model_id=self._ids[rank], client_name=self._name, connect_timeout=self._timeout,
                             request_timeout=request_timeout or self._request_timeout, prefault_pools=prefault)

    def _geometry(self) -> tuple | None:
        s = self._spec
        if s is None:
            return None
        return (len(self._layer_names), s.num_kv_heads, s.head_size, DTYPES[s.dtype][0], s.block_size)

    def _check_profile(self, client: kvtier.Client) -> None:
        """Raises ValueError when the kvtierd reached (at start, or after a
        restart) has a profile that cannot hold this engine's blocks one for one."""
        g = self._geometry()  # The spec's: what register_kv_caches's tensors are made of, in both roles.
        why = profile_mismatch(client.profile, *g) if g is not None else None
        if why is not None:
            raise ValueError(f"kvtier: {why}; configure a matching profile and name it in "
                             f"kv_connector_extra_config.profile")

    def _refuse_if_unfit(self, links: list[Link]) -> None:
        """At start-up, a kvtierd whose profile cannot hold this engine's blocks
        fails the engine, naming both (a kvtierd that appears later with such a
        profile is refused by the link, which logs it and stays down)."""
        for link in links:
            if link.refused is not None:
                for other in links:
                    other.close()
                raise ValueError(link.refused)

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

    @property
    def requires_kv_delivery(self) -> bool:
        # A cache: a save lost to a preemption is a later miss, not a failure, so
        # vLLM keeps a preempted request's in-flight output (async scheduling).
        return False

    # ======================= scheduler side =========================================
    def _clients(self) -> list[kvtier.Client] | None:
        """Every rank's client while kvtierd answers them all, else None."""
        clients = [link.get() for link in self._links]
        return None if any(c is None for c in clients) else clients  # type: ignore[return-value]

    def on_new_request(self, request) -> None:
        self._plan.new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._plan.matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._plan.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self._plan.build(scheduler_output, self._kv_cache_manager)

    def update_connector_output(self, connector_output) -> None:
        bad = getattr(connector_output, "invalid_block_ids", None)
        if not bad:
            return
        self._plan.load_failed(bad)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict | None]:
        # A request's saves are waited for before a step may reuse its blocks
        # (handle_preemptions): its blocks may be freed now.
        self._plan.finished(request.request_id)
        return False, None

    # ======================= worker side ============================================
    def _session(self, rid: str) -> str:
        return f"vllm-{self._engine}-r{self._rank}-{rid}"

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = self._layer_names or sorted(kv_caches, key=_layer_index)
        missing = [n for n in names if n not in kv_caches]
        if missing:
            raise ValueError(f"kvtier: vLLM registered no KV cache for layers {missing}")
        paged = PagedKV([kv_caches[n] for n in names], self._block_size, self._layout, names)
        if paged.dtype not in DTYPES:
            raise ValueError(f"kvtier: KV cache dtype {paged.dtype} has no kvtier profile dtype (fp32, fp16, bf16)")
        self._paged = paged
        self._saver = Saver(self._save_queue)
        # Loads (on vLLM's thread) and saves (on the saver's) each have a client of
        # their own, so that neither waits behind the other's call to a hung kvtierd;
        # the link pings only while kvtierd is away (the calls show it gone).
        # The worker's client maps the pools' pages in the background (prefault_pools): a
        # load's first read of a slot then takes no page faults on the step.
        self._link = Link(functools.partial(self._make_client, self._rank, prefault=True), interval=0.5,
                          ping_while_up=False,
                          check=self._check_profile, name="kvtier-link", logger=_log)
        self._refuse_if_unfit([self._link])
        if not self._link.up:
            _log.warning("kvtier: kvtierd is not reachable at %s: loads fail (and are recomputed) until it is "
                         "(%s)", self._socket, self._link.state()["error"])

    def _planned(self, kind: str) -> list:
        """This step's loads or saves, as the scheduler planned them."""
        meta = self._connector_metadata
        return getattr(meta, kind) if isinstance(meta, KvtierConnectorMetadata) else []

    def _settle_saves(self, meta) -> None:
        """Waits for the saves still waiting or running that read blocks vLLM
        freed since (their request finished or was preempted): this step may
        write those. Other requests' saves go on."""
        if self._saver is None:
            return
        if isinstance(meta, KvtierConnectorMetadata):
            self._saver.wait_for(meta.freed)
        else:
            self._saver.drain()  # No metadata to say which: every save.

    def handle_preemptions(self, kv_connector_metadata) -> None:
        # The first thing vLLM does in a step, before any block that a finished or
        # preempted request freed can be zeroed, copied into or written.
        self._settle_saves(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._settle_saves(self._connector_metadata)  # Also here, for a runner without handle_preemptions.
        for load in self._planned("loads"):
            self._load(load)

    def _load(self, load: Load) -> None:
        started = time.perf_counter()
        done: list[int] = []
        assert self._paged is not None and self._link is not None  # Registered before any load.
        client = self._link.get()
        if client is not None:
            stages: dict[str, float] | None = {} if _log.isEnabledFor(logging.DEBUG) else None
            try:
                done, held = load_blocks(client, self._paged, load.tokens, self._session(load.req_id), load.first,
                                         load.block_ids, self._stream(), timings=stages)
                self._chains.loaded(load.req_id, client.instance_id, held)
                if stages is not None:  # VLLM_LOGGING_LEVEL=DEBUG: where each load's time went.
                    _log.debug("kvtier: load for request %s: %d blocks, %s", load.req_id, len(done),
                               ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in stages.items()))
            except kvtier.Error as e:
                _log.warning("kvtier: load for request %s failed (%s): its blocks are recomputed", load.req_id, e)
                if _link_failure(e):
                    self._link.failed(e)  # No other load or save tries kvtierd until a ping finds it.
                done = []  # Nothing counts as loaded when the lease did not end well.
            self._sessions.add(load.req_id)
        filled = set(done)
        failed = [b for b in load.block_ids if b not in filled]
        self._errors.update(failed)
        self._stats.add(loaded_blocks=len(done), loaded_tokens=len(done) * self._block_size,
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
        # blocks that save reads (_settle_saves). None is queued while kvtierd is
        # away, and none past the queue's bound: each is a later miss, not a wait.
        saves = self._planned("saves")
        if not saves:
            return
        assert self._saver is not None and self._link is not None  # Started with the kv caches' registration.
        stream = self._stream()
        for save in saves:
            if not self._link.up or not self._saver.put(functools.partial(self._save, save, stream), save.req_id):
                self._stats.add(saves_dropped=1)

    def _save(self, save: Save, stream) -> None:
        started = time.perf_counter()
        assert self._paged is not None and self._link is not None
        client = self._link.get("save")
        if client is None:
            self._stats.add(saves_dropped=1)
            return
        self._sessions.add(save.req_id)
        try:
            stored = self._chains.save(client, self._paged, save.tokens, self._session(save.req_id), save.req_id,
                                       save.block_ids, stream)
            self._stats.add(saved_blocks=stored, saved_tokens=stored * self._block_size)
        except kvtier.Error as e:
            _log.warning("kvtier: save for request %s failed (%s)", save.req_id, e)
            if _link_failure(e):
                self._link.failed(e)
            self._stats.add(save_errors=1)
        finally:
            self._stats.add(save_seconds=time.perf_counter() - started)

    def _end_sessions(self, rids: set[str]) -> None:
        """On the saver's thread, after the requests' saves: their sessions end
        (the blocks stay cached; the tenant's session count does not grow).
        While kvtierd is away they wait for it, with those that could not end."""
        assert self._link is not None
        for rid in rids:
            self._chains.forget(rid)
            if rid in self._sessions:
                self._sessions.discard(rid)
                if self._can_end:
                    self._to_end.add(rid)
        client = self._link.get("save") if self._to_end else None
        while client is not None and self._to_end:
            rid = self._to_end.pop()
            try:
                client.end_session(self._session(rid))
            except kvtier.NotFoundError:
                pass  # Never made (a load or save that found nothing), evicted, or gone with a kvtierd.
            except kvtier.ProtocolErrorError as e:  # A kvtierd that predates EndSession.
                _log.warning("kvtier: kvtierd cannot end sessions (%s): each request's session stays until "
                             "kvtierd evicts it; upgrade kvtierd", e)
                self._to_end.clear()
                self._can_end = False
                return
            except kvtier.Error as e:
                _log.warning("kvtier: could not end the session of request %s (%s)", rid, e)
                if _link_failure(e):
                    self._to_end.add(rid)
                    self._link.failed(e)
                    client = None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if finished_req_ids and self._saver is not None:
            # On the saver's thread: after any save of theirs still queued.
            self._saver.put(functools.partial(self._end_sessions, set(finished_req_ids)), always=True)
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
        if self._lookups is not None:
            self._lookups.close()
        if self._saver is not None:
            self._saver.close()
        for link in self._links + ([self._link] if self._link is not None else []):
            link.close()
