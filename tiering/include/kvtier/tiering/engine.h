// Engine: the KV block cache of one model profile across a GPU and a host tier.
//
// It owns the pools (through a Backend), the block index (published read-only
// in shared memory for clients to probe), sessions, leases, the eviction policy
// and the mover. Every method is called from one thread (the daemon's event loop);
// the backend copies in the background and Poll() applies finished copies.
//
// Invariants the engine keeps (the test-only checker in tiering/src/engine_check.h
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
#include "kvtier/tiering/policy.h"

namespace kvtier::tiering {

using LeaseId = uint64_t;

// A tenant of one engine: the namespace that scopes its block keys and its
// sessions, and its name (for errors and listings). Tenants are told apart by
// their whole namespace; a session is named by its tenant and its id.
struct Tenant {
  Namespace ns;
  std::string name;
  // The model of the client acting (Hello's identity; null: none). Accounts,
  // quotas and sessions are the tenant's whatever the model; block keys are
  // chained in KeyNs(), so models never share blocks.
  ModelId model;

  Namespace KeyNs() const { return KeyNamespace(ns, model); }

  // Tenant `name` of the profile whose fingerprint is `profile_fingerprint`.
  static Tenant Make(uint64_t profile_fingerprint, std::string name);
};

// A tenant's block quota per tier in one engine (0 = unlimited).
struct TenantQuota {
  Tenant tenant;
  PerTier<uint32_t> blocks;
};

// Blocks a tenant holds per tier (a block in flight counts in its
// destination), its sessions, and its GPU slots in write leases: its GPU quota
// counts blocks[kGpu] + leased.
struct TenantUsage {
  PerTier<uint32_t> blocks;
  uint32_t leased = 0;  // GPU slots in its write leases, not yet committed.
  uint32_t sessions = 0;
};

// A block whose bytes sit in the host tier, offered to the stores below it
// (EngineOptions::on_spill). The spans point into the engine's index and host
// pool: valid during the call only.
struct HostBlock {
  BlockKey key;
  BlockKey parent;
  Namespace key_ns;  // The namespace its key is chained in (its tenant's and model's).
  std::span<const TokenId> tokens;
  std::span<const std::byte> payload;
  // False: it has just landed in the host tier (a demotion completed), or was
  // just committed (spill_committed), the first time since it was committed
  // or imported. True: pressure is dropping
  // it from the host tier; its slot is reused once the call returns.
  bool dropped = false;
};

// A change to the set of cached blocks (EngineOptions::on_block_event), in
// the order the engine made them: replaying them gives the blocks per tier.
enum class BlockEventKind : uint8_t {
  kStored,   // Published in `tier` (committed, fetched from a store, or taken back at a warm restart).
  kMoved,    // Its copy from `from` landed in `tier` (a demotion or promotion); `from` no longer holds it.
  kRemoved,  // Left the cache from `tier`.
};
struct BlockEvent {
  BlockEventKind kind = BlockEventKind::kStored;
  BlockKey key;
  BlockKey parent;                  // kStored: the block before it (null for block 0).
  Tier tier = Tier::kGpu;           // Where it is now (kStored, kMoved) or was (kRemoved).
  Tier from = Tier::kGpu;           // kMoved.
  std::span<const TokenId> tokens;  // kStored: its tokens, valid during the call only.
};

struct EngineOptions {
  ModelProfile profile;
  uint32_t gpu_slots = 0;
  uint32_t host_slots = 0;
  // Above high, the engine demotes (gpu) or drops (host) until usage is at low.
  double gpu_high_watermark = 0.90;
  double gpu_low_watermark = 0.75;
  double host_high_watermark = 0.95;
  double host_low_watermark = 0.85;
  uint32_t max_copy_batch = 64;      // Blocks per backend submission.
  // Sessions in all. A new session beyond it evicts one, chosen fairly: the
  // coldest of its own tenant when that tenant holds at least its share
  // (max_sessions / the tenants holding sessions, itself counted), else the
  // coldest of the tenant holding the most (which is over its share). So a
  // tenant below its share never loses a session to another tenant's new one,
  // and one past it makes room from its own; with one tenant this is the
  // coldest session.
  uint32_t max_sessions = 1 << 20;
  // Sessions one tenant (namespace) may hold; 0 = no limit. A new session past
  // it is refused (kResourceExhausted), never made room for.
  uint32_t max_sessions_per_tenant = 0;
  // Blocks one session's chain may hold; 0 = no limit. A commit past it is
  // refused (kResourceExhausted), and an acquire leases (and names into the
  // session) at most that many: one endless conversation cannot take a tier.
  uint32_t max_session_blocks = 0;
  uint32_t max_blocks_per_request = 1 << 16;
  std::string name = "default";      // The profile's name: pool objects are shm_names::PoolObject(name, tier).
  // The index's segment label (shm_names::Index: "/<instance>.<profile>.index");
  // required. The segment itself is nameless and sealed: clients map it from
  // index_fd(), read-only.
  std::string index_segment;
  // Keep the host pool's segment across runs (PoolSpec::persistent), so that
  // AdoptWarm can take its blocks back after a restart.
  bool warm_restart = false;
  // Called whenever a block leaves the cache: `dropped` is true when pressure
  // (watermarks, a full tier) pushed it out, false when its last holder let go.
  std::function<void(const BlockKey& key, bool dropped)> on_free;
  // Called on the engine's thread with every block stored, moved or removed
  // (KV events); unset, the engine pays one test of an empty function.
  std::function<void(const BlockEvent& event)> on_block_event;
  // Called when a session is evicted (by a client, or past max_sessions), with
  // its tenant's name and its id.
  std::function<void(std::string_view tenant, std::string_view session)> on_session_evicted;
  // Called on the engine's thread with each block that lands in the host tier
  // and each block that pressure drops from it (HostBlock::dropped): what a
  // tier of stores below the host tier writes through or back. It must not
  // call the engine, nor keep the spans.
  std::function<void(const HostBlock& block)> on_spill;
  // Offer each committed block to on_spill as soon as its writer is done
  // (what a write-through store needs to share it at once), not only when it
  // lands in the host tier: its bytes are copied to a free host slot for the
  // call. Nothing is evicted for that copy: with the host tier full, the
  // block is offered when it lands there instead.
  bool spill_committed = false;
  // Stores below the host tier may hold blocks the index lacks: the index
  // says so to clients (kIndexFlagStoresBelow), so that a worker whose probe
  // misses still asks (Acquire) instead of recomputing at once.
  bool stores_below = false;
  // Per-tenant quotas. The GPU quota counts a tenant's GPU blocks and the slots
  // of its write leases. A tenant at its GPU quota that allocates (or commits
  // new blocks) has its own coldest GPU blocks demoted (or, failing that,
  // dropped, when dropping makes enough room) first, never another tenant's; a
  // demotion that would pass its host quota drops its own coldest host blocks
  // first. When that cannot make room: kResourceExhausted naming the quota.
  // Promotions past the GPU quota are not made (the block is leased where it
  // is, in the host tier).
  std::vector<TenantQuota> quotas;
  // How long a lease may be held (0 = for ever). ExpireLeases (and Tick) revoke
  // older ones: a write lease's slots go back to the pool (a commit of it then
  // fails), a read lease's blocks are unpinned. May change (Retune); an age is
  // measured from the grant, so a shorter timeout applies to existing leases.
  std::chrono::milliseconds lease_timeout{0};
};

struct BlockLocation {
  Tier tier = Tier::kGpu;
  uint32_t slot = 0;
};

struct WriteLease {
  LeaseId id = 0;
  std::vector<uint32_t> slots;  // GPU-tier slots reserved for the caller to write.
};

struct ReadLease {
  LeaseId id = 0;                       // 0 when nothing was leased.
  uint32_t matched = 0;                 // Blocks of the prefix found in the cache.
  std::vector<BlockLocation> blocks;    // The leased prefix (<= matched), in order.
  Fence fence;                          // Completes when every promoted block has landed.
  uint32_t promoted = 0;                // Blocks whose host->gpu copy this lease waits for.
  uint32_t imported = 0;                // Of `matched`: placed from FetchedBlocks.
};

// What one ExpireLeases call revoked.
struct LeaseExpiry {
  uint32_t write = 0;    // Write leases revoked.
  uint32_t read = 0;     // Read leases revoked.
  uint32_t slots = 0;    // GPU slots the write leases gave back.
  uint32_t records = 0;  // Blocks the read leases unpinned.
  bool more = false;     // Expired leases are left for the next call (the work bound).
  uint32_t leases() const { return write + read; }
};

// A client's GPU work on GPU-tier blocks or slots: a watch on the
// interprocess event it recorded after that work (Backend::WatchClientEvent).
// An engine handed one owns the watch from then on, whatever the call returns:
// it ends it (Backend::EndWatch) once the work is done, or at destruction.
struct GpuWork {
  uint64_t watch = 0;   // 0: no GPU work to wait for (host backend, or done).
  uint64_t client = 0;  // Whose event it is (ClientGone).
  bool none() const { return watch == 0; }
};

// Blocks a store below the host tier returned for an Acquire (their records
// verified by the caller): payloads[i] holds the bytes of block start + i of
// the acquired keys (each the host pool's slot size).
struct FetchedBlocks {
  uint32_t start = 0;  // The cached prefix the fetch continued (what Match said).
  std::vector<std::span<const std::byte>> payloads;
};

struct CommitResult {
  uint32_t stored = 0;      // New blocks published (duplicates not counted).
  uint32_t duplicates = 0;  // Blocks that were already cached; their slots were freed.
};

struct SessionInfo {
  std::string tenant;  // Its tenant's name.
  Namespace ns;        // Its tenant's namespace.
  std::string id;
  int priority = 0;
  uint64_t last_use = 0;  // Engine clock ticks; larger is more recent.
  uint64_t idle_ms = 0;   // Milliseconds since the session was last used.
  uint32_t blocks = 0;
  PerTier<uint32_t> blocks_in;
  uint32_t moving = 0;
  uint64_t tokens = 0;
  ModelId model;                // Of its blocks (null: none, or no blocks).
  std::vector<BlockKey> chain;  // Filled by GetSession only.
  std::vector<Tier> tiers;      // Filled by GetSession only.
  // Blocks past the chain that pressure dropped while stores were below the
  // host tier (EngineOptions::on_spill), and their keys in chain order (filled
  // by GetSession only): the stores say where each is now. `blocks` and
  // `tokens` count the chain only.
  uint32_t blocks_below = 0;
  std::vector<BlockKey> below;
  // Same length as below: the local tier of a block another session keeps there, else nullopt.
  std::vector<std::optional<Tier>> below_local;
};

// Where a session listing resumes: after the session (ns, id), in listing
// order (ListSessions).
struct SessionCursor {
  Namespace ns;
  std::string id;
};

// The bounds of one page of a session listing. A page lists at least one
// session when any remains, whatever the bounds, so a caller that pages on
// always gets further.
struct SessionPageLimits {
  size_t sessions = 4096;            // Sessions listed, at most.
  uint64_t chain_blocks = 1u << 18;  // Chain blocks read to describe them, at most: what a page costs.
  // Bytes listed, at most, counting `row_bytes` plus the id and the tenant
  // name of each session: what a reply carrying the page costs.
  size_t bytes = SIZE_MAX;
  size_t row_bytes = 0;
};

struct SessionPage {
  std::vector<SessionInfo> sessions;  // In listing order; chains not filled.
  bool more = false;                  // Sessions remain after the last one listed.
};

struct EngineStats {
  PerTier<uint32_t> slots;
  PerTier<uint32_t> used;
  uint32_t blocks = 0;
  uint32_t sessions = 0;
  uint32_t read_leases = 0;
  uint32_t write_leases = 0;
  uint32_t leased_slots = 0;     // GPU slots in write leases (part of used[kGpu]).
  uint64_t oldest_lease_ms = 0;  // Age of the oldest lease held; 0 when none is.
  uint32_t copies_in_flight = 0;
  uint64_t hit_blocks = 0;
  PerTier<uint64_t> hit_blocks_in;  // Of hit_blocks, where Acquire found each (a moving block: its source tier).
  uint64_t miss_blocks = 0;
  uint64_t committed_blocks = 0;
  uint64_t duplicate_blocks = 0;
  uint64_t demoted_blocks = 0;   // Copies gpu->host completed.
  uint64_t promoted_blocks = 0;  // Copies host->gpu completed.
  uint64_t dropped_blocks = 0;   // Lost to pressure.
  uint64_t evicted_sessions = 0;
  uint64_t allocation_failures = 0;
  uint64_t expired_priorities = 0;  // Priorities set back to 0 when their TTL ran out.
  uint64_t expired_write_leases = 0;  // Revoked by the lease timeout.
  uint64_t expired_read_leases = 0;
  uint32_t gpu_work_pending = 0;           // Released leases and commits waiting for a client's GPU work.
  uint64_t expired_gpu_work = 0;           // Given back unfinished after the lease timeout.
  uint64_t unfinished_writes_dropped = 0;  // Blocks dropped: their writer went away (or failed) mid-write.
  uint64_t imported_blocks = 0;            // Placed in the host tier from a store (Acquire's FetchedBlocks).
  uint64_t spilled_blocks = 0;             // Offered to on_spill (landed or dropped).
  uint64_t after_read_promotions = 0;      // Host-tier blocks promoted once a PromoteOnRelease lease ended.
  uint64_t after_read_given_up = 0;        // Such blocks left in the host tier: no GPU room came in time.
  uint64_t warm_adopted_blocks = 0;  // Host blocks taken over from the previous run.
  uint64_t warm_dropped_blocks = 0;  // Blocks the previous run's manifest listed that failed a check.
  uint64_t warm_adopted_sessions = 0;
  uint64_t warm_snapshots = 0;       // Manifests written (SaveWarm).
};

// What AdoptWarm found and did.
struct WarmAdoptReport {
  bool found = false;       // A manifest segment existed.
  bool compatible = false;  // It decoded and matched this engine (format, profile, host pool geometry).
  bool clean = false;       // It was written at a clean shutdown, not by a periodic snapshot.
  std::string reason;       // Why a found manifest was rejected whole (then it was removed).
  uint32_t listed_blocks = 0;
  uint32_t adopted_blocks = 0;
  uint32_t dropped_blocks = 0;  // listed - adopted.
  uint32_t adopted_sessions = 0;
  uint32_t dropped_sessions = 0;
  std::chrono::microseconds took{0};
};

struct WarmSaveReport {
  uint32_t blocks = 0;
  uint32_t sessions = 0;
  uint32_t checksummed = 0;  // Payload checksums computed now (the rest were cached).
  uint64_t bytes = 0;
  std::chrono::microseconds took{0};
};

// The longest time a priority may be set for (SetPriority's ttl).
inline constexpr std::chrono::hours kMaxPriorityTtl{24 * 30};
// The work bound of one ExpireLeases call, in slots and blocks given back.
inline constexpr uint32_t kLeaseExpiryWork = 16384;

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
  // (nothing is lost then).
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

