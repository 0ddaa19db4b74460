#include "kvtier/tiering/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "block_index.h"
#include "kvtier/tiering/policy.h"
#include "session.h"
#include "slot_allocator.h"
#include "warm_manifest.h"

namespace kvtier::tiering {
namespace {

enum class BlockState : uint8_t { kFree, kReady, kDemoting, kPromoting };

struct Record {
  BlockKey key;
  uint64_t last_use = 0;  // Clock of the last use through a session; orders demotion.
  uint64_t move_seq = 0;  // Fence sequence of the copy in flight; 0 until submitted.
  uint32_t slot = 0;      // Slot in `tier` (the source while moving).
  uint32_t dst_slot = 0;  // Slot in the other tier while moving.
  uint32_t refs = 0;      // Session chains holding it.
  uint32_t readers = 0;   // Read leases holding it.
  uint32_t ns_tag = 0;
  Tier tier = Tier::kGpu;
  BlockState state = BlockState::kFree;
  bool doomed = false;    // Out of the index; freed when its copy completes.
  bool checksummed = false;  // `checksum` holds the host-tier payload's XXH3 (warm restart).
  uint64_t checksum = 0;
  Namespace ns;           // Full namespace id: a warm restart recomputes the key with it.

  bool moving() const { return state == BlockState::kDemoting || state == BlockState::kPromoting; }
};

struct Lease {
  bool write = false;
  std::vector<uint32_t> items;  // Write: GPU slots. Read: record ids.
};

struct InFlight {
  Fence fence;
  std::vector<uint32_t> records;
};

constexpr int kGpu = static_cast<int>(Tier::kGpu);
constexpr int kHost = static_cast<int>(Tier::kHost);
constexpr int Dir(CopyDirection d) { return static_cast<int>(d); }
constexpr Tier Other(Tier t) { return t == Tier::kGpu ? Tier::kHost : Tier::kGpu; }

}  // namespace

struct Engine::Impl {
  Impl(const EngineOptions& o, Backend& b, BlockIndex idx)
      : opt(o), backend(b), alloc{SlotAllocator(o.gpu_slots), SlotAllocator(o.host_slots)}, index(std::move(idx)) {}

  EngineOptions opt;
  Backend& backend;
  std::unique_ptr<Pool> pools[kTierCount];
  SlotAllocator alloc[kTierCount];
  BlockIndex index;
  std::vector<Record> records;
  std::vector<uint32_t> free_records;
  std::unordered_map<std::string, std::unique_ptr<Session>> sessions;
  std::unique_ptr<EvictionPolicy> policy;
  std::unordered_map<LeaseId, Lease> leases;
  LeaseId next_lease = 1;
  uint64_t clock = 0;
  std::vector<uint32_t> pending[kCopyStreams];
  std::deque<InFlight> inflight[kCopyStreams];
  // Priority deadlines, earliest on top. An entry whose session is gone or has
  // another deadline by now is stale and skipped.
  using Expiry = std::pair<std::chrono::steady_clock::time_point, std::string>;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> expiries;
  uint32_t demoting = 0;     // Records being demoted: GPU slots that will come free.
  // Per tenant (namespace tag): indexed blocks per tier (a moving block in its
  // source tier) and moves in flight, for quotas and stats.
  struct Usage {
    uint32_t blocks[kTierCount] = {0, 0};
    uint32_t moving_to[kTierCount] = {0, 0};
  };
  std::unordered_map<uint32_t, Usage> usage;
  std::unordered_map<uint32_t, TenantQuota> quotas;
  std::unordered_map<uint32_t, uint32_t> tenant_sessions;  // Namespace tag -> sessions.
  bool dropping = false;     // Frees now happen under pressure (reported as drops).
  uint64_t changes = 1;      // Bumped when sessions or the host tier change (warm snapshots).
  uint64_t saved_changes = 0;
  EngineStats st;

  uint32_t bt() const { return opt.profile.block_tokens; }

  // --- Records and references -------------------------------------------------
  uint32_t NewRecord() {
    const uint32_t r = free_records.back();
    free_records.pop_back();
    records[r] = Record{};
    return r;
  }

  void ReleaseRecord(uint32_t r) {
    records[r].state = BlockState::kFree;
    free_records.push_back(r);
  }

  void Ref(uint32_t r) { ++records[r].refs; }

  void Unref(uint32_t r) {
    --records[r].refs;
    MaybeFree(r);
  }

  // Frees the block once neither a session nor a lease holds it.
  void MaybeFree(uint32_t r) {
    Record& rec = records[r];
    if (rec.refs != 0 || rec.readers != 0 || rec.doomed) return;
    index.Erase(rec.key);
    Usage& u = usage[rec.ns_tag];
    --u.blocks[static_cast<int>(rec.tier)];
    if (rec.moving()) --u.moving_to[static_cast<int>(Other(rec.tier))];  // Doomed: no longer counted.
    ++changes;
    if (dropping) ++st.dropped_blocks;
    if (opt.on_free) opt.on_free(rec.key, dropping);
    if (rec.moving()) {
      rec.doomed = true;  // The copy completes later; then both slots come free.
      return;
    }
    alloc[static_cast<int>(rec.tier)].Free(rec.slot);
    ReleaseRecord(r);
  }

  // --- Sessions ----------------------------------------------------------------
  Session* FindSession(std::string_view id) const {
    auto it = sessions.find(std::string(id));
    return it == sessions.end() ? nullptr : it->second.get();
  }

  Session* GetOrCreateSession(std::string_view id, uint32_t ns_tag) {
    if (Session* s = FindSession(id)) return s;
    if (sessions.size() >= opt.max_sessions) {
      Session* coldest = nullptr;
      policy->VisitColdest([&](Session* s) {
        coldest = s;
        return false;
      });
      if (coldest != nullptr) EraseSession(coldest);
    }
    auto s = std::make_unique<Session>();
    s->id = std::string(id);
    s->ns_tag = ns_tag;
    ++tenant_sessions[ns_tag];
    Session* raw = s.get();
    sessions.emplace(raw->id, std::move(s));
    policy->Track(raw);
    return raw;
  }

  // kResourceExhausted if `id` is new and its tenant holds max_sessions_per_tenant.
  Status CheckNewSession(std::string_view id, uint32_t ns_tag) const {
    if (opt.max_sessions_per_tenant == 0 || FindSession(id) != nullptr) return Status::Ok();
    auto it = tenant_sessions.find(ns_tag);
    if (it == tenant_sessions.end() || it->second < opt.max_sessions_per_tenant) return Status::Ok();
    return ResourceExhausted("session '" + std::string(id) + "': its tenant holds " + std::to_string(it->second) +
                             " sessions, the limit (limits.max_sessions_per_tenant); evict one first");
  }

  void Touch(Session* s) {
    ++changes;
    s->last_use = clock;
    s->used_at = std::chrono::steady_clock::now();
    policy->Touch(s);
  }

  void Truncate(Session* s, size_t n) {
    while (s->chain.size() > n) {
      const uint32_t r = s->chain.back();
      s->chain.pop_back();
      Unref(r);
    }
  }

  void EraseSession(Session* s) {
    ++changes;
    Truncate(s, 0);
    policy->Untrack(s);
    ++st.evicted_sessions;
    --tenant_sessions[s->ns_tag];
    sessions.erase(s->id);
  }

