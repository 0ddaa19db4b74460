// kvtierd's engines, one per profile and trust domain (engine_set.h).
#include "service/engine_set.h"

#include "events/kv_events.h"
#include "kvtier/shm_names.h"
#include "kvtier/stores/store_chain.h"
#include "service/warm_lifecycle.h"

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
  static_cast<tiering::EngineTunables&>(o) = config.engine;
  static_cast<tiering::EngineLimits&>(o) = config.engine_limits;
  o.max_sessions_per_tenant = SessionsPerTenant(config);
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

Status BuildEngines(const DaemonConfig& config, tiering::Backend& backend, const EngineWiring& wiring,
                    EngineSet& set) {
  for (size_t p = 0; p < config.profiles.size(); ++p) {
    // The shared engine first, then one per isolated tenant (engine_set.h).
    std::vector<std::string> domains{""};
    for (const TenantConfig& t : config.tenants) {
      if (t.isolated) domains.push_back(t.name);
    }
    for (std::string& tenant : domains) {
      tiering::EngineOptions options = EngineOptionsFor(config, p, tenant);
      wiring.warm.BeforeEngine(config, options.name);
      options.warm_restart = wiring.warm.enabled();
      if (stores::StoreChain* chain = wiring.stores) {
        // Blocks landing in the host tier and dropped from it go to the stores.
        options.stores_below = true;
        // A write-through store gets each block as soon as it is committed.
        for (const StoreTierConfig& t : config.stores.tiers) options.spill_committed |= t.write_through;
        const uint64_t fingerprint = options.profile.Fingerprint();
        // Writes are reported as events (vllm's STORAGE medium) for the blocks
        // the events stream may name: not an isolated tenant's (below).
        const bool reported = tenant.empty();
        options.on_spill = [chain, fingerprint, reported](const tiering::HostBlock& b) {
          chain->Offer(stores::BlockRecordHeader{fingerprint, b.key, b.parent, b.key_ns}, b.tokens, b.payload,
                       b.dropped, reported);
        };
      }
      // An isolated tenant's blocks are out of every other tenant's reach, and the
      // events stream is read by the socket's whole group: they are not published.
      if (EventPublisher* events = tenant.empty() ? wiring.events : nullptr) {
        const std::string profile = options.profile.name;
        const uint32_t bt = options.profile.block_tokens;
        options.on_block_event = [events, profile, bt](const tiering::BlockEvent& e) {
          events->AddBlock(profile, bt, e);
        };
        options.on_session_evicted = [events, profile](std::string_view tenant_name, std::string_view session) {
          events->AddSessionEvicted(profile, tenant_name, session);
        };
      }
      const std::string who = DescribeEngine(config.profiles[p].profile.name, tenant);
      auto engine = tiering::Engine::Create(options, backend);
      if (!engine.ok()) return Status(engine.status().code(), who + ": " + engine.status().message());
      wiring.warm.AdoptInto(**engine, config, who);
      set.Add(EngineMember{p, std::move(tenant), std::move(engine).value()});
    }
  }
  return Status::Ok();
}

}  // namespace kvtier::daemon
