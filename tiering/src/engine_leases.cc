// Engine: leases. Ending them, releases after a client's GPU work, promotions
// asked for at release, and the lease timeout's revocations (lease_table.h
// keeps them; Allocate in engine_write.cc and Acquire in engine.cc grant them).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>

#include "engine_impl.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::tiering {

void Engine::Impl::EndLease(Lease& lease) {
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

namespace {

Status NoLease(LeaseId id, const std::optional<RevokedLease>& revoked) {
  if (!revoked) return NotFound("lease " + std::to_string(id) + " does not exist");
  return NotFound(DescribeExpired(id, *revoked) + (revoked->write ? ": its slots had gone back to the pool"
                                                                  : ": its blocks were unpinned then, so what was read "
                                                                    "through it after that may be another block's"));
}

}  // namespace

Status Engine::Release(LeaseId lease_id, GpuWork after) {
  Impl& impl = *impl_;
  std::optional<Lease> lease = impl.leases.Take(lease_id);
  if (!lease) {
    impl.EndWatch(after);
    return NoLease(lease_id, impl.leases.ForgetRevoked(lease_id));
  }
  std::vector<uint32_t> promote;  // Still pinned by a GPU reader: PromoteWanted waits for it.
  if (const auto* read = std::get_if<ReadRecords>(&lease->held); read != nullptr && read->promote_after) {
    promote = read->records;
  }
  if (after.none()) {
    impl.EndLease(*lease);
  } else if (auto* write = std::get_if<WriteSlots>(&lease->held)) {
    // Held until the client's GPU work on them is done.
    impl.GiveBackAfter(after, std::move(write->slots), write->tenant, {}, /*writes=*/false);
  } else {
    impl.GiveBackAfter(after, {}, nullptr, std::move(std::get<ReadRecords>(lease->held).records), /*writes=*/false);
  }
  if (!promote.empty()) impl.WantPromotion(promote);
  return Status::Ok();
}

Status Engine::PromoteOnRelease(LeaseId lease_id) {
  ReadRecords* read = impl_->leases.FindRead(lease_id);
  if (read == nullptr) return NotFound("read lease " + std::to_string(lease_id) + " does not exist");
  read->promote_after = true;
  return Status::Ok();
}

void Engine::Impl::WantPromotion(std::span<const uint32_t> recs) {
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t r : recs) {
    // Freed with the lease (no session held it), or promoted already by another reader: not wanted.
    if (WantsPromotion(blocks[r])) stats.after_read_given_up += promotions.Add(r, blocks[r].key, now);
  }
  PromoteWanted();
}

uint32_t Engine::Impl::PromoteWanted() {
  if (promotions.empty()) return 0;
  const auto now = std::chrono::steady_clock::now();
  uint32_t scheduled = 0;
  promotions.Retain([&](const WantedPromotion& w) {
    const Record& rec = blocks[w.record];
    // Gone (freed, perhaps reused by another block), or moved by another reader meanwhile.
    if (rec.key != w.key || !WantsPromotion(rec)) return false;
    // Over its tenant's quota, or its fair share while another tenant waits.
    if (GpuRoom(*rec.tenant, now) == 0 || now - w.since > kWantedPromotionFor) {
      ++stats.after_read_given_up;
      return false;
    }
    if (rec.readers == 0 && slots(Tier::kGpu).free_count() > 0) {
      mover.Schedule(w.record, CopyDirection::kHostToGpu);
      ++scheduled;
      return false;
    }
    return true;
  });
  if (!promotions.empty()) {
    reclaim.MakeGpuRoom(static_cast<uint32_t>(promotions.size()));
    // No free slot and none coming: nothing to wait for.
    if (slots(Tier::kGpu).free_count() == 0 && mover.demoting() == 0) stats.after_read_given_up += promotions.Clear();
  }
  stats.after_read_promotions += scheduled;
  if (scheduled > 0) Flush(CopyDirection::kHostToGpu);
  return scheduled;
}

bool Engine::LeaseExpired(LeaseId lease) const { return impl_->leases.IsRevoked(lease); }

LeaseExpiry Engine::ExpireLeases(std::chrono::steady_clock::time_point now) {
  Impl& impl = *impl_;
  LeaseExpiry out;
  const std::chrono::milliseconds timeout = impl.options.lease_timeout;
  if (timeout.count() <= 0) return out;
  out.more = impl.leases.RevokeExpired(now, timeout, kLeaseExpiryWork, [&](Lease& lease) {
    const auto n = static_cast<uint32_t>(lease.size());
    if (lease.write()) {
      ++out.write;
      out.slots += n;
      ++impl.stats.expired_write_leases;
    } else {
      ++out.read;
      out.records += n;
      ++impl.stats.expired_read_leases;
    }
    impl.EndLease(lease);
  });
  return out;
}

}  // namespace kvtier::tiering