  // --- Moves -------------------------------------------------------------------
  // REQUIRES: rec Ready, unleased if demoting, a free slot in the destination tier.
  void ScheduleMove(uint32_t r, CopyDirection dir) {
    Record& rec = records[r];
    const Tier dst = Other(rec.tier);
    rec.dst_slot = alloc[static_cast<int>(dst)].Allocate();
    rec.state = dir == CopyDirection::kGpuToHost ? BlockState::kDemoting : BlockState::kPromoting;
    rec.move_seq = 0;
    if (dir == CopyDirection::kGpuToHost) ++demoting;
    ++usage[rec.ns_tag].moving_to[static_cast<int>(dst)];
    index.SetLocation(rec.key, rec.tier, true);
    pending[Dir(dir)].push_back(r);
  }

  void Flush(CopyDirection dir) {
    std::vector<uint32_t>& q = pending[Dir(dir)];
    const Pool& src = *pools[dir == CopyDirection::kGpuToHost ? kGpu : kHost];
    const Pool& dst = *pools[dir == CopyDirection::kGpuToHost ? kHost : kGpu];
    std::vector<CopyOp> ops;
    for (size_t begin = 0; begin < q.size(); begin += opt.max_copy_batch) {
      const size_t end = std::min(q.size(), begin + size_t{opt.max_copy_batch});
      ops.clear();
      for (size_t i = begin; i < end; ++i) ops.push_back(CopyOp{records[q[i]].slot, records[q[i]].dst_slot});
      Result<Fence> fence = backend.SubmitCopies(dir, src, dst, ops);
      InFlight batch;
      batch.records.assign(q.begin() + static_cast<std::ptrdiff_t>(begin), q.begin() + static_cast<std::ptrdiff_t>(end));
      if (!fence.ok()) {
        // The backend refused the batch: undo the moves; the blocks stay where they are.
        for (uint32_t r : batch.records) Cancel(r);
        continue;
      }
      for (uint32_t r : batch.records) records[r].move_seq = fence->seq;
      batch.fence = *fence;
      inflight[Dir(dir)].push_back(std::move(batch));
    }
    q.clear();
  }

  void Cancel(uint32_t r) {
    Record& rec = records[r];
    if (rec.state == BlockState::kDemoting) --demoting;
    if (!rec.doomed) --usage[rec.ns_tag].moving_to[static_cast<int>(Other(rec.tier))];
    alloc[static_cast<int>(Other(rec.tier))].Free(rec.dst_slot);
    rec.state = BlockState::kReady;
    if (rec.doomed) {
      alloc[static_cast<int>(rec.tier)].Free(rec.slot);
      ReleaseRecord(r);
      return;
    }
    index.SetLocation(rec.key, rec.tier, false);
  }

  // The copy of `r` landed: switch the block to its new tier, or keep the old
  // copy if readers leased it there meanwhile (a demotion with readers).
  void Complete(uint32_t r) {
    Record& rec = records[r];
    const bool demote = rec.state == BlockState::kDemoting;
    if (demote && (rec.readers > 0 || rec.doomed)) {
      Cancel(r);
      return;
    }
    if (demote) --demoting;
    Usage& u = usage[rec.ns_tag];
    if (!rec.doomed) {
      --u.moving_to[static_cast<int>(Other(rec.tier))];
      --u.blocks[static_cast<int>(rec.tier)];
      ++u.blocks[static_cast<int>(Other(rec.tier))];
    }
    alloc[static_cast<int>(rec.tier)].Free(rec.slot);
    rec.tier = Other(rec.tier);
    rec.slot = rec.dst_slot;
    rec.state = BlockState::kReady;
    rec.checksummed = false;
    ++changes;
    if (demote) ++st.demoted_blocks; else ++st.promoted_blocks;
    if (rec.doomed) {
      alloc[static_cast<int>(rec.tier)].Free(rec.slot);
      ReleaseRecord(r);
      return;
    }
    index.SetLocation(rec.key, rec.tier, false);
  }

  uint32_t Poll() {
    uint32_t settled = 0;
    for (auto& q : inflight) {
      while (!q.empty() && backend.IsComplete(q.front().fence)) {
        for (uint32_t r : q.front().records) Complete(r);
        settled += static_cast<uint32_t>(q.front().records.size());
        q.pop_front();
      }
    }
    return settled;
  }

  // --- Pressure ----------------------------------------------------------------
  // Cuts the tails of the coldest sessions while their last block sits in `tier`,
  // unleased and not moving, until `need` slots of `tier` came free.
  // With `only`, just that tenant's sessions, except `keep`.
  uint32_t DropFromTier(Tier tier, uint32_t need, std::optional<uint32_t> only = std::nullopt,
                        const Session* keep = nullptr) {
    const uint32_t before = alloc[static_cast<int>(tier)].free_count();
    std::vector<Session*> emptied;
    dropping = true;
    policy->VisitColdest([&](Session* s) {
      if ((only && s->ns_tag != *only) || s == keep) return true;
      while (!s->chain.empty() && alloc[static_cast<int>(tier)].free_count() - before < need) {
        const Record& rec = records[s->chain.back()];
        if (rec.state != BlockState::kReady || rec.tier != tier || rec.readers != 0) break;
        const uint32_t r = s->chain.back();
        s->chain.pop_back();
        Unref(r);
      }
      if (s->chain.empty()) emptied.push_back(s);
      return alloc[static_cast<int>(tier)].free_count() - before < need;
    });
    dropping = false;
    for (Session* s : emptied) {
      policy->Untrack(s);
      --tenant_sessions[s->ns_tag];
      sessions.erase(s->id);
    }
    return alloc[static_cast<int>(tier)].free_count() - before;
  }

  // How many slots of `tier` DropFromTier(tier, need) would free (up to `need`),
  // without changing anything: the same walk, counting references instead of
  // dropping them.
  uint32_t Droppable(Tier tier, uint32_t need) const {
    std::unordered_map<uint32_t, uint32_t> refs_left;
    uint32_t freed = 0;
    policy->VisitColdest([&](Session* s) {
      for (auto it = s->chain.rbegin(); it != s->chain.rend() && freed < need; ++it) {
        const Record& rec = records[*it];
        if (rec.state != BlockState::kReady || rec.tier != tier || rec.readers != 0) break;
        auto [left, inserted] = refs_left.try_emplace(*it, rec.refs);
        if (--left->second == 0) ++freed;
      }
      return freed < need;
    });
    return freed;
  }

  // --- Quotas ------------------------------------------------------------------
  const TenantQuota* QuotaOf(uint32_t tag) const {
    auto it = quotas.find(tag);
    return it == quotas.end() ? nullptr : &it->second;
  }
  // Blocks the tenant holds in `tier` once its moves in flight land.
  uint32_t Held(uint32_t tag, Tier tier) const {
    auto it = usage.find(tag);
    if (it == usage.end()) return 0;
    const int t = static_cast<int>(tier), o = static_cast<int>(Other(tier));
    return it->second.blocks[t] + it->second.moving_to[t] - it->second.moving_to[o];
  }
  // How many more blocks the tenant may hold in `tier` (UINT32_MAX: no quota).
  uint32_t Room(uint32_t tag, Tier tier) const {
    const TenantQuota* q = QuotaOf(tag);
    const uint32_t limit = q == nullptr ? 0 : q->blocks[static_cast<int>(tier)];
    if (limit == 0) return UINT32_MAX;
    const uint32_t held = Held(tag, tier);
    return held >= limit ? 0 : limit - held;
  }
  uint32_t HostRoom(uint32_t tag) const { return Room(tag, Tier::kHost); }

