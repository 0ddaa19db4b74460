// Access: peer credentials from the kernel, who may connect, and each peer's tenant (access.h).
#include "service/access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvtier::daemon {
namespace {

bool Contains(const std::vector<uint32_t>& v, uint32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

bool PeerCredentials::HasGroup(uint32_t g) const { return gid == g || Contains(groups, g); }

std::string PeerCredentials::Describe() const {
  return "uid " + std::to_string(uid) + " gid " + std::to_string(gid) + " (pid " + std::to_string(pid) + ")";
}

Result<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status(StatusCode::kPermissionDenied, std::string("SO_PEERCRED: ") + std::strerror(errno));
  }
  PeerCredentials out;
  out.pid = static_cast<uint32_t>(cred.pid);
  out.uid = cred.uid;
  out.gid = cred.gid;
#ifdef SO_PEERGROUPS
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      out.groups.assign(groups.begin(), groups.end());
      return out;
    }
    if (errno != ERANGE) break;
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
#endif
  // No SO_PEERGROUPS: the user's groups as the group database lists them.
  std::vector<char> buf(16384);
  passwd pw{}, *found = nullptr;
  if (::getpwuid_r(cred.uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    int n = 64;
    std::vector<gid_t> list(static_cast<size_t>(n));
    if (::getgrouplist(found->pw_name, cred.gid, list.data(), &n) < 0) {
      list.resize(static_cast<size_t>(n));
      ::getgrouplist(found->pw_name, cred.gid, list.data(), &n);
    }
    list.resize(static_cast<size_t>(std::max(n, 0)));
    out.groups.assign(list.begin(), list.end());
  }
  return out;
}

AccessPolicy::AccessPolicy(const DaemonConfig& config, uint32_t owner_uid)
    : access_(config.access), tenants_(config.tenants), owner_uid_(owner_uid) {}

bool AccessPolicy::IsAdmin(const PeerCredentials& p) const {
  if (p.uid == owner_uid_ || (p.uid == 0 && access_.allow_root)) return true;
  if (Contains(access_.admin_uids, p.uid)) return true;
  return std::any_of(access_.admin_gids.begin(), access_.admin_gids.end(), [&](uint32_t g) { return p.HasGroup(g); });
}

Status AccessPolicy::CheckConnect(const PeerCredentials& p) const {
  if (p.uid == 0 && !access_.allow_root && owner_uid_ != 0) {
    return Status(StatusCode::kPermissionDenied, "root is not allowed (access.allow_root: false)");
  }
  if (IsAdmin(p) || Contains(access_.allow_uids, p.uid)) return Status::Ok();
  for (uint32_t g : access_.allow_gids) {
    if (p.HasGroup(g)) return Status::Ok();
  }
  for (const TenantConfig& t : tenants_) {
    if (IsMember(t, p)) return Status::Ok();
  }
  return Status(StatusCode::kPermissionDenied,
                p.Describe() + " may not use this kvtierd (access.allow_users / allow_groups, or a tenant's users / groups)");
}

bool AccessPolicy::IsMember(const TenantConfig& t, const PeerCredentials& p) const {
  if (Contains(t.uids, p.uid)) return true;
  return std::any_of(t.gids.begin(), t.gids.end(), [&](uint32_t g) { return p.HasGroup(g); });
}

const TenantConfig* AccessPolicy::FindTenant(const std::string& name) const {
  for (const TenantConfig& t : tenants_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<std::string> AccessPolicy::TenantFor(const PeerCredentials& p, const std::string& requested) const {
  if (tenants_.empty()) return requested;
  if (!requested.empty()) {
    const TenantConfig* t = FindTenant(requested);
    if (t == nullptr) {
      if (requested == kDefaultTenant) {
        // The default tenant is for peers in no tenant (and admins).
        auto mapped = TenantFor(p, "");
        if (IsAdmin(p) || (mapped.ok() && *mapped == kDefaultTenant)) return requested;
        return Status(StatusCode::kPermissionDenied, p.Describe() + " belongs to tenant '" + (mapped.ok() ? *mapped : "?") +
                                                         "', not to the default tenant");
      }
      return Status(StatusCode::kPermissionDenied, "no tenant named '" + requested + "' is configured");
    }
    if (Contains(t->uids, p.uid) || IsAdmin(p)) return requested;  // A user's own tenant; an operator's any.
    if (!t->allow_requested) {
      return Status(StatusCode::kPermissionDenied,
                    "tenant '" + requested + "' cannot be requested (its allow_requested is false)");
    }
    if (!IsMember(*t, p)) {
      return Status(StatusCode::kPermissionDenied,
                    p.Describe() + " is not a member of tenant '" + requested + "' (its users / groups)");
    }
    return requested;
  }
  for (const TenantConfig& t : tenants_) {
    if (Contains(t.uids, p.uid)) return t.name;
  }
  for (const TenantConfig& t : tenants_) {
    if (std::any_of(t.gids.begin(), t.gids.end(), [&](uint32_t g) { return p.HasGroup(g); })) return t.name;
  }
  return std::string(kDefaultTenant);
}

}  // namespace kvtier::daemon
