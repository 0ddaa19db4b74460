// Engine: the KV block cache of one model profile across a GPU and a host tier.
//
// It owns the pools (through a Backend), the block index (published read-only
// in shared memory for clients to probe), sessions, leases, the eviction policy
// and the mover. Every method is called from one thread (the daemon's event loop);
// the backend copies in the background and Poll() applies finished copies.
//
// Invariants the engine keeps (the test-only checker in tiering/src/engine_inspector.h
// verifies them):
//  - a block is in exactly one tier, or moving with a slot in each;
//  - a leased block is never moved or freed, and a moving block stays readable
//    in its source tier until its copy's fence completes;
//  - a block lives while a session references it or a lease holds it;
//  - every slot is free, or owned by exactly one block or write lease;
//  - a tenant's write-lease slots count against its GPU quota until committed
//    (then its new blocks do) or given back;
//  - with a lease timeout, a lease older than it is revoked by the next Tick
//    (ExpireLeases; a backlog past the per-call work bound by the ticks after):
//    its slots come free, its pins end.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/index_layout.h"
#include "kvtier/model_profile.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "kvtier/tiering/backend.h"
#include "kvtier/tiering/engine_leases.h"
#include "kvtier/tiering/engine_options.h"
#include "kvtier/tiering/engine_stats.h"
#include "kvtier/tiering/policy.h"
#include "kvtier/tiering/session_info.h"

namespace kvtier::tiering {

class Engine {
 public:
  // REQUIRES: `backend` outlives the engine.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, Backend& backend,
                                                std::unique_ptr<EvictionPolicy> policy = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelProfile& profile() const;
  const EngineOptions& options() const;
  Pool& pool(Tier tier) const;
  const std::string& index_segment_name() const;
  // The descriptor clients map the index from (sealed read-only); owned by the engine.
  int index_fd() const;

  // --- Write path -----------------------------------------------------------
  // Reserves `count` GPU slots for `tenant` to write; they count against its
  // GPU quota until committed or released. Past the quota, the tenant's own
  // coldest GPU blocks are demoted (or dropped, if that makes enough room)
  // first; kResourceExhausted naming the tenant and quota if that cannot make
  // room. If too few slots are free in the tier, the coldest unleased GPU
  // blocks are dropped to make room; kResourceExhausted if that is not enough
  // (nothing is lost then), and the tenant, if below its fair share, waits:
  // for EngineOptions::gpu_share_window, tenants without a GPU quota are held
  // to gpu slots / active tenants (the same demotions and error as past a
  // quota, naming the share), and those past it give way (their new read
  // leases stop before their GPU blocks past the share, which are demoted
  // once their older leases end; see engine_options.h).
  // Blocks (up to 200 ms per copy batch) while demotions in flight free GPU
  // slots; a daemon serving many clients uses TryAllocate instead.
  Result<WriteLease> Allocate(const Tenant& tenant, uint32_t count);
  // Allocate without waiting: nullopt when the GPU tier has too few free slots
  // now but demotions in flight (scheduled here if needed) will free them; call
  // again after Poll applied copies. Errors and leases as Allocate's. With
  // !may_wait it never returns nullopt: it drops or fails as Allocate would
  // once nothing is in flight.
  Result<std::optional<WriteLease>> TryAllocate(const Tenant& tenant, uint32_t count, bool may_wait = true);