  // Makes room under the tenant's GPU quota for `n` new blocks: its coldest GPU
  // blocks are demoted, then dropped (never those of session `keep`).
  Status MakeQuotaRoom(uint32_t tag, uint32_t n, const Session* keep) {
    const TenantQuota* q = QuotaOf(tag);
    if (q == nullptr || q->blocks[kGpu] == 0 || Room(tag, Tier::kGpu) >= n) return Status::Ok();
    const uint32_t limit = q->blocks[kGpu];
    auto describe = [&] {
      return "tenant '" + q->name + "' holds " + std::to_string(Held(tag, Tier::kGpu)) + " gpu blocks, its quota is " +
             std::to_string(limit) + " (tenants: gpu_blocks)";
    };
    if (n > limit) {
      return ResourceExhausted("commit of " + std::to_string(n) + " new blocks: " + describe());
    }
    DemoteColdest(n - Room(tag, Tier::kGpu), tag);
    if (Room(tag, Tier::kGpu) < n) DropFromTier(Tier::kGpu, n - Room(tag, Tier::kGpu), tag, keep);
    if (Room(tag, Tier::kGpu) < n) {
      return ResourceExhausted("commit of " + std::to_string(n) + " new blocks: " + describe() +
                               ", and its other blocks are leased, moving or in use by this session");
    }
    return Status::Ok();
  }

  bool Demotable(const Record& rec) const {
    return rec.state == BlockState::kReady && rec.tier == Tier::kGpu && rec.readers == 0;
  }

  // Schedules demotion of up to `need` blocks, coldest sessions first. A block
  // used by a warmer session since this session's last use is left for that
  // session's turn; if a whole walk does not find enough, a second walk takes such
  // blocks too (the warmer user may be gone: evicted, or cut off the block).
  // With `only`, just that tenant's blocks, and room in the host tier is made
  // from that tenant's blocks too. Without, a block whose tenant is at its host
  // quota is skipped (its tenant's own commits make room for it).
  uint32_t DemoteColdest(uint32_t need, std::optional<uint32_t> only = std::nullopt) {
    if (only) {
      const uint32_t room = HostRoom(*only);
      if (room < need) DropFromTier(Tier::kHost, need - room, only);
    }
    const uint32_t host_free = alloc[kHost].free_count();
    if (host_free < need) DropFromTier(Tier::kHost, need - host_free, only);
    uint32_t scheduled = 0;
    for (const bool defer_shared : {true, false}) {
      policy->VisitColdest([&](Session* s) {
        if (only && s->ns_tag != *only) return true;
        for (uint32_t r : s->chain) {
          if (scheduled >= need || alloc[kHost].free_count() == 0) return false;
          const Record& rec = records[r];
          if (Demotable(rec) && (!defer_shared || rec.last_use <= s->last_use) && HostRoom(rec.ns_tag) > 0) {
            ScheduleMove(r, CopyDirection::kGpuToHost);
            ++scheduled;
          }
        }
        return scheduled < need && alloc[kHost].free_count() > 0;
      });
      if (scheduled >= need || alloc[kHost].free_count() == 0) break;
    }
    Flush(CopyDirection::kGpuToHost);
    return scheduled;
  }

  // Starts freeing `count` GPU slots by demotion, not loss: if the demotions in
  // flight will not free enough, demotes the coldest blocks now (the watermark
  // tick may not have run yet). Never waits: the slots come free as the copies
  // complete (Poll).
  void MakeGpuRoom(uint32_t count) {
    if (alloc[kGpu].free_count() + demoting < count) {
      DemoteColdest(count - alloc[kGpu].free_count() - demoting);
    }
  }

  // Waits (at most `timeout` per copy batch) until `count` GPU slots are free or
  // no demotion is left in flight. For the blocking Allocate only.
  void WaitForGpuRoom(uint32_t count, std::chrono::milliseconds timeout) {
    auto& demotions = inflight[Dir(CopyDirection::kGpuToHost)];
    while (alloc[kGpu].free_count() < count && !demotions.empty()) {
      if (!backend.Wait(demotions.front().fence, timeout).ok()) break;
      Poll();
    }
  }

  void EnforceWatermarks() {
    const double gpu_cap = alloc[kGpu].capacity();
    const uint32_t gpu_effective = alloc[kGpu].used() - demoting;
    if (gpu_effective > opt.gpu_high_watermark * gpu_cap) {
      const auto target = static_cast<uint32_t>(std::floor(opt.gpu_low_watermark * gpu_cap));
      if (gpu_effective > target) DemoteColdest(gpu_effective - target);
    }
    const double host_cap = alloc[kHost].capacity();
    const uint32_t host_used = alloc[kHost].used();
    if (host_used > opt.host_high_watermark * host_cap) {
      const auto target = static_cast<uint32_t>(std::floor(opt.host_low_watermark * host_cap));
      if (host_used > target) DropFromTier(Tier::kHost, host_used - target);
    }
  }

  // --- Lookup ------------------------------------------------------------------
  // Longest verified prefix; fills `out` with its record ids.
  uint32_t MatchRecords(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                        std::vector<uint32_t>* out) const {
    const size_t n = std::min(keys.size(), tokens.size() / bt());
    out->resize(n);
    // Entries of another namespace count as absent; the hits' rows are prefetched.
    const size_t found = index.FindPrefix(keys.first(n), NamespaceTag(ns), *out);
    uint32_t matched = 0;
    for (size_t i = 0; i < found; ++i) {
      const uint32_t r = (*out)[i];
      const BlockKey parent = i == 0 ? BlockKey{} : keys[i - 1];
      if (!index.RowMatches(r, parent, tokens.subspan(i * bt(), bt()))) break;
      ++matched;
    }
    out->resize(matched);
    return matched;
  }

  // An allocation of `count` slots is possible at all (however full the tier).
  Status CheckAllocateCount(uint32_t count) const {
    if (count == 0 || count > opt.max_blocks_per_request) {
      return InvalidArgument("allocate count " + std::to_string(count) + " not in [1, " +
                             std::to_string(opt.max_blocks_per_request) + "]");
    }
    if (count > alloc[kGpu].capacity()) {
      return ResourceExhausted("allocate " + std::to_string(count) + " blocks: the gpu tier has only " +
                               std::to_string(alloc[kGpu].capacity()) + " slots");
    }
    return Status::Ok();
  }

  // Reserves `count` GPU slots now, dropping the coldest unleased GPU blocks if
  // that makes enough room; kResourceExhausted (losing nothing) otherwise.
  Result<WriteLease> AllocateNow(uint32_t count);

  LeaseId NewLease(Lease lease) {
    const LeaseId id = next_lease++;
    if (lease.write) ++st.write_leases; else ++st.read_leases;
    leases.emplace(id, std::move(lease));
    return id;
  }
};

// ---------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (!impl_) return;
  // Copies may still target the pools: let them land before the pools go.
  for (auto& q : impl_->inflight) {
    if (!q.empty()) (void)impl_->backend.Wait(q.back().fence, std::chrono::seconds(30));
  }
}

