// Reclaimer: making room in a tier by demotion and drops (reclaim.h).
#include "reclaim.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "engine_impl.h"

namespace kvtier::tiering {

uint32_t Reclaimer::DropFromTier(Tier tier, uint32_t need, const TenantAccount* only, const Session* keep) {
  const SlotAllocator& slots = engine_.slots(tier);
  const uint32_t before = slots.free_count();
  auto freed = [&] { return slots.free_count() - before; };
  std::vector<Session*> emptied;
  std::vector<BlockKey> gone;  // Keys a session keeps (Session::below), last block first.
  engine_.sessions.VisitColdest([&](Session* s) {
    if ((only != nullptr && s->tenant != only) || s == keep) return true;
    gone.clear();
    while (!s->chain.empty() && freed() < need && engine_.blocks[s->chain.back()].IdleIn(tier)) {
      const uint32_t r = s->chain.back();
      const Record& rec = engine_.blocks[r];
      if (engine_.options.on_spill && (rec.ReadyIn(Tier::kHost) || rec.spilled || rec.refs > 1)) {
        // Offered to the stores (landed, or as it drops), or kept by another session.
        gone.push_back(rec.key);
        s->below_model = rec.model;
      } else {
        // Lost: the blocks after it can no longer be reached.
        gone.clear();
        s->below.clear();
      }
      s->chain.pop_back();
      engine_.Unref(r, FreeReason::kPressure);
    }
    s->below.insert(s->below.begin(), gone.rbegin(), gone.rend());
    if (s->chain.empty() && s->below.empty()) emptied.push_back(s);
    return freed() < need;
  });
  for (Session* s : emptied) engine_.RemoveSession(s, SessionEnd::kEmptied);
  return freed();
}

uint32_t Reclaimer::Droppable(Tier tier, uint32_t need, const TenantAccount* only, const Session* keep) const {
  // The same walk as DropFromTier, counting references instead of dropping them.
  std::unordered_map<uint32_t, uint32_t> refs_left;
  uint32_t freed = 0;
  engine_.sessions.VisitColdest([&](Session* s) {
    if ((only != nullptr && s->tenant != only) || s == keep) return true;
    for (auto it = s->chain.rbegin(); it != s->chain.rend() && freed < need; ++it) {
      const Record& rec = engine_.blocks[*it];
      if (!rec.IdleIn(tier)) break;
      auto [left, inserted] = refs_left.try_emplace(*it, rec.refs);
      if (--left->second == 0) ++freed;
    }
    return freed < need;
  });
  return freed;
}

uint32_t Reclaimer::DemoteColdest(uint32_t need, const TenantAccount* only) {
  if (only != nullptr) {
    const uint32_t room = only->Room(Tier::kHost);
    if (room < need) DropFromTier(Tier::kHost, need - room, only);
  }
  const SlotAllocator& host = engine_.slots(Tier::kHost);
  if (host.free_count() < need) DropFromTier(Tier::kHost, need - host.free_count(), only);
  uint32_t scheduled = 0;
  for (const bool defer_shared : {true, false}) {
    engine_.sessions.VisitColdest([&](Session* s) {
      if (only != nullptr && s->tenant != only) return true;
      for (uint32_t r : s->chain) {
        if (scheduled >= need || host.free_count() == 0) return false;
        const Record& rec = engine_.blocks[r];
        if (rec.IdleIn(Tier::kGpu) && (!defer_shared || rec.last_use <= s->last_use) &&
            rec.tenant->Room(Tier::kHost) > 0) {
          engine_.mover.Schedule(r, CopyDirection::kGpuToHost);
          ++scheduled;
        }
      }
      return scheduled < need && host.free_count() > 0;
    });
    if (scheduled >= need || host.free_count() == 0) break;
  }
  engine_.Flush(CopyDirection::kGpuToHost);
  return scheduled;
}

void Reclaimer::MakeGpuRoom(uint32_t count) {
  const uint32_t coming = engine_.slots(Tier::kGpu).free_count() + engine_.mover.demoting();
  if (coming < count) DemoteColdest(count - coming);
}

void Reclaimer::WaitForGpuRoom(uint32_t count, std::chrono::milliseconds timeout) {
  while (engine_.slots(Tier::kGpu).free_count() < count && engine_.mover.WaitOldestDemotion(timeout)) {
  }
}

void Reclaimer::EnforceWatermarks() {
  const SlotAllocator& gpu = engine_.slots(Tier::kGpu);
  const double gpu_cap = gpu.capacity();
  const uint32_t gpu_effective = gpu.used() - engine_.mover.demoting();
  if (gpu_effective > engine_.options.gpu_high_watermark * gpu_cap) {
    const auto target = static_cast<uint32_t>(std::floor(engine_.options.gpu_low_watermark * gpu_cap));
    if (gpu_effective > target) DemoteColdest(gpu_effective - target);
  }
  const SlotAllocator& host = engine_.slots(Tier::kHost);
  const double host_cap = host.capacity();
  const uint32_t host_used = host.used();
  if (host_used > engine_.options.host_high_watermark * host_cap) {
    const auto target = static_cast<uint32_t>(std::floor(engine_.options.host_low_watermark * host_cap));
    if (host_used > target) DropFromTier(Tier::kHost, host_used - target);
  }
}

Status Reclaimer::MakeQuotaRoom(TenantAccount& tenant, uint32_t n, const Session* keep, const std::string& what,
                                uint32_t credit) {
  if (!tenant.has_quota(Tier::kGpu)) return Status::Ok();
  const uint32_t limit = tenant.quota[Tier::kGpu];
  return MakeRoomUnder(tenant, limit, n, keep, what, credit,
                       "its quota is " + std::to_string(limit) + " (tenants: gpu_blocks)");
}

Status Reclaimer::MakeShareRoom(TenantAccount& tenant, uint32_t n, const std::string& what) {
  const GpuShare& share = engine_.gpu_share;
  if (!share.Applies(tenant, GpuShare::Clock::now())) return Status::Ok();
  const Status room =
      MakeRoomUnder(tenant, share.share(), n, nullptr, what, 0,
                    "its fair share is " + std::to_string(share.share()) + " of the gpu tier's " +
                        std::to_string(engine_.slots(Tier::kGpu).capacity()) + " slots while " +
                        std::to_string(share.active()) +
                        " tenants use it and one waits for room (tenants: gpu_blocks sets a fixed quota instead)");
  if (!room.ok()) ++engine_.stats.share_limited;
  return room;
}

Status Reclaimer::MakeRoomUnder(TenantAccount& tenant, uint32_t limit, uint32_t n, const Session* keep,
                                const std::string& what, uint32_t credit, const std::string& limit_text) {
  // What the tenant holds besides the request's own slots, and the room beside it.
  auto held = [&] { return tenant.Held(Tier::kGpu) - std::min(credit, tenant.Held(Tier::kGpu)); };
  auto room = [&] { return held() >= limit ? 0u : limit - held(); };
  if (room() >= n) return Status::Ok();
  auto describe = [&] {
    std::string out = "tenant '" + tenant.tenant.name + "' holds " + std::to_string(held()) + " gpu blocks";
    if (tenant.leased > credit) {
      out += " (" + std::to_string(tenant.leased - credit) + " of them slots of uncommitted write leases)";
    }
    return out + ", " + limit_text;
  };
  if (n > limit) return ResourceExhausted(what + ": " + describe());
  DemoteColdest(n - room(), &tenant);
  if (room() < n) {
    // Drop only when dropping makes enough room: a refused request loses nothing.
    const uint32_t short_by = n - room();
    if (Droppable(Tier::kGpu, short_by, &tenant, keep) >= short_by) DropFromTier(Tier::kGpu, short_by, &tenant, keep);
  }
  if (room() < n) {
    return ResourceExhausted(what + ": " + describe() + ", and its other blocks are leased, moving" +
                             (keep != nullptr ? " or in use by this session" : ""));
  }
  return Status::Ok();
}

void Reclaimer::ReclaimShares() {
  const GpuShare& share = engine_.gpu_share;
  const auto now = GpuShare::Clock::now();
  std::vector<TenantAccount*> over;
  engine_.tenants.ForEach([&](TenantAccount& a) {
    if (share.Over(a, now)) over.push_back(&a);
  });
  for (TenantAccount* a : over) ReclaimShare(*a, a->Held(Tier::kGpu) - share.share());
}

void Reclaimer::ReclaimShare(TenantAccount& tenant, uint32_t excess) {
  // Idle blocks can go at once: count them (a walk as DemoteColdest's), and
  // demote no more than that, so that no host block of the tenant is dropped
  // for room that no demotion would use.
  uint32_t idle = 0;
  engine_.sessions.VisitColdest([&](Session* s) {
    if (s->tenant != &tenant) return true;
    for (uint32_t r : s->chain) idle += engine_.blocks[r].IdleIn(Tier::kGpu) ? 1 : 0;
    return idle < excess;
  });
  if (idle > 0) DemoteColdest(std::min(idle, excess), &tenant);
  // What it still holds past its share is pinned (or moving, or write-lease
  // slots): mark pinned blocks, the tails of its coldest sessions first, so
  // that its renewed leases keep the prefixes its sessions need most. Marks
  // stay for the whole wait (one epoch): re-marking by coldness would move
  // them as the reader's own acquires warm its sessions, and it would lose
  // more than its excess. So the blocks marked already and still in the GPU
  // tier count first (GpuShare::marked: at most one entry per GPU slot once
  // pruned, whoever holds them).
  const uint32_t held = tenant.Held(Tier::kGpu);
  const uint32_t share = engine_.gpu_share.share();
  if (held <= share) return;
  const uint32_t epoch = engine_.gpu_share.epoch();
  std::vector<uint32_t>& marked = engine_.gpu_share.marked();
  std::sort(marked.begin(), marked.end());
  marked.erase(std::unique(marked.begin(), marked.end()), marked.end());
  std::erase_if(marked, [&](uint32_t r) { return !Marked(engine_.blocks[r], epoch); });
  const auto already = static_cast<uint32_t>(
      std::count_if(marked.begin(), marked.end(), [&](uint32_t r) { return engine_.blocks[r].tenant == &tenant; }));
  if (held - share <= already) return;
  const uint32_t to_mark = held - share - already;
  uint32_t added = 0;
  engine_.sessions.VisitColdest([&](Session* s) {
    if (s->tenant != &tenant) return true;
    for (auto it = s->chain.rbegin(); it != s->chain.rend() && added < to_mark; ++it) {
      Record& rec = engine_.blocks[*it];
      if (rec.ReadyIn(Tier::kGpu) && rec.readers > 0 && rec.share_epoch != epoch) {
        rec.share_epoch = epoch;
        marked.push_back(*it);
        ++added;
      }
    }
    return added < to_mark;
  });
  if (added < to_mark) MarkLeased(tenant, to_mark - added);
}

bool Reclaimer::Marked(const Record& rec, uint32_t epoch) {
  // Demoting (leaving: no longer counted where it is) or freed, it holds no
  // GPU slot of its tenant's to give way.
  return rec.share_epoch == epoch && rec.ReadyIn(Tier::kGpu) && !rec.doomed;
}

void Reclaimer::MarkLeased(TenantAccount& tenant, uint32_t want) {
  // Pinned by read leases alone: blocks of sessions that are gone (evicted,
  // or a reader that never named one), which no chain reaches. Before, such
  // a reader renewing its leases kept them pinned for as long as it lived.
  // Every lease is a prefix from block 0 (MatchRecords), so a block's place
  // in a lease is its depth in its prefix: the deepest blocks of every prefix
  // are marked first, and a renewed lease (which stops at its first marked
  // block) keeps the beginnings of all of them. The walk passes every live
  // lease once and reads the tenant's own (bounded by max_leases_per_client
  // and max_blocks_per_request per client); it runs only while a tenant waits
  // and this one is over its share with too few pinned blocks in its chains.
  const uint32_t epoch = engine_.gpu_share.epoch();
  std::vector<std::pair<uint32_t, uint32_t>> found;  // (depth, record)
  engine_.leases.ForEach([&](LeaseId, const Lease& lease) {
    const auto* read = std::get_if<ReadRecords>(&lease.held);
    // A read lease holds its reader's tenant's blocks only (MatchRecords).
    if (read == nullptr || read->records.empty() || engine_.blocks[read->records[0]].tenant != &tenant) return;
    for (size_t i = 0; i < read->records.size(); ++i) {
      const uint32_t r = read->records[i];
      const Record& rec = engine_.blocks[r];
      if (rec.ReadyIn(Tier::kGpu) && !rec.doomed && rec.share_epoch != epoch) {
        found.emplace_back(static_cast<uint32_t>(i), r);
      }
    }
  });
  // Deepest first; among equals, the oldest lease's first (grant order).
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<uint32_t>& marked = engine_.gpu_share.marked();
  uint32_t added = 0;
  for (const auto& [depth, r] : found) {
    if (added >= want) break;
    Record& rec = engine_.blocks[r];
    if (rec.share_epoch == epoch) continue;  // In two leases (an old one and its renewal).
    rec.share_epoch = epoch;
    marked.push_back(r);
    ++added;
  }
}

void Reclaimer::MakeHostRoomFor(const Session* s, uint32_t want) {
  if (const uint32_t room = s->tenant->Room(Tier::kHost); want > room) {
    DropFromTier(Tier::kHost, want - room, s->tenant, s);  // Under its host quota: its own blocks go.
  }
  const uint32_t host_free = engine_.slots(Tier::kHost).free_count();
  if (want > host_free) DropFromTier(Tier::kHost, want - host_free);
}

}  // namespace kvtier::tiering
