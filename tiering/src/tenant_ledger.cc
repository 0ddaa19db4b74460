// TenantLedger: per-tenant usage, quotas and session counts (tenant_ledger.h).
#include "tenant_ledger.h"

namespace kvtier::tiering {
namespace {

constexpr Tier Other(Tier t) { return t == Tier::kGpu ? Tier::kHost : Tier::kGpu; }

}  // namespace

Tenant Tenant::Make(uint64_t profile_fingerprint, std::string name) {
  Tenant t;
  t.ns = Namespace::Make(profile_fingerprint, name);
  t.name = std::move(name);
  return t;
}

uint32_t TenantAccount::Blocks(Tier tier) const { return blocks[tier] + moving_to[tier] - moving_to[Other(tier)]; }

uint32_t TenantAccount::Held(Tier tier) const { return Blocks(tier) + (tier == Tier::kGpu ? leased : 0); }

uint32_t TenantAccount::Room(Tier tier) const {
  if (!has_quota(tier)) return kNoQuota;
  const uint32_t held = Held(tier);
  return held >= quota[tier] ? 0 : quota[tier] - held;
}

void TenantAccount::Unpublished(Tier tier, bool moving) {
  --blocks[tier];
  if (moving) --moving_to[Other(tier)];
}

void TenantAccount::MoveStarted(Tier from) { ++moving_to[Other(from)]; }

void TenantAccount::MoveEnded(Tier from, bool landed) {
  --moving_to[Other(from)];
  if (landed) {
    --blocks[from];
    ++blocks[Other(from)];
  }
}

Status TenantLedger::SetQuotas(std::span<const TenantQuota> quotas) {
  std::unordered_map<Namespace, bool, NamespaceHash> seen;
  for (const TenantQuota& q : quotas) {
    if (!seen.emplace(q.tenant.ns, true).second) {
      return InvalidArgument("two quotas for tenant '" + q.tenant.name + "'");
    }
  }
  for (const TenantQuota& q : quotas) Get(q.tenant).quota = q.blocks;
  return Status::Ok();
}

TenantAccount& TenantLedger::Get(const Tenant& tenant) {
  TenantAccount& a = Get(tenant.ns);
  if (a.tenant.name.empty()) a.tenant.name = tenant.name;
  return a;
}

TenantAccount& TenantLedger::Get(const Namespace& ns) {
  auto [it, added] = accounts_.try_emplace(ns);
  if (added) it->second.tenant.ns = ns;
  return it->second;
}

const TenantAccount* TenantLedger::Find(const Namespace& ns) const {
  auto it = accounts_.find(ns);
  return it == accounts_.end() ? nullptr : &it->second;
}

Status TenantLedger::CheckNewSession(const TenantAccount& account, std::string_view id, uint32_t limit) const {
  if (limit == 0 || account.sessions < limit) return Status::Ok();
  return ResourceExhausted("session '" + std::string(id) + "': its tenant holds " + std::to_string(account.sessions) +
                           " sessions, the limit (limits.max_sessions_per_tenant); evict one first");
}

}  // namespace kvtier::tiering