namespace {

// The checks on the options Retune may change.
Status CheckTunables(const EngineOptions& o) {
  auto wm_ok = [](double lo, double hi) { return lo > 0 && lo <= hi && hi <= 1.0; };
  if (!wm_ok(o.gpu_low_watermark, o.gpu_high_watermark) || !wm_ok(o.host_low_watermark, o.host_high_watermark)) {
    return InvalidArgument("watermarks must satisfy 0 < low <= high <= 1");
  }
  if (o.max_copy_batch == 0) return InvalidArgument("max_copy_batch must be > 0");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o, Backend& backend,
                                               std::unique_ptr<EvictionPolicy> policy) {
  KVTIER_RETURN_IF_ERROR(o.profile.Validate());
  if (o.gpu_slots == 0 || o.host_slots == 0) return InvalidArgument("gpu_slots and host_slots must be > 0");
  if (uint64_t{o.gpu_slots} + o.host_slots > (1u << 30)) return InvalidArgument("more than 2^30 slots in all");
  KVTIER_RETURN_IF_ERROR(CheckTunables(o));
  if (o.max_sessions == 0) return InvalidArgument("max_sessions must be > 0");
  if (o.index_segment.empty()) return InvalidArgument("index_segment must name a shared-memory segment");

  const uint32_t max_records = o.gpu_slots + o.host_slots;
  auto index = BlockIndex::Create(o.index_segment, o.profile.block_tokens, max_records, o.profile.Fingerprint(),
                                 static_cast<mode_t>(o.segment_mode), static_cast<gid_t>(o.segment_group));
  if (!index.ok()) return index.status();
  auto impl = std::make_unique<Impl>(o, backend, std::move(index).value());
  const size_t bytes = o.profile.BlockBytes();
  for (Tier t : {Tier::kGpu, Tier::kHost}) {
    PoolSpec spec{t, bytes, t == Tier::kGpu ? o.gpu_slots : o.host_slots, o.name + "." + TierName(t)};
    spec.persistent = o.warm_restart && t == Tier::kHost;
    auto pool = backend.CreatePool(spec);
    if (!pool.ok()) return pool.status();
    impl->pools[static_cast<int>(t)] = std::move(pool).value();
  }
  impl->records.resize(max_records);
  impl->free_records.reserve(max_records);
  for (uint32_t r = max_records; r > 0; --r) impl->free_records.push_back(r - 1);
  impl->policy = policy ? std::move(policy) : MakeLruPolicy();
  for (const TenantQuota& q : o.quotas) {
    if (!impl->quotas.emplace(q.ns_tag, q).second) return InvalidArgument("two quotas for tenant '" + q.name + "'");
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const ModelProfile& Engine::profile() const { return impl_->opt.profile; }
const EngineOptions& Engine::options() const { return impl_->opt; }
Pool& Engine::pool(Tier tier) const { return *impl_->pools[static_cast<int>(tier)]; }
const std::string& Engine::index_segment_name() const { return impl_->index.segment_name(); }

Result<WriteLease> Engine::Allocate(uint32_t count) {
  Impl& m = *impl_;
  KVTIER_RETURN_IF_ERROR(m.CheckAllocateCount(count));
  m.Poll();
  m.MakeGpuRoom(count);
  m.WaitForGpuRoom(count, std::chrono::milliseconds(200));
  return m.AllocateNow(count);
}

Result<std::optional<WriteLease>> Engine::TryAllocate(uint32_t count, bool may_wait) {
  Impl& m = *impl_;
  KVTIER_RETURN_IF_ERROR(m.CheckAllocateCount(count));
  m.Poll();
  if (m.alloc[kGpu].free_count() < count) {
    m.MakeGpuRoom(count);
    // Demotions in flight free slots within a copy's time: come back then.
    if (may_wait && m.alloc[kGpu].free_count() < count && m.demoting > 0) return std::optional<WriteLease>();
  }
  auto lease = m.AllocateNow(count);
  if (!lease.ok()) return lease.status();
  return std::optional<WriteLease>(std::move(*lease));
}

bool Engine::AcquireNeedsRoom(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens) {
  Impl& m = *impl_;
  if (keys.size() > m.opt.max_blocks_per_request || tokens.size() != keys.size() * m.bt()) return false;
  // Room for every key: nothing to wait for, and no need to match twice.
  if (m.alloc[kGpu].free_count() >= keys.size()) return false;
  m.Poll();
  std::vector<uint32_t> recs;
  m.MatchRecords(ns, keys, tokens, &recs);
  uint32_t to_promote = 0;
  for (uint32_t r : recs) {
    const Record& rec = m.records[r];
    to_promote += rec.state == BlockState::kReady && rec.tier == Tier::kHost && rec.readers == 0;
  }
  if (to_promote <= m.alloc[kGpu].free_count()) return false;
  // Pinned while room is made, so the demotion walk and host-tier drops pass
  // them by (Acquire pins them the same way).
  for (uint32_t r : recs) ++m.records[r].readers;
  m.MakeGpuRoom(to_promote);
  for (uint32_t r : recs) --m.records[r].readers;
  return m.alloc[kGpu].free_count() < to_promote && m.demoting > 0;
}

Result<WriteLease> Engine::Impl::AllocateNow(uint32_t count) {
  Impl& m = *this;
  if (m.alloc[kGpu].free_count() < count) {
    // Drop only when dropping makes enough room: a failed allocation loses nothing.
    const uint32_t short_by = count - m.alloc[kGpu].free_count();
    if (m.Droppable(Tier::kGpu, short_by) >= short_by) m.DropFromTier(Tier::kGpu, short_by);
  }
  if (m.alloc[kGpu].free_count() < count) {
    ++m.st.allocation_failures;
    return ResourceExhausted("gpu tier full: " + std::to_string(m.alloc[kGpu].free_count()) + " of " +
                             std::to_string(m.alloc[kGpu].capacity()) + " slots free, " + std::to_string(count) +
                             " requested; the rest are leased or moving");
  }
  Lease lease;
  lease.write = true;
  lease.items.reserve(count);
  for (uint32_t i = 0; i < count; ++i) lease.items.push_back(m.alloc[kGpu].Allocate());
  WriteLease out;
  out.slots = lease.items;
  out.id = m.NewLease(std::move(lease));
  return out;
}

Result<CommitResult> Engine::Commit(LeaseId lease_id, std::string_view session_id, const Namespace& ns,
                                    const BlockKey& parent, uint32_t start_block, std::span<const TokenId> tokens,
                                    std::span<const uint32_t> slots) {
  Impl& m = *impl_;
  auto it = m.leases.find(lease_id);
  if (it == m.leases.end() || !it->second.write) {
    return NotFound("write lease " + std::to_string(lease_id) + " does not exist");
  }
  if (session_id.empty()) return InvalidArgument("commit needs a session id");
  if (tokens.size() % m.bt() != 0) {
    return InvalidArgument(std::to_string(tokens.size()) + " tokens is not a whole number of " +
                           std::to_string(m.bt()) + "-token blocks");
  }
  const size_t n = tokens.size() / m.bt();
  if (n != slots.size()) {
    return InvalidArgument(std::to_string(n) + " blocks of tokens but " + std::to_string(slots.size()) + " slots");
  }
  if (n == 0 || n > m.opt.max_blocks_per_request) return InvalidArgument("commit of 0 or too many blocks");
  Lease& lease = it->second;
  {
    std::vector<uint32_t> want(slots.begin(), slots.end());
    std::sort(want.begin(), want.end());
    if (std::adjacent_find(want.begin(), want.end()) != want.end()) return InvalidArgument("a slot is committed twice");
    std::vector<uint32_t> have = lease.items;
    std::sort(have.begin(), have.end());
    if (!std::includes(have.begin(), have.end(), want.begin(), want.end())) {
      return InvalidArgument("a committed slot is not part of write lease " + std::to_string(lease_id));
    }
  }

  {
    // The commit must continue the session where the caller saw it: its first
    // start_block blocks, the last of them keyed `parent`.
    const Session* existing = m.FindSession(session_id);
    const size_t have = existing == nullptr ? 0 : existing->chain.size();
    if (start_block > have) {
      return FailedPrecondition("commit at block " + std::to_string(start_block) + " of session '" +
                                std::string(session_id) + "', which holds " + std::to_string(have) +
                                " blocks; acquire its prefix under the session first");
    }
    if (start_block > 0 && m.records[existing->chain[start_block - 1]].key != parent) {
      return FailedPrecondition("commit parent is not block " + std::to_string(start_block - 1) + " of session '" +
                                std::string(session_id) + "'");
    }
    if (start_block == 0 && !parent.IsNull()) {
      return InvalidArgument("a commit at block 0 must have the null parent key");
    }
  }
  KVTIER_RETURN_IF_ERROR(m.CheckNewSession(session_id, NamespaceTag(ns)));
  if (m.QuotaOf(NamespaceTag(ns)) != nullptr) {
    // New blocks count against the tenant's GPU quota; duplicates do not.
    uint32_t fresh = 0;
    BlockKey prev = parent;
    for (size_t i = 0; i < n; ++i) {
      prev = ChainKey(prev, ns, tokens.subspan(i * m.bt(), m.bt()));
      fresh += m.index.Find(prev) == kNoRecord ? 1 : 0;
    }
    KVTIER_RETURN_IF_ERROR(m.MakeQuotaRoom(NamespaceTag(ns), fresh, m.FindSession(session_id)));
  }
  ++m.clock;
  Session* s = m.GetOrCreateSession(session_id, NamespaceTag(ns));
  // The chain past start_block is replaced; its references go only after the new
  // blocks took theirs, so re-committing cached blocks finds them as duplicates.
  std::vector<uint32_t> replaced;
  if (s->chain.size() > start_block) {
    replaced.assign(s->chain.begin() + start_block, s->chain.end());
    s->chain.resize(start_block);
  }
  CommitResult result;
  BlockKey prev = parent;
  for (size_t i = 0; i < n; ++i) {
    const std::span<const TokenId> block = tokens.subspan(i * m.bt(), m.bt());
    const BlockKey key = ChainKey(prev, ns, block);
    const uint32_t slot = slots[i];
    uint32_t r = m.index.Find(key);
    if (r != kNoRecord) {
      m.alloc[kGpu].Free(slot);  // First copy wins.
      ++result.duplicates;
      if (!m.index.RowMatches(r, prev, block) || m.records[r].ns_tag != NamespaceTag(ns)) {
        prev = key;  // A 128-bit collision: the block cannot be published.
        continue;
      }
    } else {
      r = m.NewRecord();
      Record& rec = m.records[r];
      rec.key = key;
      rec.slot = slot;
      rec.tier = Tier::kGpu;
      rec.state = BlockState::kReady;
      rec.ns_tag = NamespaceTag(ns);
      rec.ns = ns;
      m.index.WriteRow(r, prev, block);
      m.index.Insert(key, r, rec.ns_tag, Tier::kGpu);
      ++m.usage[rec.ns_tag].blocks[kGpu];
      ++result.stored;
    }
    m.records[r].last_use = m.clock;
    m.Ref(r);
    s->chain.push_back(r);
    prev = key;
  }
  for (auto r = replaced.rbegin(); r != replaced.rend(); ++r) m.Unref(*r);
  m.Touch(s);
  {
    // Committed slots leave the write lease (n log n, not n * lease size).
    std::vector<uint32_t> done(slots.begin(), slots.end());
    std::sort(done.begin(), done.end());
    std::erase_if(lease.items, [&](uint32_t x) { return std::binary_search(done.begin(), done.end(), x); });
  }
  m.st.committed_blocks += result.stored;
  m.st.duplicate_blocks += result.duplicates;
  return result;
}

uint32_t Engine::Match(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens) const {
  std::vector<uint32_t> recs;
  return impl_->MatchRecords(ns, keys, tokens, &recs);
}

Result<ReadLease> Engine::Acquire(std::string_view session_id, const Namespace& ns, std::span<const BlockKey> keys,
                                  std::span<const TokenId> tokens, bool promote) {
  Impl& m = *impl_;
  if (keys.size() > m.opt.max_blocks_per_request) return InvalidArgument("acquire of too many blocks");
  if (tokens.size() != keys.size() * m.bt()) {
    return InvalidArgument("acquire: " + std::to_string(keys.size()) + " keys need " +
                           std::to_string(keys.size() * m.bt()) + " tokens, got " + std::to_string(tokens.size()));
  }
  if (!session_id.empty()) KVTIER_RETURN_IF_ERROR(m.CheckNewSession(session_id, NamespaceTag(ns)));
  ++m.clock;
  std::vector<uint32_t> recs;
  const uint32_t matched = m.MatchRecords(ns, keys, tokens, &recs);
  m.st.hit_blocks += matched;
  m.st.miss_blocks += keys.size() - matched;
  Session* s = nullptr;
  if (!session_id.empty()) {
    // Take the new references before making the session (making one may evict
    // another, whose blocks may be these) and before dropping the old ones.
    for (uint32_t r : recs) m.Ref(r);
    s = m.GetOrCreateSession(session_id, NamespaceTag(ns));
    // Only a session's use orders demotion; a reader without one (a probe, a
    // scheduler) must not make blocks look warmer than every session holding them.
    for (uint32_t r : recs) m.records[r].last_use = m.clock;
    std::vector<uint32_t> old = std::move(s->chain);
    s->chain = recs;
    for (auto r = old.rbegin(); r != old.rend(); ++r) m.Unref(*r);
    m.Touch(s);
  }

  ReadLease out;
  out.matched = matched;
  Lease lease;
  uint64_t wait_seq = 0;
  if (promote) {
    // Host-tier hits need GPU slots: demote colder blocks to make room rather
    // than lease a shorter prefix. This session was just touched, so it is the
    // last one the demotion walk reaches.
    uint32_t to_promote = 0;
    for (uint32_t r : recs) {
      const Record& rec = m.records[r];
      to_promote += rec.state == BlockState::kReady && rec.tier == Tier::kHost && rec.readers == 0;
    }
    // Making room may drop host blocks: pin the matched ones meanwhile, so
    // that none of them is dropped (or freed) before it is leased below.
    for (uint32_t r : recs) ++m.records[r].readers;
    if (to_promote > m.alloc[kGpu].free_count()) {
      m.MakeGpuRoom(to_promote);
      m.WaitForGpuRoom(to_promote, std::chrono::milliseconds(200));
    }
    // Under a GPU quota, the tenant's colder GPU blocks make way (this session
    // was just touched: it is the last the walk reaches).
    const uint32_t room = m.Room(NamespaceTag(ns), Tier::kGpu);
    if (to_promote > room) m.DemoteColdest(to_promote - room, NamespaceTag(ns));
    for (uint32_t r : recs) --m.records[r].readers;  // Taken again below, or freed after it.
  }
  for (uint32_t r : recs) {
    Record& rec = m.records[r];
    if (rec.state == BlockState::kReady && rec.tier == Tier::kHost && promote && rec.readers == 0 &&
        m.Room(rec.ns_tag, Tier::kGpu) > 0) {
      if (m.alloc[kGpu].free_count() == 0) break;  // No room to promote: lease what we have.
      m.ScheduleMove(r, CopyDirection::kHostToGpu);
    }
    ++rec.readers;
    lease.items.push_back(r);
  }
  // A matched block left out of the lease (no room to promote) whose last
  // session reference went while it was pinned is freed now.
  m.dropping = true;
  for (size_t i = lease.items.size(); i < recs.size(); ++i) m.MaybeFree(recs[i]);
  m.dropping = false;
  m.Flush(CopyDirection::kHostToGpu);
  // Locations are read after the flush: if the backend refused a batch, its moves
  // were cancelled and those blocks are leased where they are.
  for (uint32_t r : lease.items) {
    const Record& rec = m.records[r];
    if (rec.state == BlockState::kPromoting) {
      out.blocks.push_back(BlockLocation{Tier::kGpu, rec.dst_slot});
      ++out.promoted;
      wait_seq = std::max(wait_seq, rec.move_seq);
    } else {
      out.blocks.push_back(BlockLocation{rec.tier, rec.slot});
    }
  }
  out.fence = Fence{wait_seq, CopyDirection::kHostToGpu};
  if (!lease.items.empty()) out.id = m.NewLease(std::move(lease));
  return out;
}

Status Engine::Release(LeaseId lease_id) {
  Impl& m = *impl_;
  auto it = m.leases.find(lease_id);
  if (it == m.leases.end()) return NotFound("lease " + std::to_string(lease_id) + " does not exist");
  Lease lease = std::move(it->second);
  m.leases.erase(it);
  if (lease.write) {
    --m.st.write_leases;
    for (uint32_t slot : lease.items) m.alloc[kGpu].Free(slot);
  } else {
    --m.st.read_leases;
    for (uint32_t r : lease.items) {
      --m.records[r].readers;
      m.MaybeFree(r);
    }
  }
  return Status::Ok();
}

Status Engine::Evict(std::string_view session_id) {
  Session* s = impl_->FindSession(session_id);
  if (s == nullptr) return NotFound("session '" + std::string(session_id) + "' does not exist");
  impl_->EraseSession(s);
  return Status::Ok();
}

Result<uint32_t> Engine::Demote(std::string_view session_id) {
  Impl& m = *impl_;
  Session* s = m.FindSession(session_id);
  if (s == nullptr) return NotFound("session '" + std::string(session_id) + "' does not exist");
  uint32_t want = 0;
  for (uint32_t r : s->chain) want += m.Demotable(m.records[r]) ? 1 : 0;
  if (const uint32_t room = m.HostRoom(s->ns_tag); want > room) {
    m.DropFromTier(Tier::kHost, want - room, s->ns_tag, s);  // Under its host quota: its own blocks go.
  }
  if (want > m.alloc[kHost].free_count()) m.DropFromTier(Tier::kHost, want - m.alloc[kHost].free_count());
  uint32_t scheduled = 0;
  for (uint32_t r : s->chain) {  // The session may have lost blocks to the drop above.
    if (m.alloc[kHost].free_count() == 0 || m.HostRoom(s->ns_tag) == 0) break;
    if (m.Demotable(m.records[r])) {
      m.ScheduleMove(r, CopyDirection::kGpuToHost);
      ++scheduled;
    }
  }
  m.Flush(CopyDirection::kGpuToHost);
  return scheduled;
}

Result<uint32_t> Engine::Prefetch(std::string_view session_id) {
  Impl& m = *impl_;
  Session* s = m.FindSession(session_id);
  if (s == nullptr) return NotFound("session '" + std::string(session_id) + "' does not exist");
  ++m.clock;
  uint32_t scheduled = 0;
  for (uint32_t r : s->chain) {
    Record& rec = m.records[r];
    rec.last_use = m.clock;
    if (rec.state != BlockState::kReady || rec.tier != Tier::kHost || rec.readers != 0) continue;
    if (m.alloc[kGpu].free_count() == 0 || m.Room(rec.ns_tag, Tier::kGpu) == 0) break;
    m.ScheduleMove(r, CopyDirection::kHostToGpu);
    ++scheduled;
  }
  m.Touch(s);
  m.Flush(CopyDirection::kHostToGpu);
  return scheduled;
}

Status Engine::SetPriority(std::string_view session_id, int priority, std::chrono::milliseconds ttl) {
  if (priority < kMinPriority || priority > kMaxPriority) {
    return InvalidArgument("priority " + std::to_string(priority) + " not in [0, 7]");
  }
  if (ttl.count() < 0 || ttl > kMaxPriorityTtl) {
    return InvalidArgument("priority ttl of " + std::to_string(ttl.count()) + " ms not in [0, " +
                           std::to_string(std::chrono::milliseconds(kMaxPriorityTtl).count()) + "]");
  }
  Session* s = impl_->FindSession(session_id);
  if (s == nullptr) return NotFound("session '" + std::string(session_id) + "' does not exist");
  s->priority = priority;
  s->priority_until = {};
  ++impl_->changes;
  if (ttl.count() > 0) {
    s->priority_until = std::chrono::steady_clock::now() + ttl;
    impl_->expiries.emplace(s->priority_until, s->id);
  }
  impl_->policy->Track(s);
  return Status::Ok();
}

uint32_t Engine::ExpirePriorities(std::chrono::steady_clock::time_point now) {
  Impl& m = *impl_;
  uint32_t expired = 0;
  while (!m.expiries.empty() && m.expiries.top().first <= now) {
    const Impl::Expiry e = m.expiries.top();
    m.expiries.pop();
    Session* s = m.FindSession(e.second);
    if (s == nullptr || s->priority_until != e.first) continue;
    s->priority = 0;  // What every session starts with.
    s->priority_until = {};
    m.policy->Track(s);
    ++expired;
  }
  m.st.expired_priorities += expired;
  return expired;
}

Status Engine::Retune(const EngineOptions& o) {
  KVTIER_RETURN_IF_ERROR(CheckTunables(o));
  EngineOptions& opt = impl_->opt;
  opt.gpu_high_watermark = o.gpu_high_watermark;
  opt.gpu_low_watermark = o.gpu_low_watermark;
  opt.host_high_watermark = o.host_high_watermark;
  opt.host_low_watermark = o.host_low_watermark;
  opt.max_copy_batch = o.max_copy_batch;
  return Status::Ok();
}

namespace {

SessionInfo Describe(const Session& s, const std::vector<Record>& records, uint32_t block_tokens, bool detail) {
  SessionInfo info;
  info.id = s.id;
  info.ns_tag = s.ns_tag;
  info.priority = s.priority;
  info.last_use = s.last_use;
  info.idle_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - s.used_at)
                                           .count());
  info.blocks = static_cast<uint32_t>(s.chain.size());
  info.tokens = uint64_t{info.blocks} * block_tokens;
  for (uint32_t r : s.chain) {
    const Record& rec = records[r];
    ++info.blocks_in[static_cast<int>(rec.tier)];
    if (rec.moving()) ++info.moving;
    if (detail) {
      info.chain.push_back(rec.key);
      info.tiers.push_back(rec.tier);
    }
  }
  return info;
}

}  // namespace

Result<SessionInfo> Engine::GetSession(std::string_view session_id) const {
  const Session* s = impl_->FindSession(session_id);
  if (s == nullptr) return NotFound("session '" + std::string(session_id) + "' does not exist");
  return Describe(*s, impl_->records, impl_->bt(), true);
}

std::vector<SessionInfo> Engine::ListSessions() const {
  std::vector<SessionInfo> out;
  out.reserve(impl_->sessions.size());
  for (const auto& [id, s] : impl_->sessions) out.push_back(Describe(*s, impl_->records, impl_->bt(), false));
  std::sort(out.begin(), out.end(), [](const SessionInfo& a, const SessionInfo& b) { return a.id < b.id; });
  return out;
}

uint32_t Engine::Poll() { return impl_->Poll(); }

void Engine::EnforceWatermarks() { impl_->EnforceWatermarks(); }

Status Engine::WaitIdle(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  for (int d = 0; d < kCopyStreams; ++d) m.Flush(static_cast<CopyDirection>(d));
  for (auto& q : m.inflight) {
    if (!q.empty()) KVTIER_RETURN_IF_ERROR(m.backend.Wait(q.back().fence, timeout));
  }
  m.Poll();
  return Status::Ok();
}

// --- Warm restart ------------------------------------------------------------------

namespace {

std::chrono::microseconds Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
}

}  // namespace

