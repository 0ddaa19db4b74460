// Engine::Impl: the engine's state, composed of one part per concept, and the
// reference counting that ties blocks to the sessions and leases holding them.
//
// The parts, each a type with its own invariants:
//   block_table.h     blocks: records, states, slots, the shared index, Publish
//   mover.h           copies between tiers: batches, fences, completion
//   tenant_ledger.h   tenants: usage per tier, quotas, sessions, room checks
//   session_table.h   sessions by (tenant, id), their handles in the eviction
//                     policy's order (kvtier/tiering/policy.h, lru_policy.cc), priorities
//   reclaim.h         making room: demote coldest, drop, watermarks, quota room
//   lease_table.h     live leases in grant order, revoked ones, the timeout's revocation
//   promotions.h      blocks read in place waiting for GPU room (PromoteOnRelease)
//   gpu_share.h       the fair share of the GPU tier while a tenant waits for room
//   settling.h        what waits for clients' GPU work: released leases, commits
//   mirror_queue.h    committed blocks being copied for the stores (spill_committed)
// The engine's work on them, by concept:
//   engine.cc           creation, the read path (Match, Acquire), background work, figures
//   engine_write.cc     the write path: allocating, and Commit's steps
//   engine_leases.cc    ending and releasing leases, promotions at release, the timeout
//   engine_sessions.cc  the reference counting and session bookkeeping requests share
//   gpu_work.cc         giving back what clients' GPU work held once it is done
//   store_io.cc         the stores below the host tier: blocks offered to them, blocks imported
//   warm_restart.cc     saving and adopting the host tier across restarts
//   engine_inspector.h  the invariant checker (tests)
//
// Everything runs on the engine's thread (see engine.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "block_table.h"
#include "gpu_share.h"
#include "kvtier/tiering/engine.h"
#include "lease_table.h"
#include "mirror_queue.h"
#include "mover.h"
#include "promotions.h"
#include "reclaim.h"
#include "session_table.h"
#include "settling.h"
#include "tenant_ledger.h"

namespace kvtier::tiering {

struct WarmManifest;

// Why a block leaves the cache: its last holder let go, or pressure pushed it
// out (counted as dropped_blocks and reported to on_free as dropped).
enum class FreeReason : uint8_t { kReleased, kPressure };
// Why a session ends: evicted (by a client, or past max_sessions), or emptied
// by pressure (its last blocks were dropped).
enum class SessionEnd : uint8_t { kEvicted, kEmptied };

struct Engine::Impl {
  Impl(const EngineOptions& o, Backend& b, BlockIndex index, std::unique_ptr<EvictionPolicy> policy)
      : options(o),
        backend(b),
        blocks(std::move(index), o.gpu_slots, o.host_slots),
        sessions(std::move(policy)),
        mover(b, pools, blocks),
        reclaim(*this),
        promotions(o.gpu_slots),
        gpu_share(o.gpu_slots, o.gpu_share_window) {
    if (options.on_spill) mover.OnLanded([this](uint32_t r) { Spill(r, /*dropped=*/false); });
    if (options.on_block_event) blocks.set_observer(options.on_block_event);
  }

  EngineOptions options;
  Backend& backend;
  PerTier<std::unique_ptr<Pool>> pools;  // Before the mover: copies in flight target them.
  BlockTable blocks;
  TenantLedger tenants;
  SessionTable sessions;
  Mover mover;
  Reclaimer reclaim;
  LeaseTable leases;
  SettlingQueue settling;     // Slots and blocks clients' GPU work may still use.
  MirrorQueue mirrors;        // Committed blocks being copied for the stores.
  PromotionQueue promotions;  // Blocks read in place, waiting for GPU room.
  GpuShare gpu_share;         // The fair share of the GPU tier while a tenant waits.
  uint64_t clock = 0;         // Bumped per request that uses sessions; orders blocks' last use.
  uint64_t changes = 1;       // Bumped when sessions or the host tier change (warm snapshots).
  uint64_t saved_changes = 0;
  EngineStats stats;
  mutable uint64_t prefix_walks = 0;  // MatchRecords calls (EngineStats::prefix_walks).

  uint32_t bt() const { return options.profile.block_tokens; }
  SlotAllocator& slots(Tier t) { return blocks.slots(t); }
  const SlotAllocator& slots(Tier t) const { return blocks.slots(t); }
  // Warm-snapshot dirtiness: request changes plus the copies the mover applied.
  uint64_t change_count() const { return changes + mover.demoted() + mover.promoted(); }

