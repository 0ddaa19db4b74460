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
  if (lease.write()) ++st.write_leases; else ++st.read_leases;
  leases.emplace_hint(leases.end(), id, std::move(lease));  // Ids only grow: the newest goes last.
  return id;
}

void Engine::Impl::CountEnded(const Lease& lease) {
  if (lease.write()) {
    --st.write_leases;
  } else {
    --st.read_leases;
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
  Impl& m = *impl_;
  auto it = m.leases.find(lease_id);
  if (it == m.leases.end()) {
    m.EndWatch(after);
    auto r = m.revoked.find(lease_id);
    if (r == m.revoked.end()) return NotFound("lease " + std::to_string(lease_id) + " does not exist");
    const RevokedLease gone = r->second;
    m.revoked.erase(r);
    return NotFound(DescribeExpired(lease_id, gone) + (gone.write ? ": its slots had gone back to the pool"
                                                          : ": its blocks were unpinned then, so what was read "
                                                            "through it after that may be another block's"));
  }
  Lease lease = std::move(it->second);
  m.leases.erase(it);
  std::vector<uint32_t> promote;  // Still pinned by a GPU reader: PromoteWanted waits for it.
  if (const auto* read = std::get_if<ReadRecords>(&lease.held); read != nullptr && read->promote_after) {
    promote = read->records;
  }
  if (after.none()) {
    m.EndLease(lease);
  } else {
    // Held until the client's GPU work on them is done.
    m.CountEnded(lease);
    if (auto* write = std::get_if<WriteSlots>(&lease.held)) {
      m.GiveBackAfter(after, std::move(write->slots), write->tenant, {}, /*writes=*/false);
    } else {
      m.GiveBackAfter(after, {}, nullptr, std::move(std::get<ReadRecords>(lease.held).records), /*writes=*/false);
    }
  }
  if (!promote.empty()) m.WantPromotion(promote);
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
    ++st.after_read_given_up;
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
      ++st.after_read_given_up;
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
      st.after_read_given_up += left.size();
      left.clear();
    }
  }
  st.after_read_promotions += scheduled;
  wanted_promotions = std::move(left);
  if (scheduled > 0) Flush(CopyDirection::kHostToGpu);
  return scheduled;
}

bool Engine::LeaseExpired(LeaseId lease) const { return impl_->revoked.count(lease) != 0; }

LeaseExpiry Engine::ExpireLeases(std::chrono::steady_clock::time_point now) {
  Impl& m = *impl_;
  LeaseExpiry out;
  const std::chrono::milliseconds timeout = m.opt.lease_timeout;
  if (timeout.count() <= 0) return out;
  size_t work = 0;
  // Leases are ordered by grant, so the expired ones are a prefix of the map.
  while (!m.leases.empty() && now - m.leases.begin()->second.granted >= timeout) {
    if (work >= kLeaseExpiryWork) {
      out.more = true;
      break;
    }
    auto it = m.leases.begin();
    const LeaseId id = it->first;
    Lease lease = std::move(it->second);
    m.leases.erase(it);
    const auto n = static_cast<uint32_t>(lease.size());
    work += n + 1;  // An empty write lease (all of it committed) still costs a step.
    if (lease.write()) {
      ++out.write;
      out.slots += n;
      ++m.st.expired_write_leases;
    } else {
      ++out.read;
      out.records += n;
      ++m.st.expired_read_leases;
    }
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - lease.granted);
    m.revoked.emplace(id, RevokedLease{lease.write(), age, timeout});
    m.EndLease(lease);
  }
  return out;
}

}  // namespace kvtier::tiering