bool Engine::warm_dirty() const { return impl_->changes != impl_->saved_changes; }

Result<WarmSaveReport> Engine::SaveWarm(const std::string& manifest_segment, bool clean) {
  Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  const Pool& host = *m.pools[kHost];
  WarmManifest manifest;
  manifest.geometry = WarmGeometry{m.opt.profile.Fingerprint(), host.slot_bytes(), m.bt(), host.slots()};
  manifest.clean = clean;
  manifest.written_unix_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       std::chrono::system_clock::now().time_since_epoch())
                                                       .count());
  WarmSaveReport report;
  std::vector<Session*> coldest_first;
  m.policy->VisitColdest([&](Session* s) {
    coldest_first.push_back(s);
    return true;
  });
  std::unordered_map<uint32_t, uint32_t> listed;  // Record -> index in manifest.blocks.
  for (Session* s : coldest_first) {
    WarmSession ws;
    for (uint32_t r : s->chain) {
      // Only the host-tier prefix: a block whose parent is not kept is of no use.
      Record& rec = m.records[r];
      if (rec.state != BlockState::kReady || rec.tier != Tier::kHost) break;
      auto [it, added] = listed.try_emplace(r, static_cast<uint32_t>(manifest.blocks.size()));
      if (added) {
        if (!rec.checksummed) {
          rec.checksum = PayloadChecksum(host.slot_data(rec.slot), host.slot_bytes());
          rec.checksummed = true;
          ++report.checksummed;
        }
        WarmBlock b;
        b.key = rec.key;
        b.parent = m.index.parent(r);
        b.ns = rec.ns;
        b.checksum = rec.checksum;
        b.host_slot = rec.slot;
        b.tokens.assign(m.index.tokens(r), m.index.tokens(r) + m.bt());
        manifest.blocks.push_back(std::move(b));
      }
      ws.chain.push_back(it->second);
    }
    if (ws.chain.empty()) continue;
    ws.id = s->id;
    ws.priority = s->priority;
    manifest.sessions.push_back(std::move(ws));
  }
  const std::vector<std::byte> bytes = EncodeWarmManifest(manifest);
  KVTIER_RETURN_IF_ERROR(WriteWarmSegment(manifest_segment, bytes));
  m.saved_changes = m.changes;
  ++m.st.warm_snapshots;
  report.blocks = static_cast<uint32_t>(manifest.blocks.size());
  report.sessions = static_cast<uint32_t>(manifest.sessions.size());
  report.bytes = bytes.size();
  report.took = Since(start);
  return report;
}

