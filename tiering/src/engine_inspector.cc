// EngineInspector: the engine's full invariant recount, for tests (engine_inspector.h).
#include "engine_inspector.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine_impl.h"

namespace kvtier::tiering {
namespace {

Status Fail(const std::string& what) { return Internal("invariant: " + what); }

// What one tenant's account should say.
struct Counts {
  PerTier<uint32_t> blocks;
  PerTier<uint32_t> moving_to;
  uint32_t leased = 0;
  uint32_t sessions = 0;
};

// One recount: every holder of a slot, a reference or a pin is counted from
// the engine's parts, then compared with what the blocks, tenants and slot
// allocators say. Each step returns the first invariant it finds broken.
class Recount {
 public:
  explicit Recount(const Engine::Impl& impl)
      : impl_(impl), blocks_(impl.blocks), refs_(blocks_.capacity(), 0), readers_(blocks_.capacity(), 0) {
    for (Tier t : kTiers) owned_[t].resize(impl.slots(t).capacity());
  }

  Status Run() {
    KVTIER_RETURN_IF_ERROR(Sessions());
    KVTIER_RETURN_IF_ERROR(Leases());
    KVTIER_RETURN_IF_ERROR(SettlingWork());
    KVTIER_RETURN_IF_ERROR(Mirrors());
    KVTIER_RETURN_IF_ERROR(Blocks());
    KVTIER_RETURN_IF_ERROR(Tenants());
    KVTIER_RETURN_IF_ERROR(EvictionOrder());
    return Totals();
  }

 private:
  // `who` holds `slot` of tier `t`: in range, in use, and no one else's.
  Status Own(Tier t, uint32_t slot, const char* who) {
    auto& v = owned_[t];
    if (slot >= v.size()) return Fail(std::string(who) + " holds an out-of-range slot");
    if (v[slot]++) return Fail(std::string(who) + " shares " + TierName(t) + " slot " + std::to_string(slot));
    if (!impl_.slots(t).in_use(slot)) return Fail(std::string(who) + " holds a free slot");
    return Status::Ok();
  }

  // Each session holds live blocks, each once; their references are counted.
  Status Sessions() {
    Status status;
    impl_.sessions.ForEach([&](const Session& s) {
      if (!status.ok()) return;
      ++counts_[s.tenant].sessions;
      std::unordered_set<uint32_t> seen;
      for (uint32_t r : s.chain) {
        if (blocks_[r].state == BlockState::kFree || blocks_[r].doomed) {
          status = Fail("session '" + s.id + "' holds a dead block");
          return;
        }
        if (!seen.insert(r).second) {
          status = Fail("session '" + s.id + "' holds a block twice");
          return;
        }
        ++refs_[r];
      }
    });
    return status;
  }

  // Ids in grant order (the timeout revokes the oldest first), none both live
  // and revoked, the table's counts; each lease's slots and pins are counted.
  Status Leases() {
    const LeaseTable& leases = impl_.leases;
    LeaseId previous = 0;
    std::chrono::steady_clock::time_point previous_grant{};
    uint32_t writes = 0;
    Status status;
    leases.ForEach([&](LeaseId id, const Lease& lease) {
      if (!status.ok()) return;
      if (id <= previous || id >= leases.next_id()) {
        status = Fail("lease ids are out of order");
      } else if (lease.granted < previous_grant) {
        status = Fail("leases are not in grant order");
      } else if (leases.IsRevoked(id)) {
        status = Fail("lease " + std::to_string(id) + " is live and revoked");
      } else if (const auto* write = std::get_if<WriteSlots>(&lease.held)) {
        ++writes;
        status = write->tenant == nullptr ? Fail("a write lease has no tenant")
                                          : LeasedSlots(write->slots, write->tenant, "a write lease");
      } else {
        for (uint32_t r : std::get<ReadRecords>(lease.held).records) ++readers_[r];
      }
      previous = id;
      previous_grant = lease.granted;
    });
    KVTIER_RETURN_IF_ERROR(status);
    if (writes != leases.write_count() || leases.size() - writes != leases.read_count()) {
      return Fail("lease counts are off");
    }
    return Status::Ok();
  }

  // GPU slots `who` holds, counted in `tenant`'s leased slots.
  Status LeasedSlots(const std::vector<uint32_t>& slots, const TenantAccount* tenant, const char* who) {
    if (slots.empty()) return Status::Ok();
    if (tenant == nullptr) return Fail(std::string(who) + "'s slots have no tenant");
    counts_[tenant].leased += static_cast<uint32_t>(slots.size());
    for (uint32_t slot : slots) KVTIER_RETURN_IF_ERROR(Own(Tier::kGpu, slot, who));
    return Status::Ok();
  }

  // Each entry waits for work; a commit's blocks are marked writing; the
  // slots and pins are counted.
  Status SettlingWork() {
    Status status;
    impl_.settling.ForEach([&](const Settling& s) {
      if (!status.ok()) return;
      if (s.work.none()) {
        status = Fail("a settling entry waits for no work");
        return;
      }
      status = LeasedSlots(s.slots, s.tenant, "a settling entry");
      for (uint32_t r : s.records) {
        ++readers_[r];
        if (status.ok() && s.writes && !blocks_[r].writing) {
          status = Fail("a block being written is not marked writing");
        }
      }
    });
    return status;
  }

  // Each copy for the stores pins its block and owns its host slot.
  Status Mirrors() {
    Status status;
    impl_.mirrors.ForEachCopy([&](const MirrorQueue::Copy& c) {
      ++readers_[c.record];
      if (status.ok()) status = Own(Tier::kHost, c.host_slot, "a copy for the stores");
    });
    return status;
  }

