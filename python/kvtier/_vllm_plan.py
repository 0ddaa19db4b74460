"""kvtier.vllm's scheduler side: what each step loads from kvtierd and saves to
it (the metadata vLLM hands the workers), planned from a bookkeeping of every
live request. It never waits on the socket; the workers carry the plan out.
kvtier.vllm re-exports KvtierConnectorMetadata."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

import kvtier
from kvtier._vllm_fetch import StoreLookups
from kvtier._vllm_stats import KvtierConnectorStats

_log = logging.getLogger("vllm.kvtier")

# --- metadata -------------------------------------------------------------------------


@dataclasses.dataclass
class Load:
    req_id: str
    tokens: list[int]      # Of vLLM blocks [0, first + len(block_ids)): what the lease asks for.
    first: int             # The request's first vLLM block to fill...
    block_ids: list[int]   # ...and the vLLM block ids to fill, in order.


@dataclasses.dataclass
class Save:
    req_id: str
    tokens: list[int]      # Of vLLM blocks [0, len(block_ids)).
    block_ids: list[int]   # The request's vLLM blocks, from its first.


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list[Load] = dataclasses.field(default_factory=list)
    saves: list[Save] = dataclasses.field(default_factory=list)
    # Requests whose blocks vLLM freed since the last step (finished, preempted):
    # the only blocks this step may write that a save still running could read.
    freed: set[str] = dataclasses.field(default_factory=set)


# --- the plan -------------------------------------------------------------------------

class Planner:
    """The scheduler side's bookkeeping: which requests kvtier serves, how much
    of each is in kvtierd (saved, or loaded), the loads planned and sent; from
    it, each step's metadata. KvtierConnector's scheduler-side calls, one for
    one; `clients` gives every rank's client while kvtierd answers them all,
    else None; `lookups` asks kvtierd's stores off the step (None: never)."""

    def __init__(self, block_size: int, stats: KvtierConnectorStats,
                 clients: Callable[[], list[kvtier.Client] | None], lookups: StoreLookups | None = None):
        self._block_size = block_size  # Tokens per vLLM block (and kvtier block).
        self._stats = stats
        self._clients = clients
        self._lookups = lookups
        self._requests: dict[str, Any] = {}     # Every live request, by id.
        self._looked_up: dict[str, int] = {}    # Local prefix length given to the last lookup.
        self._counted: set[str] = set()         # Requests whose lookup the stats counted.
        self._loads: dict[str, Load] = {}       # Planned, not yet sent to the workers.
        self._loading: dict[str, Load] = {}     # Sent: a failure reported for its blocks undoes _saved.
        self._saved: dict[str, int] = {}        # vLLM blocks of each request in kvtierd (or loaded).
        self._uncached: set[str] = set()        # LoRA, cache_salt, multimodal, embeddings.
        self._before_stores: dict[str, int] = {}  # Blocks the index held when the stores were asked.
        self._idle = False  # The last step scheduled nothing (vLLM spins on its waiting requests).

    def new_request(self, request) -> None:
        self._requests[request.request_id] = request
        if request.lora_request is not None or request.cache_salt or request.mm_features or \
                getattr(request, "prompt_embeds", None) is not None:
            self._uncached.add(request.request_id)

    def matched_tokens(self, request, num_computed_tokens: int) -> int | None:
        """Tokens past num_computed_tokens that kvtierd holds, to load; None
        (vLLM asks again next step) while kvtierd looks in its stores for the
        blocks its tiers lack."""
        rid = request.request_id
        self._requests.setdefault(rid, request)
        clients = self._clients()
        if clients is None or rid in self._uncached:
            return 0
        bs = self._block_size
        usable = (request.num_tokens - 1) // bs * bs  # Whole vLLM blocks; the last token is computed.
        if usable <= num_computed_tokens:
            return 0
        if self._lookups is not None and self._lookups.waiting(rid, self._idle):
            return None  # Still in kvtierd's stores: no probe (vLLM asks again at once while it has nothing to run).
        tokens = list(request.all_token_ids[:usable])
        try:
            cached = min(c.probe(tokens) for c in clients)  # Blocks, from the shared index: no round trip.
            if cached * bs < usable and self._lookups is not None and any(c.stores_below for c in clients):
                # The stores may hold the rest: kvtierd brings it into its host tier off the step.
                if not self._lookups.ask(rid, tokens):
                    self._before_stores.setdefault(rid, cached)
                    return None
                if rid not in self._before_stores:
                    # Answered while ask() waited: the probe above predates what the stores
                    # brought in, so probe again (a later call's probe follows the answer).
                    self._before_stores[rid] = cached
                    cached = min(c.probe(tokens) for c in clients)
        except kvtier.Error:
            return 0
        hit = cached * bs
        from_stores = max(0, cached - self._before_stores.pop(rid, cached)) * bs  # What the stores' answer added.
        if rid not in self._counted:  # vLLM may ask again for the same request.
            self._counted.add(rid)
            self._stats.add(lookups=1, lookup_hit_tokens=hit, store_lookup_hit_tokens=from_stores)
            _log.debug("kvtier: lookup for request %s: %d of %d usable tokens cached (%d from the stores), "
                       "%d computed by vLLM", rid, hit, usable, from_stores, num_computed_tokens)
        self._looked_up[rid] = num_computed_tokens
        return max(0, hit - num_computed_tokens)

    def allocated(self, request, blocks, num_external_tokens: int) -> None:
        """Plans the load of the blocks vLLM allocated for the tokens kvtierd holds."""
        rid = request.request_id
        if num_external_tokens <= 0:
            return
        bs = self._block_size
        local = self._looked_up.get(rid, 0)
        first, count = local // bs, num_external_tokens // bs
        block_ids = list(blocks.get_block_ids()[0][first:first + count])
        end = (first + count) * bs
        self._loads[rid] = Load(rid, list(request.all_token_ids[:end]), first, block_ids)
        self._saved[rid] = max(self._saved.get(rid, 0), first + count)

    def build(self, scheduler_output, manager) -> KvtierConnectorMetadata:
        """This step's metadata: the loads planned since the last, the saves of
        the blocks this step completes, the requests vLLM freed. `manager` is
        the scheduler's KVCacheManager (None until vLLM binds it)."""
        freed = set(scheduler_output.finished_req_ids) | set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        for rid in freed:
            self._loading.pop(rid, None)  # Its blocks are vLLM's to reuse: a report naming them is another's.
        meta = KvtierConnectorMetadata(loads=list(self._loads.values()), freed=freed)
        self._idle = not scheduler_output.num_scheduled_tokens
        self._loading.update(self._loads)
        self._loads.clear()
        if self._clients() is None:
            return meta  # No saves while kvtierd is away: each would only fail.
        bs = self._block_size
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
            meta.saves.append(Save(rid, list(request.all_token_ids[:done * bs]), block_ids))
            self._saved[rid] = done
        return meta

    def load_failed(self, bad) -> None:
        """The workers reported vLLM blocks `bad` whose load failed."""
        # Loaded blocks that failed are recomputed by vLLM: they are not in kvtierd
        # (or not as this engine's), so they are saved again once computed.
        for rid, load in list(self._loading.items()):
            failed = [i for i, b in enumerate(load.block_ids) if b in bad]
            if failed:
                self._saved[rid] = min(self._saved.get(rid, 0), load.first + failed[0])
                del self._loading[rid]

    def finished(self, rid: str) -> None:
        if self._lookups is not None:
            self._lookups.forget(rid)
        for d in (self._requests, self._looked_up, self._loads, self._loading, self._saved, self._before_stores):
            d.pop(rid, None)
        self._uncached.discard(rid)
        self._counted.discard(rid)