  // Publishes tokens.size()/block_tokens full blocks written into `slots` (each a
  // slot of write lease `lease`, block i in slots[i]). Keys are computed here from
  // `parent` (the key of the block before, null for the first) and the tokens.
  // The session (created if new) is cut to `start_block` blocks, then extended;
  // kFailedPrecondition unless it holds at least start_block blocks, the last
  // keyed `parent` (so a chain never has gaps or repeats).
  // A key already cached keeps its first copy and the duplicate slot is freed.
  // Committed slots leave the lease; the rest stay reserved until Release.
  // The session is `tenant`'s: the keys are chained in its namespace; the lease
  // must be that tenant's (kPermissionDenied), and live: kFailedPrecondition
  // for one the lease timeout revoked.
  // With `writer` (the work that wrote the slots, still running on the
  // client's GPU), the new blocks are published at once but held back until
  // the engine sees that work done: no Acquire matches them, no demotion
  // copies them, and the duplicates' slots are not reused. A writer whose
  // client goes first (ClientGone), or whose event fails, loses its unfinished
  // blocks (dropped, never served).
  Result<CommitResult> Commit(LeaseId lease, const Tenant& tenant, std::string_view session, const BlockKey& parent,
                              uint32_t start_block, std::span<const TokenId> tokens, std::span<const uint32_t> slots,
                              GpuWork writer = {});
  // A Commit that may adopt its prefix and refills its lease, in one call (a
  // writer's save while it decodes; wire.h's SaveRequest). With
  // options.adopt, a session that does not hold `parent` as its block
  // start_block - 1 first takes the cached chain that ends at `parent` (walked
  // back through the index: each block `tenant`'s and of its model, exactly
  // start_block blocks down to block 0) as its first blocks; kFailedPrecondition
  // if any of it is gone. Then as Commit, after which the lease is granted
  // again under a new id (the old one is gone), holding its uncommitted slots
  // plus free GPU slots up to options.refill in all, within the tenant's room;
  // nothing is dropped, demoted or waited for to make them. Errors leave the
  // session and the lease as they were.
  Result<SaveResult> Save(LeaseId lease, const Tenant& tenant, std::string_view session, const BlockKey& parent,
                          uint32_t start_block, std::span<const TokenId> tokens, std::span<const uint32_t> slots,
                          const SaveOptions& options, GpuWork writer = {});

  // --- Read path ------------------------------------------------------------
  // Longest cached prefix of `keys` whose stored tokens and parents match
  // (`tokens` holds keys.size() blocks). No side effects.
  // `keys` are chained in KeyNamespace(ns, model): only blocks of that tenant
  // and model match.
  uint32_t Match(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                 const ModelId& model = {}) const;
  // The same, kept in `*match` for the request's later calls: an
  // AcquireNeedsRoom or Acquire given it (and the same arguments) reuses it
  // while no block it read changed, instead of walking the prefix again.
  uint32_t Match(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                 const ModelId& model, PrefixMatch* match);

  // Leases the longest cached prefix for reading. With `promote`, blocks in the
  // host tier are copied to the GPU tier and the lease's fence completes when they
  // land; the lease stops early if the GPU tier has no room. With a session name,
  // the session (of `tenant`, whose namespace the keys are in) has its chain
  // become the matched prefix (cut or extended). A session comes into being
  // with its first block: an acquire that matches nothing creates none (an
  // existing session's chain is cut to nothing), and one that would create a
  // session past max_sessions_per_tenant is refused (kResourceExhausted).
  // If the GPU tier has no room for every promotion, Acquire demotes colder
  // blocks and waits (up to 200 ms per copy batch) for them to land; a daemon
  // asks AcquireNeedsRoom first and retries later instead, so that it never
  // waits here.
  // With `fetched`, the blocks a store holds after the cached prefix are
  // placed in the host tier first (where the prefix still reaches their
  // start; those cached by now are skipped), and then served as if they had
  // been cached: keys recomputed from the prefix in the tenant's key
  // namespace, host-tier room made as for a demotion (the coldest host blocks
  // go; within the tenant's host quota), the rest left out when none can be made.
  // Such an Acquire never waits for GPU room: when the GPU tier lacks free
  // slots for every promotion, it leases the prefix where it is.
  // With `match`, the prefix is matched once for the request's calls (Match).
  Result<ReadLease> Acquire(const Tenant& tenant, std::string_view session, std::span<const BlockKey> keys,
                            std::span<const TokenId> tokens, bool promote = true,
                            const FetchedBlocks* fetched = nullptr, PrefixMatch* match = nullptr);
  // Blocks a store returned after the Acquire that asked for them stopped
  // waiting (stores.fetch_budget_ms): placed in the host tier as that Acquire
  // would have (ImportFetched), and into `session`'s chain, so the session's
  // next Acquire finds them here. Nothing is leased and no lookup is counted.
  // Only where the session (made now if it has no block yet) still holds the
  // prefix the fetch continued and nothing past it that the request's keys do
  // not name: a chain that moved on since is left as it is, and the blocks are
  // not placed (nothing would hold them). Returns the blocks placed.
  Result<uint32_t> ImportLate(const Tenant& tenant, std::string_view session, std::span<const BlockKey> keys,
                              std::span<const TokenId> tokens, const FetchedBlocks& fetched);
  // True if an Acquire of `keys` now would wait for GPU slots to promote its
  // host-tier blocks into, which demotions in flight (scheduled here if
  // needed) will free: the caller retries it after Poll applied copies. When
  // false, Acquire does not wait. No effect on sessions or leases.
  bool AcquireNeedsRoom(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                        const ModelId& model = {}, PrefixMatch* match = nullptr);

