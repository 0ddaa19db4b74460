// Hello: a client's welcome. Its profile and model identity checked, its tenant
// authenticated from the kernel's credentials (access.h), the engine that serves
// it chosen, and the shared segments it maps passed with the Welcome.
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "log.h"
#include "service/service.h"

namespace kvtier::daemon {

using tiering::Engine;

Result<Reply> Service::On(ClientState& c, const wire::Hello& m) {
  if (c.welcomed) return FailedPrecondition("Hello was already received on this connection");
  if (m.min_version > wire::kProtocolVersion || m.max_version < wire::kProtocolVersion) {
    return Status(StatusCode::kVersionMismatch, "client speaks protocol versions " + std::to_string(m.min_version) +
                                                    ".." + std::to_string(m.max_version) + ", this kvtierd speaks " +
                                                    std::to_string(wire::kProtocolVersion));
  }
  size_t profile = 0;  // The first is the default.
  if (!m.profile.empty()) {
    profile = engines_.profiles();
    for (size_t i = 0; i < engines_.profiles(); ++i) {
      if (engines_.Shared(i).profile().name == m.profile) profile = i;
    }
    if (profile == engines_.profiles()) {
      return NotFound("no model profile named '" + m.profile + "' (see cachectl config)");
    }
  }
  if (const std::vector<ModelId>& accepted = config_.profiles[profile].models;
      !accepted.empty() && std::find(accepted.begin(), accepted.end(), m.model) == accepted.end()) {
    std::string list;
    for (const ModelId& id : accepted) list += (list.empty() ? "" : ", ") + id.ToHex();
    return Status(StatusCode::kPermissionDenied,
                  "profile '" + config_.profiles[profile].profile.name + "' accepts only models " +
                      list + " (profiles[].models); this client " +
                      (m.model.IsNull() ? std::string("gave no model identity") : "runs " + m.model.ToHex()));
  }
  if (counters_.clients >= config_.max_clients) {
    return ResourceExhausted("kvtierd serves at most " + std::to_string(config_.max_clients) + " clients");
  }
  if (!m.tenant.empty() && !IsValidTenantName(m.tenant)) {
    // Not echoed: it may be long, or hold what a log line or a metric label must not.
    return InvalidArgument("Hello.tenant: a tenant name is 1-" + std::to_string(kMaxTenantName) +
                           " characters of [A-Za-z0-9._-]; got a " + std::to_string(m.tenant.size()) +
                           "-byte name that is not");
  }
  auto tenant = access_.TenantFor(c.peer, m.tenant);
  if (!tenant.ok()) return tenant.status();
  if (const uint32_t cap = ClientsPerTenant(config_); cap != 0 && tenants_.clients(*tenant) >= cap) {
    return ResourceExhausted("tenant '" + *tenant + "' has " + std::to_string(tenants_.clients(*tenant)) +
                             " clients connected, its most (limits.max_clients_per_tenant" +
                             (config_.max_clients_per_tenant == 0 ? ", by default max_clients / (tenants + 1)" : "") +
                             "): the other tenants keep their share of the connections");
  }
  const size_t member = engines_.IndexOf(static_cast<size_t>(profile), *tenant);
  Engine& e = *engines_[member].engine;
  // Last before the welcome (nothing after it fails), so every Connect has its Disconnect.
  KVTIER_RETURN_IF_ERROR(
      tenants_.Connect(*tenant, config_.max_tenants, [this](const std::string& t) { return TenantIdle(t); }));
  c.welcomed = true;
  c.name = Printable(m.client_name);  // Shown in logs and by cachectl: never raw peer bytes.
  c.pid = m.pid;
  c.tenant = *tenant;
  c.admin = access_.IsAdmin(c.peer);
  c.profile = profile;
  c.engine_index = member;
  // The namespace salt is the authenticated tenant, never a name the client chose.
  c.ns = Namespace::Make(e.profile().Fingerprint(), c.tenant);
  c.model = m.model;
  ++counters_.clients;
  ++counters_.connections;

  wire::Welcome w;
  w.version = wire::kProtocolVersion;
  w.instance_id = instance_id_;
  w.client_id = c.id;
  w.profile = e.profile();
  w.ns = KeyNamespace(c.ns, c.model);  // What the client chains its keys in.
  w.backend = backend_->kind();
  // The segments travel as descriptors with the Welcome (wire.h: the pools
  // without an IPC handle in tier order, the index, the fences); their names
  // are labels. A client gets no other way in: nothing is in /dev/shm.
  std::vector<int> fds;
  for (Tier t : kTiers) {
    const tiering::PoolHandle h = e.pool(t).Export();
    w.pools.push_back(wire::PoolDesc{t, h.slot_bytes, h.slots, h.shm_name, h.ipc_handle});
    if (h.ipc_handle.empty()) fds.push_back(h.fd);
  }
  w.index_segment = e.index_segment_name();
  w.fence_segment = backend_->FenceSegmentName();
  fds.push_back(e.index_fd());
  fds.push_back(backend_->FenceSegmentFd());
  w.max_blocks_per_request = config_.engine_limits.max_blocks_per_request;
  w.max_payload = config_.max_frame_bytes;
  w.fence_events = backend_->PromotionFenceEvents();
  LogInfo("client " + std::to_string(c.id) + " connected: " + c.name + " (pid " + std::to_string(m.pid) + ", " +
          c.peer.Describe() + ", tenant '" + c.tenant + "'" + (c.admin ? ", admin" : "") +
          (c.model.IsNull() ? std::string() : ", model " + c.model.ToHex()) + ", " + engines_.Describe(member) + ")");
  Reply reply{std::move(w)};
  reply.fds = std::move(fds);
  return reply;
}

}  // namespace kvtier::daemon