  // --- References ----------------------------------------------------------------
  void Ref(uint32_t r) { ++blocks[r].refs; }
  void Unref(uint32_t r, FreeReason why) {
    --blocks[r].refs;
    MaybeFree(r, why);
  }
  // Frees the block once neither a session nor a lease holds it.
  void MaybeFree(uint32_t r, FreeReason why);

  // --- Sessions --------------------------------------------------------------------
  Session* FindSession(const Tenant& t, std::string_view id) const { return sessions.Find(t.ns, id); }
  // The session, created if new (evicting one past max_sessions: SessionToEvictFor).
  Session* GetOrCreateSession(const Tenant& t, std::string_view id);
  // The session to evict so that tenant `t` may add one to a full table
  // (EngineOptions::max_sessions): `t`'s own coldest when it holds its fair
  // share or more, else the coldest of the tenant holding the most sessions.
  // Finding that tenant is O(1); its coldest session costs a walk of the
  // eviction order past the colder sessions of other tenants.
  Session* SessionToEvictFor(const TenantAccount& t) const;
  // kResourceExhausted if `id` is new and its tenant holds max_sessions_per_tenant.
  Status CheckNewSession(const Tenant& t, std::string_view id);
  void Touch(Session* s);
  // Makes `recs` the chain of session `id` (made if it has none): the new
  // references are taken before the session is made (making one may evict
  // another, whose blocks may be these) and the old ones dropped after; the
  // blocks are marked used now (clock), and the session touched.
  void SetChain(const Tenant& t, std::string_view id, const std::vector<uint32_t>& recs);
  // Cuts the chain to `n` blocks (and forgets `below`: it no longer continues it).
  void Truncate(Session* s, size_t n, FreeReason why);
  // The session's keys, resident chain then `below`, for ReconcileBelow.
  std::vector<BlockKey> ChainAndBelow(const Session& s) const;
  // After `s`'s chain changed from `before` (ChainAndBelow): `below` keeps the
  // keys still continuing the chain, or none once it went another way.
  void ReconcileBelow(Session* s, const std::vector<BlockKey>& before) const;
  void RemoveSession(Session* s, SessionEnd why);

  // --- The fair share of the GPU tier (gpu_share.h) ------------------------------------
  // `account` found no GPU slot for what it needs: if that makes it a waiter,
  // the tenants over their share make way (Reclaimer::ReclaimShares).
  void NoteGpuWait(TenantAccount& account);
  // How many more GPU blocks `account` may hold now: under its quota, and
  // under its fair share while another tenant waits (kNoQuota: no limit).
  uint32_t GpuRoom(const TenantAccount& account, GpuShare::Clock::time_point now) const {
    return std::min(account.Room(Tier::kGpu), gpu_share.Room(account, now));
  }

  // --- Lookup and leases -----------------------------------------------------------
  // Longest verified prefix; fills `out` with its record ids.
  uint32_t MatchRecords(const Namespace& ns, const ModelId& model, std::span<const BlockKey> keys,
                        std::span<const TokenId> tokens, std::vector<uint32_t>* out) const;
  // The records of the longest verified prefix of `keys`: `match`'s while it
  // still holds (the same tenant and model, at least as many keys, no block
  // changed since), else matched again into it. nullptr: matched into `scratch`.
  std::span<const uint32_t> Matched(const Namespace& ns, const ModelId& model, std::span<const BlockKey> keys,
                                    std::span<const TokenId> tokens, PrefixMatch* match, PrefixMatch& scratch);
  // Blocks of `recs` in the host tier that a promotion would move now.
  uint32_t Promotable(std::span<const uint32_t> recs) const;
  // For an Acquire of `recs` (pinned meanwhile): starts demotions for the GPU
  // room their promotion needs and waits for it, unless they were `fetched`
  // from a store; under a GPU quota the tenant's colder GPU blocks make way.
  // False when fetched blocks find no room: lease them where they are.
  bool MakePromotionRoom(const Tenant& tenant, std::span<const uint32_t> recs, bool fetched);
  // Pins `recs` for a read lease, in order, scheduling (and submitting)
  // the promotion of host-tier ones if `promote`; stops at the first with no
  // GPU slot for it (those left out are freed if no one holds them).
  ReadRecords PinForRead(std::span<const uint32_t> recs, bool promote);
  // Where each leased block is read (a promotion's destination, if moving),
  // and the fence of their promotions. After PinForRead: a batch the backend
  // refused was cancelled, so its blocks are read where they are.
  void LocateLeased(std::span<const uint32_t> leased, ReadLease* out) const;
  // Gives back what a lease holds: slots come free (and off its tenant's
  // quota), pins end and blocks no one holds any more are freed.
  void EndLease(Lease& lease);