  // Ends a read or write lease; unreferenced blocks it held are freed. A lease
  // the timeout revoked is forgotten here, with kNotFound saying it expired
  // (what a reader read through it after that may be another block's).
  // With `after` (the client's GPU work still reading the blocks or writing
  // the slots), what the lease held stays held (slots reserved, blocks pinned)
  // until the engine sees that work done (Poll); the lease is gone for its
  // holder at once.
  Status Release(LeaseId lease, GpuWork after = {});
  // Marks read lease `lease` (acquired without `promote`: its host-tier
  // blocks read where they lie) to have the host-tier blocks a session holds
  // copied to the GPU tier once it is released (after its GPU work, if any):
  // at once into free GPU slots, the rest as demotions it starts make room
  // (Poll), for at most a second. kNotFound for no such read lease.
  Status PromoteOnRelease(LeaseId lease);
  // Client `client` (the id its GpuWork carried) is gone: blocks it committed
  // whose writing it had not finished are dropped (taken out of the index and
  // of every session; their slots come free once the work is done or fails,
  // or after the lease timeout). Returns how many it dropped.
  uint32_t ClientGone(uint64_t client);
  // True for a lease the timeout revoked that was not released since.
  bool LeaseExpired(LeaseId lease) const;

  // --- Sessions -------------------------------------------------------------
  // A session is named by its tenant (its namespace) and its id; kNotFound
  // when that tenant has no session of that id.
  Status Evict(const Tenant& tenant, std::string_view session);
  // Ends the session's use by its client without losing its blocks: they stay
  // cached, the session holding them at its place in the eviction order (a
  // request that is over: what it computed is kept until pressure drops it),
  // and the session is the first its tenant gives up for a new session at
  // max_sessions_per_tenant (before, ended or not, a new session past it was
  // refused). A session whose last block another session holds holds nothing
  // that one does not (chains are prefixes), so it is removed at once, as is
  // an empty one. Returns the blocks the ended session keeps (0 when removed).
  // Naming the session again (Acquire, Commit, Prefetch) takes it back.
  Result<uint32_t> EndSession(const Tenant& tenant, std::string_view session);
  Result<uint32_t> Demote(const Tenant& tenant, std::string_view session);    // Blocks scheduled gpu->host.
  Result<uint32_t> Prefetch(const Tenant& tenant, std::string_view session);  // Blocks scheduled host->gpu.
  // With a ttl > 0, the priority goes back to 0 at the first Tick (or
  // ExpirePriorities) after `ttl`; a later SetPriority replaces the deadline
  // (without a ttl: none). kInvalidArgument for a ttl < 0 or > kMaxPriorityTtl.
  Status SetPriority(const Tenant& tenant, std::string_view session, int priority, std::chrono::milliseconds ttl = {});
  Result<SessionInfo> GetSession(const Tenant& tenant, std::string_view session) const;
  // Every session, ordered by tenant name, then id (tests and tools: the work
  // and the result grow with the table; a daemon pages instead).
  std::vector<SessionInfo> ListSessions() const;
  // One page of the sessions in listing order (by tenant namespace, then id):
  // those of the tenant with namespace `tenant` (every tenant's when nullopt),
  // after `after` when given, within `limits`. It walks only that tenant's
  // sessions, from the cursor on, so a page costs what it lists.
  SessionPage ListSessions(const std::optional<Namespace>& tenant, const std::optional<SessionCursor>& after,
                           const SessionPageLimits& limits) const;
  // Evicts every session of the tenant with namespace `tenant` (every session
  // when nullopt), walking that tenant's sessions alone. Returns how many.
  uint32_t EvictSessions(const std::optional<Namespace>& tenant);