  // --- Read path ------------------------------------------------------------
  // Longest cached prefix of `keys` whose stored tokens and parents match
  // (`tokens` holds keys.size() blocks). No side effects.
  // `keys` are chained in KeyNamespace(ns, model): only blocks of that tenant
  // and model match.
  uint32_t Match(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                 const ModelId& model = {}) const;

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
  Result<ReadLease> Acquire(const Tenant& tenant, std::string_view session, std::span<const BlockKey> keys,
                            std::span<const TokenId> tokens, bool promote = true,
                            const FetchedBlocks* fetched = nullptr);
  // True if an Acquire of `keys` now would wait for GPU slots to promote its
  // host-tier blocks into, which demotions in flight (scheduled here if
  // needed) will free: the caller retries it after Poll applied copies. When
  // false, Acquire does not wait. No effect on sessions or leases.
  bool AcquireNeedsRoom(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                        const ModelId& model = {});

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
  Result<uint32_t> Demote(const Tenant& tenant, std::string_view session);    // Blocks scheduled gpu->host.
  Result<uint32_t> Prefetch(const Tenant& tenant, std::string_view session);  // Blocks scheduled host->gpu.
  // With a ttl > 0, the priority goes back to 0 at the first Tick (or
  // ExpirePriorities) after `ttl`; a later SetPriority replaces the deadline
  // (without a ttl: none). kInvalidArgument for a ttl < 0 or > kMaxPriorityTtl.
  Status SetPriority(const Tenant& tenant, std::string_view session, int priority,
                     std::chrono::milliseconds ttl = {});
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
  // Takes the watermarks, max_copy_batch and lease_timeout from `options` (the
  // settings that may change while serving, e.g. on a config reload); every
  // other field is ignored. The watermarks apply from the next EnforceWatermarks. On an invalid
  // value nothing changes (kInvalidArgument, as Create would say).
  Status Retune(const EngineOptions& options);
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
  friend class EngineInspector;  // tiering/src/engine_check.h: the invariant checker.
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::tiering