  // --- Allocating and committing (engine_write.cc) -----------------------------------
  // An allocation of `count` slots is possible at all (however full the tier).
  Status CheckAllocateCount(uint32_t count) const;
  // Makes room under `tenant`'s GPU quota for an allocation of `count`.
  Status MakeAllocateQuotaRoom(TenantAccount& tenant, uint32_t count);
  // Reserves `count` GPU slots for `tenant` now, dropping the coldest unleased
  // GPU blocks if that makes enough room; kResourceExhausted (losing nothing)
  // otherwise. REQUIRES: room under its quota.
  Result<WriteLease> AllocateNow(TenantAccount& tenant, uint32_t count);
  // One Engine::Commit's arguments, which its steps share.
  struct CommitRequest {
    LeaseId lease_id;
    const Tenant& tenant;
    std::string_view session_id;
    BlockKey parent;
    uint32_t start_block;
    std::span<const TokenId> tokens;
    std::span<const uint32_t> slots;
    size_t count;  // Blocks of tokens.
  };
  // What a commit's blocks became: the writer's GPU work holds both lists back.
  struct Committed {
    CommitResult result;
    BlockKey last;                          // The key of the last block committed.
    std::vector<uint32_t> duplicate_slots;  // Slots of blocks already cached: freed once the writer is done.
    std::vector<uint32_t> written;          // New blocks: served and moved once the writer is done.
  };
  // The commit's write lease: kNotFound, kFailedPrecondition if the timeout
  // revoked it, kPermissionDenied if it is another tenant's.
  Result<WriteSlots*> CommitLease(const CommitRequest& c);
  // Whole blocks, one per slot, at most max_blocks_per_request; the slots
  // distinct and all in `lease`. Fills `committed` with them, sorted.
  Status CheckCommitSlots(const CommitRequest& c, const WriteSlots& lease, std::vector<uint32_t>* committed) const;
  // The commit continues its session where the caller saw it, and the session
  // may take it (a new one within max_sessions_per_tenant; max_session_blocks).
  // `adopting`: the session's first start_block blocks are replaced by a
  // cached chain (CachedChain), so where it stands now does not matter.
  Status CheckCommitPlace(const CommitRequest& c, bool adopting = false);
  // The records of the cached chain of `n` blocks ending at `last`, block 0
  // first: walked back through the index's parents, each the tenant's and of
  // its model and not doomed. kFailedPrecondition when a block is missing or
  // the chain is not n blocks long.
  Result<std::vector<uint32_t>> CachedChain(const CommitRequest& c, const TenantAccount& account) const;
  // Whether session `c.session_id` holds c.start_block blocks, the last keyed c.parent.
  bool SessionContinues(const CommitRequest& c) const;
  // Commit's and Save's steps after the watch is taken: the lease and the
  // checks, the cached chain the session takes (`adopt`, when it does not
  // continue at the parent: *adopted counts it), the chain, the hand-over to
  // `writer`. An error changes nothing.
  Result<Committed> CommitChecked(const CommitRequest& c, bool adopt, GpuWork& writer, uint32_t* adopted);
  // Grants write lease `id` (live) again under a new id, with free GPU slots
  // added up to `target` in all (within its tenant's room, none while tenants
  // contend for the tier). Id 0 when it ends up holding nothing.
  WriteLease Regrant(LeaseId id, uint32_t target);
  // Room under `account`'s GPU quota for the blocks the commit adds.
  Status MakeCommitQuotaRoom(const CommitRequest& c, TenantAccount& account);
  // Makes the committed blocks the session's chain after its first
  // start_block (the session made if new), new ones published in the GPU tier.
  // With `adopt`: the session's chain is first replaced by those records (CachedChain).
  Committed ChainCommitted(const CommitRequest& c, TenantAccount& account,
                           const std::vector<uint32_t>* adopt = nullptr);
  // Appends the committed blocks to `s`'s chain: each published, or the cached
  // block with its key, both referenced and marked used now.
  Committed PublishCommitted(const CommitRequest& c, TenantAccount& account, Session* s);
  // Takes the `committed` slots (sorted) out of `lease` and its tenant's leased
  // count, and hands `done`'s slots and blocks to `writer`'s watch.
  void HandOverCommitted(WriteSlots& lease, const std::vector<uint32_t>& committed, Committed& done, GpuWork writer);

