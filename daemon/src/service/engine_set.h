// EngineSet: kvtierd's engines, each one trust domain of one model profile.
//
// Per profile: one engine whose pools, index and sessions the tenants share,
// and one for each isolated tenant (tenants: isolated: true) with pools, index
// and sessions of its own, sized by that tenant's gpu_blocks and host_blocks
// and carved out of the profile's (the shared engine gets the rest). A client
// is welcomed into its tenant's engine and handed that engine's segments only,
// so no client of another tenant can map an isolated tenant's KV bytes or token
// rows (docs/design.md, "What a client can do"). Members are ordered profile by
// profile, the shared engine first, then the isolated tenants in configuration
// order; the set is built once at start and never changes. Event-loop thread
// only, like the engines.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::stores {
class StoreChain;
}  // namespace kvtier::stores

namespace kvtier::daemon {

struct EngineMember {
  size_t profile = 0;  // Index into DaemonConfig::profiles.
  std::string tenant;  // The isolated tenant it serves; empty: the profile's shared engine.
  std::unique_ptr<tiering::Engine> engine;
};

// The options of the engine serving profile `profile` for isolated tenant
// `tenant` ("": the shared engine): its slots (the tenant's quotas, or what
// the isolated tenants leave of the profile's), the shared tiering and limits,
// the quotas of the tenants it serves and its segment names.
// REQUIRES: a non-empty `tenant` names an isolated tenant of `config`.
tiering::EngineOptions EngineOptionsFor(const DaemonConfig& config, size_t profile, std::string_view tenant);
// "profile 'default'", or "profile 'default', tenant 'secure' (isolated)" for
// an isolated tenant's engine: how log lines name an engine.
std::string DescribeEngine(std::string_view profile, std::string_view tenant);

class EngineSet;
class EventPublisher;
class WarmLifecycle;

// What the engines report to besides their backend.
struct EngineWiring {
  stores::StoreChain* stores = nullptr;  // Null: no stores below the host tier.
  EventPublisher* events = nullptr;      // Null: no KV events.
  WarmLifecycle& warm;                     // Takes back what a warm restart saved (or nothing).
};

// Makes every engine of `config` into `set` (profile by profile, the shared
// engine first, then the isolated tenants'): their options, the hooks to the
// stores and the events, and what a warm restart saved for each.
Status BuildEngines(const DaemonConfig& config, tiering::Backend& backend, const EngineWiring& wiring,
                    EngineSet& set);

class EngineSet {
 public:
  // REQUIRES: members come profile by profile, shared engine first (as above).
  void Add(EngineMember member);
  void Clear() { members_.clear(); }

  size_t size() const { return members_.size(); }
  EngineMember& operator[](size_t i) { return members_[i]; }
  const EngineMember& operator[](size_t i) const { return members_[i]; }
  auto begin() { return members_.begin(); }
  auto end() { return members_.end(); }
  auto begin() const { return members_.begin(); }
  auto end() const { return members_.end(); }

  size_t profiles() const { return first_.size(); }
  // The members serving profile `profile`: [first, last).
  size_t First(size_t profile) const { return first_[profile]; }
  size_t Last(size_t profile) const { return profile + 1 < first_.size() ? first_[profile + 1] : members_.size(); }
  // The member serving tenant `tenant` of profile `profile`: its isolated
  // engine, or the shared one.
  size_t IndexOf(size_t profile, std::string_view tenant) const;
  tiering::Engine& Of(size_t profile, std::string_view tenant) { return *members_[IndexOf(profile, tenant)].engine; }
  const tiering::Engine& Of(size_t profile, std::string_view tenant) const {
    return *members_[IndexOf(profile, tenant)].engine;
  }
  // The profile's shared engine (its profile, block geometry and name).
  const tiering::Engine& Shared(size_t profile) const { return *members_[first_[profile]].engine; }
  // DescribeEngine of member `member`.
  std::string Describe(size_t member) const;

 private:
  std::vector<EngineMember> members_;
  std::vector<size_t> first_;  // first_[p]: the index of profile p's shared engine.
};

}  // namespace kvtier::daemon