uint32_t Engine::DemoteForShutdown() {
  Impl& m = *impl_;
  std::vector<Session*> coldest_first;
  m.policy->VisitColdest([&](Session* s) {
    coldest_first.push_back(s);
    return true;
  });
  uint32_t scheduled = 0;
  for (auto it = coldest_first.rbegin(); it != coldest_first.rend(); ++it) {
    for (uint32_t r : (*it)->chain) {
      if (m.alloc[kHost].free_count() == 0) break;
      if (m.Demotable(m.records[r])) {
        m.ScheduleMove(r, CopyDirection::kGpuToHost);
        ++scheduled;
      }
    }
  }
  m.Flush(CopyDirection::kGpuToHost);
  return scheduled;
}

Result<WarmAdoptReport> Engine::AdoptWarm(const std::string& manifest_segment) {
  Impl& m = *impl_;
  if (!m.opt.warm_restart) return FailedPrecondition("warm restart is off for this engine");
  if (m.index.size() != 0 || !m.sessions.empty() || !m.leases.empty()) {
    return FailedPrecondition("a warm restart adopts into an empty engine only");
  }
  const auto start = std::chrono::steady_clock::now();
  WarmAdoptReport report;
  auto bytes = ReadWarmSegment(manifest_segment);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return report;
    return bytes.status();
  }
  report.found = true;
  Pool& host = *m.pools[kHost];
  const WarmGeometry expected{m.opt.profile.Fingerprint(), host.slot_bytes(), m.bt(), host.slots()};
  auto decoded = DecodeWarmManifest(*bytes, expected);
  if (!decoded.ok() || !host.adopted()) {
    report.reason = !decoded.ok() ? decoded.status().message()
                                  : "the host pool segment was missing or had another size, so its blocks are gone";
    RemoveWarmSegment(manifest_segment);
    report.took = Since(start);
    return report;
  }
  const WarmManifest& manifest = *decoded;
  report.compatible = true;
  report.clean = manifest.clean;
  report.listed_blocks = static_cast<uint32_t>(manifest.blocks.size());

  // Blocks, parents first: each must chain from an adopted parent (or the null
  // key), recompute to its key, and still hold the bytes it was saved with.
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> by_key;
  std::vector<uint32_t> record_of(manifest.blocks.size(), kNoRecord);
  std::vector<uint32_t> slots;
  for (size_t i = 0; i < manifest.blocks.size(); ++i) {
    const WarmBlock& b = manifest.blocks[i];
    if (!b.parent.IsNull() && by_key.find(b.parent) == by_key.end()) continue;
    if (by_key.find(b.key) != by_key.end()) continue;
    if (ChainKey(b.parent, b.ns, b.tokens) != b.key) continue;
    if (PayloadChecksum(host.slot_data(b.host_slot), host.slot_bytes()) != b.checksum) continue;
    const uint32_t r = m.NewRecord();
    Record& rec = m.records[r];
    rec.key = b.key;
    rec.slot = b.host_slot;
    rec.tier = Tier::kHost;
    rec.state = BlockState::kReady;
    rec.ns = b.ns;
    rec.ns_tag = NamespaceTag(b.ns);
    rec.checksum = b.checksum;
    rec.checksummed = true;
    m.index.WriteRow(r, b.parent, b.tokens);
    m.index.Insert(b.key, r, rec.ns_tag, Tier::kHost);
    ++m.usage[rec.ns_tag].blocks[kHost];
    by_key.emplace(b.key, r);
    record_of[i] = r;
    slots.push_back(b.host_slot);
  }
  if (!m.alloc[kHost].Take(slots)) std::abort();  // Decode guarantees distinct, in-range slots.

  // Sessions, coldest first (so the LRU order comes back), each cut at its first
  // block that was not adopted or does not continue the chain.
  for (const WarmSession& ws : manifest.sessions) {
    std::vector<uint32_t> chain;
    BlockKey prev;
    for (uint32_t i : ws.chain) {
      const uint32_t r = record_of[i];
      if (r == kNoRecord || manifest.blocks[i].parent != prev) break;
      chain.push_back(r);
      prev = manifest.blocks[i].key;
    }
    if (chain.empty() || m.FindSession(ws.id) != nullptr) {
      ++report.dropped_sessions;
      continue;
    }
    ++m.clock;
    for (uint32_t r : chain) {
      m.Ref(r);
      m.records[r].last_use = m.clock;
    }
    Session* s = m.GetOrCreateSession(ws.id, m.records[chain.front()].ns_tag);
    s->chain = std::move(chain);
    s->priority = std::clamp(ws.priority, kMinPriority, kMaxPriority);
    m.policy->Track(s);
    m.Touch(s);
    ++report.adopted_sessions;
  }
  // What no session holds would be freed at once: let it go now.
  for (uint32_t r : record_of) {
    if (r == kNoRecord || m.records[r].refs != 0) continue;
    m.index.Erase(m.records[r].key);
    --m.usage[m.records[r].ns_tag].blocks[kHost];
    m.alloc[kHost].Free(m.records[r].slot);
    m.ReleaseRecord(r);
  }
  report.adopted_blocks = m.index.size();
  report.dropped_blocks = report.listed_blocks - report.adopted_blocks;
  m.st.warm_adopted_blocks += report.adopted_blocks;
  m.st.warm_dropped_blocks += report.dropped_blocks;
  m.st.warm_adopted_sessions += report.adopted_sessions;
  ++m.changes;  // The next snapshot replaces the old (clean) manifest.
  report.took = Since(start);
  return report;
}