  // --- Background -----------------------------------------------------------
  // Applies finished copies, and gives back what waited for clients' GPU
  // work that is done now (or that waited longer than the lease timeout).
  // Never blocks. Returns how many blocks and slots it settled.
  uint32_t Poll();
  // Demotes above the GPU high watermark, drops above the host high watermark.
  void EnforceWatermarks();
  // Sets priorities whose ttl ended by `now` back to 0. Returns how many.
  uint32_t ExpirePriorities(std::chrono::steady_clock::time_point now);
  // Revokes the leases granted lease_timeout or longer before `now`, oldest
  // first, until kLeaseExpiryWork slots and blocks were given back (the last
  // lease revoked may pass it); the rest wait for the next call (`more`). A
  // revoked lease is remembered until Release. Does nothing without a timeout.
  LeaseExpiry ExpireLeases(std::chrono::steady_clock::time_point now);
  LeaseExpiry Tick() {
    const auto now = std::chrono::steady_clock::now();
    Poll();
    const LeaseExpiry expired = ExpireLeases(now);
    ExpirePriorities(now);
    EnforceWatermarks();
    return expired;
  }
  // Takes the settings that may change while serving (e.g. on a config
  // reload) whole: an EngineOptions passed here gives its EngineTunables, and
  // the rest of it is ignored. The watermarks apply from the next
  // EnforceWatermarks. On an invalid value nothing changes (kInvalidArgument,
  // as Create would say).
  Status Retune(const EngineTunables& tunables);
  // Waits for every copy in flight and applies it, and for the promotions
  // wanted after release (PromoteOnRelease) that the landed demotions made
  // room for. kTimeout if they do not finish.
  Status WaitIdle(std::chrono::milliseconds timeout);

  // --- Warm restart (host tier only) -----------------------------------------
  // Writes the manifest of every session's host-tier prefix (see
  // warm_manifest.h) to the shared-memory segment `manifest_segment`, replacing
  // the old one atomically. `clean` marks a shutdown manifest. Payload checksums
  // are computed once per block and cached while it stays in the host tier.
  Result<WarmSaveReport> SaveWarm(const std::string& manifest_segment, bool clean);
  // True when sessions or the host tier changed since the last SaveWarm.
  bool warm_dirty() const;
  // Schedules demotion of the GPU-tier blocks of every session, warmest session
  // first, while the host tier has free slots (nothing in it is dropped for
  // room). Leased and moving blocks stay. Returns how many; WaitIdle lands them.
  uint32_t DemoteForShutdown();
  // Offers every session's host-tier blocks to on_spill as dropped (what
  // write-back stores keep), warmest session first: what a shutdown that
  // loses the host tier does. Each block once. Returns how many.
  uint32_t SpillHostTier();
  // Takes over the host tier an earlier run left (REQUIRES: options().warm_restart,
  // and nothing cached or in a session yet). A block is adopted only if its parent is
  // the null key or an adopted block, its key recomputes from parent + namespace
  // + tokens, and its slot's bytes match the payload checksum; sessions keep the
  // adopted prefix of their chain. A manifest that does not decode or match is
  // removed. No manifest: found == false, nothing changes.
  // kFailedPrecondition if the engine is not empty or warm_restart is off.
  Result<WarmAdoptReport> AdoptWarm(const std::string& manifest_segment);

  EngineStats stats() const;
  // True while any copy this engine submitted has not been applied by Poll.
  bool CopiesInFlight() const;
  // Blocks of the tenant with namespace `ns` per tier, and its leased slots.
  TenantUsage tenant_usage(const Namespace& ns) const;

  struct Impl;  // tiering/src/engine_impl.h

 private:
  friend class EngineInspector;  // tiering/src/engine_inspector.h: the invariant checker.
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::tiering
