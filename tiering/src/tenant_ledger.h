// TenantLedger: what each tenant of one engine holds — blocks per tier, moves
// in flight, GPU slots in its write leases, sessions — against its quotas, and
// the room checks made from them.
//
// One Account per tenant, created when the tenant is first seen (a quota, a
// session, an adopted block) and kept for the engine's life, so a Record or a
// Session may point at it. Counts are kept by the engine as blocks are
// published, moved and freed; the invariant checker recounts them.
// Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::tiering {

struct NamespaceHash {
  size_t operator()(const Namespace& ns) const { return BlockKeyHash{}(ns.id); }
};

// Returned by Room when the tenant has no quota in a tier.
inline constexpr uint32_t kNoQuota = UINT32_MAX;

struct TenantAccount {
  Tenant tenant;
  PerTier<uint32_t> quota;      // Blocks allowed per tier; 0 = no quota.
  PerTier<uint32_t> blocks;     // Indexed blocks per tier; a moving block counts in its source.
  PerTier<uint32_t> moving_to;  // Moves in flight, by destination tier.
  uint32_t leased = 0;          // GPU slots of its write leases, not yet committed.
  uint32_t sessions = 0;
  // When it last found no GPU slot while below its fair share (gpu_share.h).
  bool waited = false;
  std::chrono::steady_clock::time_point waited_at;

  bool has_quota(Tier tier) const { return quota[tier] != 0; }
  // Blocks in `tier` once the moves in flight land.
  uint32_t Blocks(Tier tier) const;
  // What counts against the quota in `tier`: Blocks(tier), plus in the GPU
  // tier the slots of its write leases (a commit turns them into blocks).
  uint32_t Held(Tier tier) const;
  // How many more blocks may be held in `tier` (kNoQuota: no quota).
  uint32_t Room(Tier tier) const;

  // Bookkeeping, called as a block of this tenant changes.
  void Published(Tier tier) { ++blocks[tier]; }
  void Unpublished(Tier tier, bool moving);  // Freed while in `tier` (a moving block: its move no longer counts).
  void MoveStarted(Tier from);
  void MoveEnded(Tier from, bool landed);    // Landed: the block is now in the other tier.
  // Write-lease slots: reserved (Allocate), then committed or given back.
  void Leased(uint32_t slots) { leased += slots; }
  void Unleased(uint32_t slots) { leased -= slots; }
};

class TenantLedger {
 public:
  // kInvalidArgument when two quotas name one tenant.
  Status SetQuotas(std::span<const TenantQuota> quotas);

  // The tenant's account, created on first use. A tenant first seen by its
  // namespace alone (an adopted block) takes its name when one is given later.
  TenantAccount& Get(const Tenant& tenant);
  TenantAccount& Get(const Namespace& ns);
  const TenantAccount* Find(const Namespace& ns) const;

  // kResourceExhausted when a new session (not yet existing) of `account` would
  // pass `limit` sessions per tenant (0 = no limit).
  Status CheckNewSession(const TenantAccount& account, std::string_view id, uint32_t limit) const;

  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [ns, account] : accounts_) f(account);
  }
  template <typename F>
  void ForEach(F&& f) {
    for (auto& [ns, account] : accounts_) f(account);
  }

 private:
  // An unordered_map never moves its elements, so Records and Sessions may
  // point at accounts however the map grows (accounts are never erased).
  std::unordered_map<Namespace, TenantAccount, NamespaceHash> accounts_;
};

}  // namespace kvtier::tiering