  // --- The stores below the host tier (store_io.cc) ----------------------------------
  // Offers host-tier block `r` to on_spill: landed (once per stay: `spilled`)
  // or dropped. REQUIRES: r ready in the host tier.
  void Spill(uint32_t r, bool dropped);
  // Offers block `r` with the bytes `payload` (its host slot's, or a copy's).
  void Offer(uint32_t r, std::span<const std::byte> payload, bool dropped);
  // Copies the committed blocks among `records` that were never offered to
  // free host slots (spill_committed), pinned until the copy lands
  // (PollMirrors offers them then). REQUIRES: their writers are done.
  void Mirror(std::span<const uint32_t> records);
  // Offers the mirrored blocks whose copy landed, frees their host slots and
  // unpins them. Returns how many.
  uint32_t PollMirrors();
  // Publishes in the host tier the fetched blocks that continue `recs` (the
  // verified prefix of `keys` that is cached) and appends them to `recs`,
  // unheld: the caller holds or frees each in the same call. Returns how many.
  uint32_t ImportFetched(const Tenant& tenant, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                         const FetchedBlocks& fetched, std::vector<uint32_t>& recs);

  // A block a session holds, ready in the host tier: promoting it after a read still makes sense.
  static bool WantsPromotion(const Record& rec) { return !rec.doomed && rec.refs > 0 && rec.ReadyIn(Tier::kHost); }
  // Blocks among `recs` (a released promote-after lease's) that a session
  // holds in the host tier join `promotions`; then PromoteWanted.
  void WantPromotion(std::span<const uint32_t> recs);
  // Promotes the wanted blocks idle in the host tier while GPU slots are free,
  // and starts demotions to make room for the rest (never waits). A block
  // gone, moved, over its tenant's GPU quota, or waiting past
  // kWantedPromotionFor (or with no room coming) is left where it is.
  // Returns how many were scheduled.
  uint32_t PromoteWanted();

  // --- Warm restart (warm_restart.cc) --------------------------------------------------
  // Publishes the manifest's blocks in the host tier, parents first: each that
  // chains from an adopted block of its tenant (or the null key), recomputes
  // to its key and still holds the bytes it was saved with. Takes their host
  // slots. Returns the record of each listed block (kNoRecord: not adopted).
  std::vector<uint32_t> AdoptBlocks(const WarmManifest& manifest);
  // Makes the manifest's sessions again, coldest first (so the eviction order
  // comes back), each cut at its first block not adopted or not continuing its
  // chain; `record_of` is AdoptBlocks'. Counts them in `report`.
  void AdoptSessions(const WarmManifest& manifest, const std::vector<uint32_t>& record_of, WarmAdoptReport* report);

  // --- Clients' GPU work (gpu_work.cc) ---------------------------------------------
  // Frees `slots` (off `tenant`'s leased count) and unpins `records` now, or,
  // if `work` is still running, once it is done. Takes over the watch.
  void GiveBackAfter(GpuWork work, std::vector<uint32_t> slots, TenantAccount* tenant, std::vector<uint32_t> records,
                     bool writes);
  // Gives back whatever waited for work that is done (or failed, or older
  // than the lease timeout). Returns the slots and blocks given back.
  uint32_t Settle();
  void GiveBack(Settling& s);
  // Takes blocks whose writing went wrong out of every session and the index.
  void DropUnwritten(std::span<const uint32_t> records);
  void EndWatch(GpuWork& work);
  // Ends a writer's watch when it goes out of scope: Commit and Save own the
  // watch from their first line, so every early return ends it.
  struct WatchOwner {
    Impl& impl;
    GpuWork& w;
    ~WatchOwner() { impl.EndWatch(w); }
  };
  void Flush(CopyDirection dir) { mover.Flush(dir, options.max_copy_batch); }
};

}  // namespace kvtier::tiering
