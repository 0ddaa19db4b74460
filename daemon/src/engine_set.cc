// kvtierd's engines, one per profile and trust domain (engine_set.h).
#include "engine_set.h"

#include "kvtier/shm_names.h"

namespace kvtier::daemon {

tiering::EngineOptions EngineOptionsFor(const DaemonConfig& config, size_t profile, std::string_view isolated) {
  const ProfileConfig& p = config.profiles[profile];
  const TenantConfig* tenant = nullptr;
  for (const TenantConfig& t : config.tenants) {
    if (!isolated.empty() && t.isolated && t.name == isolated) tenant = &t;
  }
  tiering::EngineOptions o;
  o.profile = p.profile;
  if (tenant != nullptr) {
    o.gpu_slots = tenant->gpu_blocks;
    o.host_slots = tenant->host_blocks;
  } else {
    // Config parsing checked that the isolated tenants leave at least one block of each tier.
    o.gpu_slots = p.gpu_blocks;
    o.host_slots = p.host_blocks;
    for (const TenantConfig& t : config.tenants) {
      if (!t.isolated) continue;
      o.gpu_slots -= t.gpu_blocks;
      o.host_slots -= t.host_blocks;
    }
  }
  o.gpu_high_watermark = config.gpu_high_watermark;
  o.gpu_low_watermark = config.gpu_low_watermark;
  o.host_high_watermark = config.host_high_watermark;
  o.host_low_watermark = config.host_low_watermark;
  o.max_copy_batch = config.max_copy_batch;
  o.max_sessions = config.max_sessions;
  o.max_sessions_per_tenant = SessionsPerTenant(config);
  o.max_session_blocks = config.max_session_blocks;
  o.max_blocks_per_request = config.max_blocks_per_request;
  o.lease_timeout = std::chrono::milliseconds(config.lease_timeout_ms);
  o.name = shm_names::Domain(p.profile.name, tenant != nullptr ? tenant->name : std::string());
  o.index_segment = shm_names::Index(config.instance, o.name);
  // An isolated tenant's engine is its quota; the shared one keeps the quotas
  // of the tenants it serves.
  if (tenant != nullptr) return o;
  for (const TenantConfig& t : config.tenants) {
    if (t.isolated || (t.gpu_blocks == 0 && t.host_blocks == 0)) continue;
    tiering::TenantQuota q;
    q.tenant = tiering::Tenant::Make(p.profile.Fingerprint(), t.name);
    q.blocks[Tier::kGpu] = t.gpu_blocks;
    q.blocks[Tier::kHost] = t.host_blocks;
    o.quotas.push_back(q);
  }
  return o;
}

void EngineSet::Add(EngineMember member) {
  if (member.tenant.empty()) first_.push_back(members_.size());
  members_.push_back(std::move(member));
}

size_t EngineSet::IndexOf(size_t profile, std::string_view tenant) const {
  for (size_t i = First(profile) + 1; i < Last(profile); ++i) {
    if (members_[i].tenant == tenant) return i;
  }
  return First(profile);
}

std::string DescribeEngine(std::string_view profile, std::string_view tenant) {
  std::string out = "profile '" + std::string(profile) + "'";
  if (!tenant.empty()) out += ", tenant '" + std::string(tenant) + "' (isolated)";
  return out;
}

std::string EngineSet::Describe(size_t member) const {
  const EngineMember& m = members_[member];
  return DescribeEngine(m.engine->profile().name, m.tenant);
}

}  // namespace kvtier::daemon
