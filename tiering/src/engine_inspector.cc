// EngineInspector: the engine's full invariant recount, for tests (engine_inspector.h).
#include "engine_inspector.h"

#include <chrono>
#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine_impl.h"

namespace kvtier::tiering {
namespace {

Status Fail(const std::string& what) { return Internal("invariant: " + what); }

struct Counts {
  PerTier<uint32_t> blocks;
  PerTier<uint32_t> moving_to;
  uint32_t leased = 0;
  uint32_t sessions = 0;
};

// Ids in grant order (the timeout revokes the oldest first), none both live
// and revoked, the table's counts; each lease's slots and pins are tallied.
template <typename Own>
Status CheckLeases(const LeaseTable& leases, std::unordered_map<const TenantAccount*, Counts>& counts,
                   std::vector<uint32_t>& readers, Own& own) {
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
      if (write->tenant == nullptr) {
        status = Fail("a write lease has no tenant");
        return;
      }
      counts[write->tenant].leased += static_cast<uint32_t>(write->slots.size());
      for (uint32_t slot : write->slots) {
        if (status.ok()) status = own(Tier::kGpu, slot, "a write lease");
      }
    } else {
      for (uint32_t r : std::get<ReadRecords>(lease.held).records) ++readers[r];
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

// Each entry waits for work and its slots have a tenant; a commit's blocks are
// marked writing; the slots (leased) and pins are tallied.
template <typename Own>
Status CheckSettling(const SettlingQueue& settling, const BlockTable& blocks,
                     std::unordered_map<const TenantAccount*, Counts>& counts, std::vector<uint32_t>& readers,
                     Own& own) {
  Status status;
  settling.ForEach([&](const Settling& s) {
    if (!status.ok()) return;
    if (s.work.none()) {
      status = Fail("a settling entry waits for no work");
      return;
    }
    if (!s.slots.empty()) {
      if (s.tenant == nullptr) {
        status = Fail("settling slots have no tenant");
        return;
      }
      counts[s.tenant].leased += static_cast<uint32_t>(s.slots.size());
    }
    for (uint32_t slot : s.slots) {
      if (status.ok()) status = own(Tier::kGpu, slot, "a settling entry");
    }
    for (uint32_t r : s.records) {
      ++readers[r];
      if (status.ok() && s.writes && !blocks[r].writing) status = Fail("a block being written is not marked writing");
    }
  });
  return status;
}

// The policy visits every session once, each by its own handle.
Status CheckEvictionOrder(const SessionTable& sessions) {
  std::unordered_set<const Session*> visited;
  bool known = true;
  sessions.VisitColdest([&](const Session* s) {
    known = sessions.ByHandle(s->handle) == s && visited.insert(s).second;
    return known;
  });
  if (!known || visited.size() != sessions.size()) return Fail("the eviction order does not hold each session once");
  return Status::Ok();
}

}  // namespace

size_t EngineInspector::PendingDeadlines(const Engine& engine) { return engine.impl_->sessions.pending_deadlines(); }

void EngineInspector::SkewLeasedSlots(Engine& engine, const Namespace& ns, int delta) {
  TenantAccount& a = engine.impl_->tenants.Get(ns);
  a.leased = static_cast<uint32_t>(static_cast<int64_t>(a.leased) + delta);
}

Status EngineInspector::CheckInvariants(const Engine& engine) {
  const Engine::Impl& impl = *engine.impl_;
  const BlockTable& blocks = impl.blocks;
  PerTier<std::vector<uint8_t>> owned;
  for (Tier t : kTiers) owned[t].resize(impl.slots(t).capacity());
  auto own = [&](Tier t, uint32_t slot, const char* who) -> Status {
    auto& v = owned[t];
    if (slot >= v.size()) return Fail(std::string(who) + " holds an out-of-range slot");
    if (v[slot]++) return Fail(std::string(who) + " shares " + TierName(t) + " slot " + std::to_string(slot));
    if (!impl.slots(t).in_use(slot)) return Fail(std::string(who) + " holds a free slot");
    return Status::Ok();
  };
  std::vector<uint32_t> refs(blocks.capacity(), 0), readers(blocks.capacity(), 0);
  std::unordered_map<const TenantAccount*, Counts> counts;
  Status status;
  impl.sessions.ForEach([&](const Session& s) {
    if (!status.ok()) return;
    ++counts[s.tenant].sessions;
    std::unordered_set<uint32_t> seen;
    for (uint32_t r : s.chain) {
      if (blocks[r].state == BlockState::kFree || blocks[r].doomed) {
        status = Fail("session '" + s.id + "' holds a dead block");
        return;
      }
      if (!seen.insert(r).second) {
        status = Fail("session '" + s.id + "' holds a block twice");
        return;
      }
      ++refs[r];
    }
  });
  KVTIER_RETURN_IF_ERROR(status);
  KVTIER_RETURN_IF_ERROR(CheckLeases(impl.leases, counts, readers, own));
  KVTIER_RETURN_IF_ERROR(CheckSettling(impl.settling, blocks, counts, readers, own));
  impl.mirrors.ForEachCopy([&](const MirrorQueue::Copy& c) {
    ++readers[c.record];
    if (status.ok()) status = own(Tier::kHost, c.host_slot, "a copy for the stores");
  });
  KVTIER_RETURN_IF_ERROR(status);
  uint32_t live = 0, demoting = 0, doomed = 0;
  for (uint32_t r = 0; r < blocks.capacity(); ++r) {
    const Record& rec = blocks[r];
    if (rec.state == BlockState::kFree) continue;
    KVTIER_RETURN_IF_ERROR(own(rec.tier, rec.slot, "a block"));
    if (rec.moving()) KVTIER_RETURN_IF_ERROR(own(OtherTier(rec.tier), rec.dst_slot, "a moving block"));
    if (rec.state == BlockState::kDemoting) ++demoting;
    const std::string name = "block " + rec.key.ToHex();
    if (rec.refs != refs[r]) {
      return Fail(name + " counts " + std::to_string(rec.refs) + " refs, has " + std::to_string(refs[r]));
    }
    if (rec.readers != readers[r]) return Fail(name + " reader count is off");
    if (rec.doomed) {
      if (!rec.moving() && rec.readers == 0) return Fail("a doomed block is neither moving nor read");
      if (blocks.index().Find(rec.key) == r) return Fail("a doomed block is still indexed");
      ++doomed;
      continue;
    }
    if (!rec.held()) return Fail(name + " is held by no one");
    if (blocks.index().Find(rec.key) != r) return Fail(name + " is not indexed under its key");
    if (const uint32_t p = blocks.index().Find(blocks.index().parent(r)); p != kNoRecord && blocks[p].tenant != rec.tenant) {
      return Fail(name + "'s parent is another tenant's block");
    }
    Counts& c = counts[rec.tenant];
    ++c.blocks[rec.tier];
    if (rec.moving()) ++c.moving_to[OtherTier(rec.tier)];
    ++live;
  }
  size_t holding = 0;
  impl.tenants.ForEach([&](const TenantAccount& a) {
    if (!status.ok()) return;
    holding += a.sessions > 0 ? 1 : 0;
    const Counts& want = counts[&a];
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
  if (holding != impl.sessions.tenants_holding()) return Fail("the count of tenants holding sessions is off");
  if (const TenantAccount* top = impl.sessions.LargestHolder()) {
    uint32_t most = 0;
    impl.tenants.ForEach([&](const TenantAccount& a) { most = std::max(most, a.sessions); });
    if (top->sessions != most) return Fail("the tenant holding the most sessions is off");
  }
  KVTIER_RETURN_IF_ERROR(CheckEvictionOrder(impl.sessions));
  if (live != blocks.index().size()) {
    return Fail("index holds " + std::to_string(blocks.index().size()) + " entries for " + std::to_string(live) +
                " blocks");
  }
  if (demoting != impl.mover.demoting()) return Fail("demotion count is off");
  for (Tier t : kTiers) {
    uint32_t n = 0;
    for (uint8_t o : owned[t]) n += o;
    if (n != impl.slots(t).used()) {
      return Fail(std::string(TierName(t)) + " tier leaks " + std::to_string(impl.slots(t).used() - n) + " slots");
    }
  }
  if (blocks.free_records() + live + doomed != blocks.capacity()) return Fail("block records leak");
  return Status::Ok();
}

}  // namespace kvtier::tiering
