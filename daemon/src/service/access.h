// Access control: who a Unix-socket peer is, whether it may connect, whether it
// is an administrator, and which tenant it acts as.
//
// Identity comes from the kernel (SO_PEERCRED at connect time, SO_PEERGROUPS for
// the supplementary groups), never from anything the client sends. Thread-
// compatible; the daemon uses it on its event-loop thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

struct PeerCredentials {
  uint32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // Supplementary groups (gid included).
  bool HasGroup(uint32_t g) const;
  std::string Describe() const;  // "uid 1001 gid 1001 (pid 42)"
};

// The credentials of the peer of connected Unix socket `fd`. The groups come
// from SO_PEERGROUPS where the kernel has it (4.13+), else from the user's
// group database entry (getgrouplist).
Result<PeerCredentials> GetPeerCredentials(int fd);

class AccessPolicy {
 public:
  // `owner_uid`: the daemon's own user, always allowed and an administrator.
  AccessPolicy(const DaemonConfig& config, uint32_t owner_uid);

  // OK, or kPermissionDenied saying why.
  Status CheckConnect(const PeerCredentials& peer) const;
  bool IsAdmin(const PeerCredentials& peer) const;

  // The tenant a peer acts as. `requested` (from Hello) may be empty. Without
  // configured tenants the request is taken as given (a label). With tenants, a
  // non-empty request must name a tenant with allow_requested that lists the
  // peer, or the peer's own (by uid) tenant; an administrator may request any (kPermissionDenied otherwise); an empty one maps the peer to the tenant
  // listing its uid, else one of its groups, else "default" (which only such
  // peers and admins may request).
  Result<std::string> TenantFor(const PeerCredentials& peer, const std::string& requested) const;

  // The configured tenant named `name`, or null ("default" and labels have none).
  const TenantConfig* FindTenant(const std::string& name) const;

  static constexpr const char* kDefaultTenant = "default";

 private:
  bool IsMember(const TenantConfig& t, const PeerCredentials& peer) const;

  AccessConfig access_;
  std::vector<TenantConfig> tenants_;
  uint32_t owner_uid_;
};

}  // namespace kvtier::daemon
