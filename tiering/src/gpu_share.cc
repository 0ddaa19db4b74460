// GpuShare: the fair share of the GPU tier while a tenant waits (gpu_share.h).
#include "gpu_share.h"

#include <algorithm>

namespace kvtier::tiering {

bool GpuShare::Active(const TenantAccount& a, Clock::time_point now) const {
  return a.Held(Tier::kGpu) > 0 || (a.waited && now - a.waited_at < window_);
}

bool GpuShare::NoteWaiting(TenantAccount& waiter, const TenantLedger& ledger, Clock::time_point now) {
  if (window_.count() <= 0) return false;
  uint32_t active = 0;
  ledger.ForEach([&](const TenantAccount& a) { active += (&a == &waiter || Active(a, now)) ? 1 : 0; });
  const uint32_t share = std::max<uint32_t>(1, gpu_slots_ / std::max<uint32_t>(1, active));
  // A tenant that holds its share already cannot ask the others to give way:
  // alone, it never waits on anyone (its share is the whole tier).
  if (waiter.Held(Tier::kGpu) >= share) return false;
  // A new wait (not during one) begins a new marking epoch: marks made during
  // one wait stay until it ends (Reclaimer::ReclaimShare).
  if (!contended(now)) {
    if (++epoch_ == 0) epoch_ = 1;
    marked_.clear();
  }
  waiter.waited = true;
  waiter.waited_at = now;
  waited_ = true;
  last_wait_ = now;
  share_ = share;
  active_ = active;
  return true;
}

uint32_t GpuShare::Room(const TenantAccount& a, Clock::time_point now) const {
  if (!Applies(a, now)) return kNoQuota;
  const uint32_t held = a.Held(Tier::kGpu);
  return held >= share_ ? 0 : share_ - held;
}

}  // namespace kvtier::tiering
