// TenantRegistry: configured tenants and a bounded set of labels (tenant_registry.h).
#include "service/tenant_registry.h"

namespace kvtier::daemon {

TenantRegistry::TenantRegistry(const std::vector<TenantConfig>& configured) {
  for (const TenantConfig& t : configured) known_[t.name].configured = true;
}

Status TenantRegistry::Connect(const std::string& name, uint32_t limit,
                               const std::function<bool(const std::string&)>& idle) {
  if (auto it = known_.find(name); it != known_.end()) {
    if (it->second.clients++ == 0) ++connected_;
    return Status::Ok();
  }
  if (labels_ >= limit) {
    // One scan of at most `limit` labels, only when a new label finds the registry full.
    auto forget = known_.end();
    for (auto it = known_.begin(); it != known_.end(); ++it) {
      if (!it->second.configured && it->second.clients == 0 && idle(it->first)) {
        forget = it;
        break;
      }
    }
    if (forget == known_.end()) {
      return ResourceExhausted("kvtierd knows " + std::to_string(labels_) +
                               " tenant labels, the limit (limits.max_tenants), and each has a client, a "
                               "session or a block; evict a tenant's sessions or reuse a label");
    }
    known_.erase(forget);
    --labels_;
  }
  known_[name].clients = 1;
  ++labels_;
  ++connected_;
  return Status::Ok();
}

void TenantRegistry::Disconnect(const std::string& name) {
  auto it = known_.find(name);
  if (it != known_.end() && it->second.clients > 0 && --it->second.clients == 0) --connected_;
}

std::vector<std::string> TenantRegistry::Names() const {
  std::vector<std::string> out;
  out.reserve(known_.size());
  for (const auto& [name, entry] : known_) out.push_back(name);
  return out;
}

uint32_t TenantRegistry::clients(const std::string& name) const {
  auto it = known_.find(name);
  return it == known_.end() ? 0 : it->second.clients;
}

TenantTraffic& TenantRegistry::traffic(const std::string& name, size_t profile) {
  std::vector<TenantTraffic>& t = known_.at(name).traffic;
  if (t.size() <= profile) t.resize(profile + 1);
  return t[profile];
}

const TenantTraffic* TenantRegistry::find_traffic(const std::string& name, size_t profile) const {
  static const TenantTraffic kNone;
  auto it = known_.find(name);
  if (it == known_.end()) return nullptr;
  return profile < it->second.traffic.size() ? &it->second.traffic[profile] : &kNone;
}

}  // namespace kvtier::daemon