  // Every live record: its slots, its counts against the recount, its index
  // entry; a doomed one is out of the index and still moving or read.
  Status Blocks() {
    for (uint32_t r = 0; r < blocks_.capacity(); ++r) {
      const Record& rec = blocks_[r];
      if (rec.state == BlockState::kFree) continue;
      KVTIER_RETURN_IF_ERROR(Own(rec.tier, rec.slot, "a block"));
      if (rec.moving()) KVTIER_RETURN_IF_ERROR(Own(OtherTier(rec.tier), rec.dst_slot, "a moving block"));
      if (rec.state == BlockState::kDemoting) ++demoting_;
      const std::string name = "block " + rec.key.ToHex();
      if (rec.refs != refs_[r]) {
        return Fail(name + " counts " + std::to_string(rec.refs) + " refs, has " + std::to_string(refs_[r]));
      }
      if (rec.readers != readers_[r]) return Fail(name + " reader count is off");
      if (rec.doomed) {
        if (!rec.moving() && rec.readers == 0) return Fail("a doomed block is neither moving nor read");
        if (blocks_.index().Find(rec.key) == r) return Fail("a doomed block is still indexed");
        ++doomed_;
        continue;
      }
      if (!rec.held()) return Fail(name + " is held by no one");
      if (blocks_.index().Find(rec.key) != r) return Fail(name + " is not indexed under its key");
      const uint32_t p = blocks_.index().Find(blocks_.index().parent(r));
      if (p != kNoRecord && blocks_[p].tenant != rec.tenant) return Fail(name + "'s parent is another tenant's block");
      Counts& c = counts_[rec.tenant];
      ++c.blocks[rec.tier];
      if (rec.moving()) ++c.moving_to[OtherTier(rec.tier)];
      ++live_;
    }
    return Status::Ok();
  }

  // Each account against the recount, and the session table's view of them.
  Status Tenants() {
    Status status;
    size_t holding = 0;
    impl_.tenants.ForEach([&](const TenantAccount& a) {
      if (!status.ok()) return;
      holding += a.sessions > 0 ? 1 : 0;
      const Counts& want = counts_[&a];
      if (a.blocks != want.blocks || a.moving_to != want.moving_to) {
        status = Fail("tenant usage of '" + a.tenant.name + "' is off");
      } else if (a.leased != want.leased) {
        status = Fail("tenant '" + a.tenant.name + "' counts " + std::to_string(a.leased) +
                      " leased slots, its write leases hold " + std::to_string(want.leased));
      } else if (a.sessions != want.sessions) {
        status = Fail("session count of tenant '" + a.tenant.name + "' is off");
      }
    });
    KVTIER_RETURN_IF_ERROR(status);
    if (holding != impl_.sessions.tenants_holding()) return Fail("the count of tenants holding sessions is off");
    if (const TenantAccount* top = impl_.sessions.LargestHolder()) {
      uint32_t most = 0;
      impl_.tenants.ForEach([&](const TenantAccount& a) { most = std::max(most, a.sessions); });
      if (top->sessions != most) return Fail("the tenant holding the most sessions is off");
    }
    return Status::Ok();
  }

  // The policy visits every session once, each by its own handle.
  Status EvictionOrder() const {
    const SessionTable& sessions = impl_.sessions;
    std::unordered_set<const Session*> visited;
    bool known = true;
    sessions.VisitColdest([&](const Session* s) {
      known = sessions.ByHandle(s->handle) == s && visited.insert(s).second;
      return known;
    });
    if (!known || visited.size() != sessions.size()) return Fail("the eviction order does not hold each session once");
    return Status::Ok();
  }

  // The index, the mover, the slot allocators and the record table against the recount.
  Status Totals() const {
    if (live_ != blocks_.index().size()) {
      return Fail("index holds " + std::to_string(blocks_.index().size()) + " entries for " + std::to_string(live_) +
                  " blocks");
    }
    if (demoting_ != impl_.mover.demoting()) return Fail("demotion count is off");
    for (Tier t : kTiers) {
      uint32_t n = 0;
      for (uint8_t o : owned_[t]) n += o;
      if (n != impl_.slots(t).used()) {
        return Fail(std::string(TierName(t)) + " tier leaks " + std::to_string(impl_.slots(t).used() - n) + " slots");
      }
    }
    if (blocks_.free_records() + live_ + doomed_ != blocks_.capacity()) return Fail("block records leak");
    return Status::Ok();
  }

  const Engine::Impl& impl_;
  const BlockTable& blocks_;
  PerTier<std::vector<uint8_t>> owned_;  // Holders of each slot.
  std::vector<uint32_t> refs_;           // Per record: sessions holding it.
  std::vector<uint32_t> readers_;        // Per record: leases, settling entries and copies pinning it.
  std::unordered_map<const TenantAccount*, Counts> counts_;
  uint32_t live_ = 0;
  uint32_t demoting_ = 0;
  uint32_t doomed_ = 0;
};

}  // namespace

size_t EngineInspector::PendingDeadlines(const Engine& engine) { return engine.impl_->sessions.pending_deadlines(); }

void EngineInspector::SkewLeasedSlots(Engine& engine, const Namespace& ns, int delta) {
  TenantAccount& a = engine.impl_->tenants.Get(ns);
  a.leased = static_cast<uint32_t>(static_cast<int64_t>(a.leased) + delta);
}

Status EngineInspector::CheckInvariants(const Engine& engine) { return Recount(*engine.impl_).Run(); }

}  // namespace kvtier::tiering
