// Engine: leases. Granting and ending them, releases after a client's GPU
// work, promotions asked for at release, and the lease timeout's revocations
// (engine_impl.h has the lease table; engine.cc the calls that grant them).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>

#include "engine_impl.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::tiering {

LeaseId Engine::Impl::NewLease(std::variant<WriteSlots, ReadRecords> held) {
  const LeaseId id = next_lease++;
  Lease lease{std::move(held), std::chrono::steady_clock::now()};
  if (lease.write())
    ++stats.write_leases;
  else
    ++stats.read_leases;
  leases.emplace_hint(leases.end(), id, std::move(lease));  // Ids only grow: the newest goes last.
  return id;
}

void Engine::Impl::CountEnded(const Lease& lease) {
  if (lease.write()) {
    --stats.write_leases;
  } else {
    --stats.read_leases;
  }
}

void Engine::Impl::EndLease(Lease& lease) {
  CountEnded(lease);
  if (auto* write = std::get_if<WriteSlots>(&lease.held)) {
    write->tenant->Unleased(static_cast<uint32_t>(write->slots.size()));
    for (uint32_t slot : write->slots) slots(Tier::kGpu).Free(slot);
  } else {
    for (uint32_t r : std::get<ReadRecords>(lease.held).records) {
      --blocks[r].readers;
      MaybeFree(r, FreeReason::kReleased);
    }
  }
}

Status Engine::Release(LeaseId lease_id, GpuWork after) {
  Impl& impl = *impl_;
  auto it = impl.leases.find(lease_id);
  if (it == impl.leases.end()) {
    impl.EndWatch(after);
    auto r = impl.revoked.find(lease_id);
    if (r == impl.revoked.end()) return NotFound("lease " + std::to_string(lease_id) + " does not exist");
    const RevokedLease gone = r->second;
    impl.revoked.erase(r);
    return NotFound(DescribeExpired(lease_id, gone) + (gone.write ? ": its slots had gone back to the pool"
                                                          : ": its blocks were unpinned then, so what was read "
                                                            "through it after that may be another block's"));
  }
  Lease lease = std::move(it->second);
  impl.leases.erase(it);
  std::vector<uint32_t> promote;  // Still pinned by a GPU reader: PromoteWanted waits for it.
  if (const auto* read = std::get_if<ReadRecords>(&lease.held); read != nullptr && read->promote_after) {
    promote = read->records;
  }
  if (after.none()) {
    impl.EndLease(lease);
  } else {
    // Held until the client's GPU work on them is done.
    impl.CountEnded(lease);
    if (auto* write = std::get_if<WriteSlots>(&lease.held)) {
      impl.GiveBackAfter(after, std::move(write->slots), write->tenant, {}, /*writes=*/false);
    } else {
      impl.GiveBackAfter(after, {}, nullptr, std::move(std::get<ReadRecords>(lease.held).records), /*writes=*/false);
    }
  }
  if (!promote.empty()) impl.WantPromotion(promote);
  return Status::Ok();
}

Status Engine::PromoteOnRelease(LeaseId lease_id) {
  auto it = impl_->leases.find(lease_id);
  auto* read = it == impl_->leases.end() ? nullptr : std::get_if<ReadRecords>(&it->second.held);
  if (read == nullptr) return NotFound("read lease " + std::to_string(lease_id) + " does not exist");
  read->promote_after = true;
  return Status::Ok();
}

void Engine::Impl::WantPromotion(std::span<const uint32_t> recs) {
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t r : recs) {
    // Freed with the lease (no session held it), or promoted already by another reader: not wanted.
    if (WantsPromotion(blocks[r])) wanted_promotions.push_back(WantedPromotion{r, blocks[r].key, now});
  }
  while (wanted_promotions.size() > slots(Tier::kGpu).capacity()) {
    wanted_promotions.pop_front();
    ++stats.after_read_given_up;
  }
  PromoteWanted();
}

uint32_t Engine::Impl::PromoteWanted() {
  if (wanted_promotions.empty()) return 0;
  const auto now = std::chrono::steady_clock::now();
  uint32_t scheduled = 0;
  std::deque<WantedPromotion> left;
  for (const WantedPromotion& w : wanted_promotions) {
    const Record& rec = blocks[w.record];
    // Gone (freed, perhaps reused by another block), or moved by another reader meanwhile.
    if (rec.key != w.key || !WantsPromotion(rec)) continue;
    if (rec.tenant->Room(Tier::kGpu) == 0 || now - w.since > kWantedPromotionFor) {
      ++stats.after_read_given_up;
      continue;
    }
    if (rec.readers == 0 && slots(Tier::kGpu).free_count() > 0) {
      mover.Schedule(w.record, CopyDirection::kHostToGpu);
      ++scheduled;
      continue;
    }
    left.push_back(w);
  }
  if (!left.empty()) {
    reclaim.MakeGpuRoom(static_cast<uint32_t>(left.size()));
    // No free slot and none coming: nothing to wait for.
    if (slots(Tier::kGpu).free_count() == 0 && mover.demoting() == 0) {
      stats.after_read_given_up += left.size();
      left.clear();
    }
  }
  stats.after_read_promotions += scheduled;
  wanted_promotions = std::move(left);
  if (scheduled > 0) Flush(CopyDirection::kHostToGpu);
  return scheduled;
}

bool Engine::LeaseExpired(LeaseId lease) const { return impl_->revoked.count(lease) != 0; }

LeaseExpiry Engine::ExpireLeases(std::chrono::steady_clock::time_point now) {
  Impl& impl = *impl_;
  LeaseExpiry out;
  const std::chrono::milliseconds timeout = impl.options.lease_timeout;
  if (timeout.count() <= 0) return out;
  size_t work = 0;
  // Leases are ordered by grant, so the expired ones are a prefix of the map.
  while (!impl.leases.empty() && now - impl.leases.begin()->second.granted >= timeout) {
    if (work >= kLeaseExpiryWork) {
      out.more = true;
      break;
    }
    auto it = impl.leases.begin();
    const LeaseId id = it->first;
    Lease lease = std::move(it->second);
    impl.leases.erase(it);
    const auto n = static_cast<uint32_t>(lease.size());
    work += n + 1;  // An empty write lease (all of it committed) still costs a step.
    if (lease.write()) {
      ++out.write;
      out.slots += n;
      ++impl.stats.expired_write_leases;
    } else {
      ++out.read;
      out.records += n;
      ++impl.stats.expired_read_leases;
    }
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - lease.granted);
    impl.revoked.emplace(id, RevokedLease{lease.write(), age, timeout});
    impl.EndLease(lease);
  }
  return out;
}

}  // namespace kvtier::tiering
