// GpuShare: the fair share of the GPU tier that tenants without a GPU quota
// get while another tenant waits for GPU room.
//
// The lease timeout frees what a stopped client holds, but a live one that
// renews its read leases (acquiring again before releasing the old lease)
// keeps its blocks pinned for ever, and pinned blocks are never demoted: with
// no quota configured, one tenant could hold the whole GPU tier while every
// other tenant's Allocate failed. So the GPU tier is shared fairly, and only
// when it matters (work-conserving): a tenant *waits* when its Allocate or a
// promotion it needs finds no GPU slot (everything pinned, leased or moving)
// while it holds less than its share. For `window` after the last such wait,
// each tenant without a GPU quota may hold `gpu slots / active tenants` (active:
// holding GPU blocks or write-lease slots, or waiting within the window). A
// tenant over it gets no new GPU slots, its promotions stop, and the GPU blocks
// it holds past its share are *marked*: its new read leases stop before a
// marked block, so once its older leases end those blocks are demoted (or
// freed, when no session holds them) and their slots go to the waiter (reclaim.h: MakeShareRoom). Existing leases are
// never revoked early: a reader would read reused slots.
//
// Alone, a tenant never waits on anyone (its share is the whole tier), and a
// tenant at or over its share that wants more is not waiting: it cannot make
// the others give way. Tenants with a GPU quota keep their quota alone.
// Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "tenant_ledger.h"

namespace kvtier::tiering {

class GpuShare {
 public:
  using Clock = std::chrono::steady_clock;

  GpuShare(uint32_t gpu_slots, std::chrono::milliseconds window) : gpu_slots_(gpu_slots), window_(window) {}

  void set_window(std::chrono::milliseconds window) { window_ = window; }

  // Notes that `waiter` found no GPU slot for what it needs now. True when
  // that makes it a waiter (it holds less than its share, counted with every
  // tenant active now): the share is recomputed, and if nobody waited within
  // the window, a new marking epoch begins.
  bool NoteWaiting(TenantAccount& waiter, const TenantLedger& ledger, Clock::time_point now);

  // Someone waited within the window: shares apply.
  bool contended(Clock::time_point now) const {
    return window_.count() > 0 && waited_ && now - last_wait_ < window_;
  }
  // The share per tenant, as of the last wait.
  uint32_t share() const { return share_; }
  uint32_t active() const { return active_; }
  // The marking epoch (Record::share_epoch): blocks marked in it are over
  // their tenant's share. 0 is never an epoch.
  uint32_t epoch() const { return epoch_; }
  // The records marked in this epoch, every tenant's, so that the marks a
  // tenant holds are counted without walking what it holds. Entries may have
  // gone stale since (demoted, freed, republished): the reclaimer checks each
  // against its record and prunes them. Emptied when a new epoch begins.
  std::vector<uint32_t>& marked() { return marked_; }

  // Whether the share applies to `a` now: contended, and `a` has no GPU quota.
  bool Applies(const TenantAccount& a, Clock::time_point now) const {
    return !a.has_quota(Tier::kGpu) && contended(now);
  }
  // `a` holds more than its share and the share applies.
  bool Over(const TenantAccount& a, Clock::time_point now) const {
    return Applies(a, now) && a.Held(Tier::kGpu) > share_;
  }
  // How many more GPU blocks or slots `a` may hold under its share (kNoQuota
  // when the share does not apply to it).
  uint32_t Room(const TenantAccount& a, Clock::time_point now) const;

 private:
  // Tenants holding GPU blocks or slots, or waiting within the window.
  bool Active(const TenantAccount& a, Clock::time_point now) const;

  uint32_t gpu_slots_;
  std::chrono::milliseconds window_;
  bool waited_ = false;
  Clock::time_point last_wait_;
  uint32_t share_ = 0;
  uint32_t active_ = 0;
  uint32_t epoch_ = 0;
  std::vector<uint32_t> marked_;
};

}  // namespace kvtier::tiering
