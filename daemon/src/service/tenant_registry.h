// TenantRegistry: the tenants kvtierd knows by name, and how many clients are
// connected as each.
//
// The configured tenants (tenants:) are always known. Without them a Hello
// names its tenant freely (a label), and every label named would otherwise be
// remembered for the daemon's life: its stats and metrics rows, and the
// registry itself, grew with each distinct label (3,000 Hellos with 4 KiB
// labels made every admin StatsResponse too big for a frame). So at most
// `limit` labels are known at once: a new label past it takes the place of a
// label that no client is connected as and that holds nothing (`idle`), or is
// refused with kResourceExhausted. Not thread-safe: the event loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

// What a tenant's clients moved through one profile since its name became
// known (cachectl stats, tenant.<name>.*; kvtier_tenant_*_total).
struct TenantTraffic {
  uint64_t read_blocks = 0;       // Blocks its Acquires leased to it (loads, and sessions adopting a prefix).
  uint64_t read_leases = 0;       // Its read leases that ended with a Release...
  uint64_t read_lease_us = 0;     // ...and their time from Acquire to Release: its loads, as kvtierd sees them.
  uint64_t read_errors = 0;       // Acquires refused, read leases revoked (lease timeout) or gone with their client.
  uint64_t saved_blocks = 0;      // Blocks its Commits stored (new to kvtierd; duplicates are not counted).
};

class TenantRegistry {
 public:
  explicit TenantRegistry(const std::vector<TenantConfig>& configured);

  // A client connects as tenant `name`. A name not known yet is remembered
  // when fewer than `limit` labels are, or in place of a label with no client
  // for which `idle(label)` holds (it has no session and no block); otherwise
  // kResourceExhausted, and nothing changes.
  Status Connect(const std::string& name, uint32_t limit, const std::function<bool(const std::string&)>& idle);
  // A client connected as `name` went away. REQUIRES: a Connect of it succeeded.
  void Disconnect(const std::string& name);

  // Every known name, in name order.
  std::vector<std::string> Names() const;
  size_t size() const { return known_.size(); }
  size_t labels() const { return labels_; }  // Known names that are not configured tenants.
  uint32_t clients(const std::string& name) const;
  size_t connected() const { return connected_; }  // Names with a client connected now.

  // A known tenant's traffic in profile `profile`: counted while clients are
  // connected as it, forgotten with the label. REQUIRES: `name` is known.
  TenantTraffic& traffic(const std::string& name, size_t profile);
  // Null for a name not known; zeros for a profile it never used.
  const TenantTraffic* find_traffic(const std::string& name, size_t profile) const;

 private:
  struct Entry {
    uint32_t clients = 0;
    bool configured = false;  // Never forgotten, not counted in labels_.
    std::vector<TenantTraffic> traffic;  // By profile, grown on first use.
  };
  std::map<std::string, Entry> known_;
  size_t labels_ = 0;
  size_t connected_ = 0;
};

}  // namespace kvtier::daemon