bool Engine::CopiesInFlight() const {
  for (const auto& q : impl_->inflight) {
    if (!q.empty()) return true;
  }
  return false;
}

EngineStats Engine::stats() const {
  const Impl& m = *impl_;
  EngineStats s = m.st;
  for (int t = 0; t < kTierCount; ++t) {
    s.slots[t] = m.alloc[t].capacity();
    s.used[t] = m.alloc[t].used();
  }
  s.blocks = m.index.size();
  s.sessions = static_cast<uint32_t>(m.sessions.size());
  s.copies_in_flight = 0;
  for (const auto& q : m.inflight) {
    for (const auto& b : q) s.copies_in_flight += static_cast<uint32_t>(b.records.size());
  }
  return s;
}

TenantUsage Engine::tenant_usage(uint32_t ns_tag) const {
  TenantUsage out;
  for (Tier t : {Tier::kGpu, Tier::kHost}) out.blocks[static_cast<int>(t)] = impl_->Held(ns_tag, t);
  return out;
}

Status Engine::CheckInvariants() const {
  const Impl& m = *impl_;
  auto fail = [](const std::string& what) { return Internal("invariant: " + what); };
  std::vector<uint8_t> owned[kTierCount] = {std::vector<uint8_t>(m.alloc[kGpu].capacity()),
                                            std::vector<uint8_t>(m.alloc[kHost].capacity())};
  auto own = [&](Tier t, uint32_t slot, const char* who) -> Status {
    auto& v = owned[static_cast<int>(t)];
    if (slot >= v.size()) return fail(std::string(who) + " holds an out-of-range slot");
    if (v[slot]++) return fail(std::string(who) + " shares " + TierName(t) + " slot " + std::to_string(slot));
    if (!m.alloc[static_cast<int>(t)].in_use(slot)) return fail(std::string(who) + " holds a free slot");
    return Status::Ok();
  };
  std::vector<uint32_t> refs(m.records.size(), 0), readers(m.records.size(), 0);
  for (const auto& [id, s] : m.sessions) {
    std::unordered_set<uint32_t> seen;
    for (uint32_t r : s->chain) {
      if (m.records[r].state == BlockState::kFree || m.records[r].doomed) return fail("session '" + id + "' holds a dead block");
      if (!seen.insert(r).second) return fail("session '" + id + "' holds a block twice");
      ++refs[r];
    }
  }
  for (const auto& [id, lease] : m.leases) {
    for (uint32_t x : lease.items) {
      if (lease.write) {
        KVTIER_RETURN_IF_ERROR(own(Tier::kGpu, x, "a write lease"));
      } else {
        ++readers[x];
      }
    }
  }
  uint32_t live = 0, demoting = 0;
  for (uint32_t r = 0; r < m.records.size(); ++r) {
    const Record& rec = m.records[r];
    if (rec.state == BlockState::kFree) continue;
    KVTIER_RETURN_IF_ERROR(own(rec.tier, rec.slot, "a block"));
    if (rec.moving()) KVTIER_RETURN_IF_ERROR(own(Other(rec.tier), rec.dst_slot, "a moving block"));
    if (rec.state == BlockState::kDemoting) ++demoting;
    if (rec.refs != refs[r]) return fail("block " + rec.key.ToHex() + " counts " + std::to_string(rec.refs) + " refs, has " + std::to_string(refs[r]));
    if (rec.readers != readers[r]) return fail("block " + rec.key.ToHex() + " reader count is off");
    if (rec.doomed) {
      if (!rec.moving()) return fail("a doomed block is not moving");
      if (m.index.Find(rec.key) == r) return fail("a doomed block is still indexed");
      continue;
    }
    if (rec.refs == 0 && rec.readers == 0) return fail("block " + rec.key.ToHex() + " is held by no one");
    if (m.index.Find(rec.key) != r) return fail("block " + rec.key.ToHex() + " is not indexed under its key");
    ++live;
  }
  {
    std::unordered_map<uint32_t, Impl::Usage> usage;
    for (const Record& rec : m.records) {
      if (rec.state == BlockState::kFree || rec.doomed) continue;
      Impl::Usage& u = usage[rec.ns_tag];
      ++u.blocks[static_cast<int>(rec.tier)];
      if (rec.moving()) ++u.moving_to[static_cast<int>(Other(rec.tier))];
    }
    for (const auto& [tag, u] : m.usage) {
      const Impl::Usage& want = usage[tag];
      for (int t = 0; t < kTierCount; ++t) {
        if (u.blocks[t] != want.blocks[t] || u.moving_to[t] != want.moving_to[t]) {
          return fail("tenant usage of namespace " + std::to_string(tag) + " is off");
        }
      }
    }
  }
  {
    std::unordered_map<uint32_t, uint32_t> counts;
    for (const auto& [id, s] : m.sessions) ++counts[s->ns_tag];
    for (const auto& [tag, n] : m.tenant_sessions) {
      if (counts[tag] != n) return fail("session count of namespace " + std::to_string(tag) + " is off");
    }
  }
  if (live != m.index.size()) return fail("index holds " + std::to_string(m.index.size()) + " entries for " + std::to_string(live) + " blocks");
  if (demoting != m.demoting) return fail("demotion count is off");
  for (int t = 0; t < kTierCount; ++t) {
    uint32_t n = 0;
    for (uint8_t o : owned[t]) n += o;
    if (n != m.alloc[t].used()) return fail(std::string(TierName(static_cast<Tier>(t))) + " tier leaks " + std::to_string(m.alloc[t].used() - n) + " slots");
  }
  uint32_t doomed = 0;
  for (const Record& rec : m.records) doomed += (rec.state != BlockState::kFree && rec.doomed) ? 1 : 0;
  if (m.free_records.size() + live + doomed != m.records.size()) return fail("block records leak");
  return Status::Ok();
}

}  // namespace kvtier::tiering
