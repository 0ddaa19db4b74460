#include "service.h"

#include <random>

#include "kvtier/index_layout.h"
#include "kvtier/tiering/host_backend.h"
#include "log.h"

namespace kvtier::daemon {

using tiering::Engine;
using kvtier::Tier;

namespace {

wire::Message Error(const Status& st) { return wire::FromStatus(st); }

}  // namespace

Result<std::unique_ptr<Service>> Service::Create(const DaemonConfig& config) {
  if (config.backend == "cuda") {
    return Status(StatusCode::kFailedPrecondition,
                  "backend 'cuda' was requested, but this kvtierd has no usable CUDA backend (no GPU or built "
                  "without KVTIER_WITH_CUDA); use 'auto' or 'host'");
  }
  tiering::HostBackendOptions bo;
  bo.name_prefix = config.instance;
  auto backend = tiering::CreateHostBackend(bo);
  if (!backend.ok()) return backend.status();
  std::unique_ptr<Service> svc(new Service(config, std::move(backend).value()));
  for (const ProfileConfig& p : config.profiles) {
    tiering::EngineOptions o;
    o.profile = p.profile;
    o.gpu_slots = p.gpu_blocks;
    o.host_slots = p.host_blocks;
    o.gpu_high_watermark = config.gpu_high_watermark;
    o.gpu_low_watermark = config.gpu_low_watermark;
    o.host_high_watermark = config.host_high_watermark;
    o.host_low_watermark = config.host_low_watermark;
    o.max_copy_batch = config.max_copy_batch;
    o.max_sessions = config.max_sessions;
    o.max_blocks_per_request = config.max_blocks_per_request;
    o.name = p.profile.name;
    o.index_segment = "/" + config.instance + "." + p.profile.name + ".index";
    auto engine = Engine::Create(o, *svc->backend_);
    if (!engine.ok()) {
      return Status(engine.status().code(), "profile '" + p.profile.name + "': " + engine.status().message());
    }
    svc->engines_.push_back(std::move(engine).value());
  }
  return svc;
}

Service::Service(DaemonConfig config, std::unique_ptr<tiering::Backend> backend)
    : config_(std::move(config)), backend_(std::move(backend)) {
  std::random_device rd;
  instance_id_ = (uint64_t{rd()} << 32) | rd();
}

Service::~Service() {
  engines_.clear();  // Engines before the backend they use.
  backend_.reset();
}

std::string Service::Describe() const {
  std::string out = "backend " + std::string(tiering::BackendKindName(backend_->kind()));
  for (const auto& e : engines_) {
    out += "; profile " + e->profile().Describe() + ", gpu " + std::to_string(e->options().gpu_slots) +
           " blocks, host " + std::to_string(e->options().host_slots) + " blocks";
  }
  return out;
}

void Service::Tick() {
  for (auto& e : engines_) e->Tick();
}

void Service::Poll() {
  for (auto& e : engines_) e->Poll();
}

Status Service::WaitIdle(std::chrono::milliseconds timeout) {
  for (auto& e : engines_) KVTIER_RETURN_IF_ERROR(e->WaitIdle(timeout));
  return Status::Ok();
}

void Service::Disconnect(ClientState& c) {
  if (c.welcomed) {
    Engine& e = *engines_[c.profile];
    for (uint64_t lease : c.leases) (void)e.Release(lease);
    LogInfo("client " + std::to_string(c.id) + " (" + c.name + ", pid " + std::to_string(c.pid) + ") disconnected" +
            (c.leases.empty() ? std::string() : ": ended its " + std::to_string(c.leases.size()) + " leases"));
    --connected_;
  }
  c.leases.clear();
  c.welcomed = false;
}

const std::string& Service::TenantName(uint32_t ns_tag) const {
  static const std::string kUnknown = "?";
  auto it = tenant_names_.find(ns_tag);
  return it == tenant_names_.end() ? kUnknown : it->second;
}

Reply Service::Handle(ClientState& c, const wire::Message& request) {
  ++requests_;
  if (!c.welcomed) {
    if (const auto* hello = std::get_if<wire::Hello>(&request)) return OnHello(c, *hello);
    ++errors_;
    return {Error(FailedPrecondition(std::string("the first frame must be Hello, got ") +
                                     wire::MessageTypeName(wire::TypeOf(request)))),
            true};
  }
  Engine& e = *engines_[c.profile];
  wire::Message reply = std::visit(
      [&](const auto& m) -> wire::Message {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::AllocateRequest>) {
          return OnAllocate(c, m);
        } else if constexpr (std::is_same_v<T, wire::CommitRequest>) {
          return OnCommit(c, m);
        } else if constexpr (std::is_same_v<T, wire::AcquireRequest>) {
          return OnAcquire(c, m);
        } else if constexpr (std::is_same_v<T, wire::ReleaseRequest>) {
          return OnRelease(c, m);
        } else if constexpr (std::is_same_v<T, wire::PrefetchRequest>) {
          auto r = e.Prefetch(m.session);
          if (!r.ok()) return Error(r.status());
          return wire::CountResponse{*r};
        } else if constexpr (std::is_same_v<T, wire::DemoteRequest>) {
          auto r = e.Demote(m.session);
          if (!r.ok()) return Error(r.status());
          return wire::CountResponse{*r};
        } else if constexpr (std::is_same_v<T, wire::EvictRequest>) {
          return OnEvict(c, m);
        } else if constexpr (std::is_same_v<T, wire::SetPriorityRequest>) {
          const Status st = e.SetPriority(m.session, m.priority);
          if (!st.ok()) return Error(st);
          return wire::OkResponse{};
        } else if constexpr (std::is_same_v<T, wire::ListSessionsRequest>) {
          return OnListSessions(c, m);
        } else if constexpr (std::is_same_v<T, wire::SessionInfoRequest>) {
          return OnSessionInfo(c, m);
        } else if constexpr (std::is_same_v<T, wire::StatsRequest>) {
          return OnStats(c);
        } else if constexpr (std::is_same_v<T, wire::ConfigRequest>) {
          return wire::ConfigResponse{DumpConfig(config_)};
        } else if constexpr (std::is_same_v<T, wire::Ping>) {
          return wire::Pong{m.nonce};
        } else if constexpr (std::is_same_v<T, wire::Hello>) {
          return Error(FailedPrecondition("Hello was already received on this connection"));
        } else {
          return Error(InvalidArgument(std::string(wire::MessageTypeName(T::kType)) + " is not a request"));
        }
      },
      request);
  if (std::holds_alternative<wire::ErrorResponse>(reply)) ++errors_;
  return {std::move(reply), false};
}

Reply Service::OnHello(ClientState& c, const wire::Hello& m) {
  if (m.min_version > wire::kProtocolVersion || m.max_version < wire::kProtocolVersion) {
    ++errors_;
    return {Error(Status(StatusCode::kVersionMismatch,
                         "client speaks protocol versions " + std::to_string(m.min_version) + ".." +
                             std::to_string(m.max_version) + ", this kvtierd speaks " +
                             std::to_string(wire::kProtocolVersion))),
            true};
  }
  int profile = 0;
  if (!m.profile.empty()) {
    profile = -1;
    for (size_t i = 0; i < engines_.size(); ++i) {
      if (engines_[i]->profile().name == m.profile) profile = static_cast<int>(i);
    }
    if (profile < 0) {
      ++errors_;
      return {Error(NotFound("no model profile named '" + m.profile + "' (see cachectl config)")), true};
    }
  }
  if (connected_ >= config_.max_clients) {
    ++errors_;
    return {Error(ResourceExhausted("kvtierd serves at most " + std::to_string(config_.max_clients) + " clients")),
            true};
  }
  Engine& e = *engines_[profile];
  c.welcomed = true;
  c.name = m.client_name;
  c.pid = m.pid;
  c.tenant = m.tenant;
  c.profile = profile;
  c.ns = Namespace::Make(e.profile().Fingerprint(), m.tenant);
  tenant_names_[NamespaceTag(c.ns)] = m.tenant;
  ++connected_;

  wire::Welcome w;
  w.version = wire::kProtocolVersion;
  w.instance_id = instance_id_;
  w.client_id = c.id;
  w.profile = e.profile();
  w.ns = c.ns;
  w.backend = tiering::BackendKindName(backend_->kind());
  for (Tier t : {Tier::kGpu, Tier::kHost}) {
    const tiering::PoolHandle h = e.pool(t).Export();
    w.pools.push_back(wire::PoolDesc{t, h.slot_bytes, h.slots, h.shm_name, h.ipc_handle});
  }
  w.index_segment = e.index_segment_name();
  w.fence_segment = backend_->FenceSegmentName();
  w.max_blocks_per_request = config_.max_blocks_per_request;
  w.max_payload = config_.max_frame_bytes;
  LogInfo("client " + std::to_string(c.id) + " connected: " + m.client_name + " (pid " + std::to_string(m.pid) +
          ", tenant '" + m.tenant + "', profile " + e.profile().name + ")");
  return {std::move(w), false};
}

wire::Message Service::OnAllocate(ClientState& c, const wire::AllocateRequest& m) {
  if (c.leases.size() >= config_.max_leases_per_client) {
    return Error(ResourceExhausted("client holds " + std::to_string(c.leases.size()) +
                                   " leases, the limit (limits.max_leases_per_client)"));
  }
  auto r = engines_[c.profile]->Allocate(m.count);
  if (!r.ok()) return Error(r.status());
  c.leases.insert(r->id);
  return wire::AllocateResponse{r->id, std::move(r->slots)};
}

wire::Message Service::OnCommit(ClientState& c, const wire::CommitRequest& m) {
  if (!c.leases.count(m.lease_id)) return Error(NotFound("lease " + std::to_string(m.lease_id) + " is not yours"));
  auto r = engines_[c.profile]->Commit(m.lease_id, m.session, c.ns, m.parent, m.start_block, m.tokens, m.slots);
  if (!r.ok()) return Error(r.status());
  return wire::CommitResponse{r->stored, r->duplicates};
}

wire::Message Service::OnAcquire(ClientState& c, const wire::AcquireRequest& m) {
  if (c.leases.size() >= config_.max_leases_per_client) {
    return Error(ResourceExhausted("client holds " + std::to_string(c.leases.size()) +
                                   " leases, the limit (limits.max_leases_per_client)"));
  }
  auto r = engines_[c.profile]->Acquire(m.session, c.ns, m.keys, m.tokens, (m.flags & wire::kAcquirePromote) != 0);
  if (!r.ok()) return Error(r.status());
  if (r->id != 0) c.leases.insert(r->id);
  wire::AcquireResponse out;
  out.lease_id = r->id;
  out.matched = r->matched;
  out.promoted = r->promoted;
  out.fence = r->fence;
  out.blocks.reserve(r->blocks.size());
  for (const auto& b : r->blocks) out.blocks.push_back(wire::BlockLoc{b.tier, b.slot});
  return out;
}

wire::Message Service::OnRelease(ClientState& c, const wire::ReleaseRequest& m) {
  if (!c.leases.erase(m.lease_id)) return Error(NotFound("lease " + std::to_string(m.lease_id) + " is not yours"));
  const Status st = engines_[c.profile]->Release(m.lease_id);
  if (!st.ok()) return Error(st);
  return wire::OkResponse{};
}

wire::Message Service::OnEvict(ClientState& c, const wire::EvictRequest& m) {
  Engine& e = *engines_[c.profile];
  if (!m.session.empty()) {
    const Status st = e.Evict(m.session);
    if (!st.ok()) return Error(st);
    LogInfo("client " + std::to_string(c.id) + " evicted session '" + m.session + "'");
    return wire::CountResponse{1};
  }
  if (!m.all && m.tenant.empty()) return Error(InvalidArgument("evict needs a session, a tenant or all"));
  uint32_t n = 0;
  for (const tiering::SessionInfo& s : e.ListSessions()) {
    if (m.all || TenantName(s.ns_tag) == m.tenant) n += e.Evict(s.id).ok() ? 1 : 0;
  }
  LogInfo("client " + std::to_string(c.id) + " evicted " + std::to_string(n) + " sessions (" +
          (m.all ? std::string("all") : "tenant '" + m.tenant + "'") + ")");
  return wire::CountResponse{n};
}

wire::SessionSummary Service::Summarize(const tiering::SessionInfo& s) const {
  wire::SessionSummary out;
  out.id = s.id;
  out.tenant = TenantName(s.ns_tag);
  out.priority = s.priority;
  out.last_use_ms_ago = s.idle_ms;
  out.blocks = s.blocks;
  out.gpu_blocks = s.blocks_in[static_cast<int>(Tier::kGpu)];
  out.host_blocks = s.blocks_in[static_cast<int>(Tier::kHost)];
  out.moving = s.moving;
  out.tokens = s.tokens;
  return out;
}

wire::Message Service::OnListSessions(ClientState& c, const wire::ListSessionsRequest& m) {
  wire::ListSessionsResponse out;
  for (const tiering::SessionInfo& s : engines_[c.profile]->ListSessions()) {
    if (!m.tenant_filter.empty() && TenantName(s.ns_tag) != m.tenant_filter) continue;
    out.sessions.push_back(Summarize(s));
    if (out.sessions.size() >= wire::kMaxArray / 4) break;
  }
  return out;
}

wire::Message Service::OnSessionInfo(ClientState& c, const wire::SessionInfoRequest& m) {
  auto r = engines_[c.profile]->GetSession(m.session);
  if (!r.ok()) return Error(r.status());
  wire::SessionInfoResponse out;
  out.summary = Summarize(*r);
  out.chain = r->chain;
  for (Tier t : r->tiers) out.tiers.push_back(static_cast<uint8_t>(t));
  return out;
}

wire::Message Service::OnStats(ClientState& c) {
  wire::StatsResponse out;
  auto add = [&](const std::string& name, double v) { out.values.emplace_back(name, v); };
  add("uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  add("clients", connected_);
  add("requests", static_cast<double>(requests_));
  add("errors", static_cast<double>(errors_));
  const tiering::EngineStats s = engines_[c.profile]->stats();
  add("gpu_slots", s.slots[0]);
  add("gpu_used", s.used[0]);
  add("host_slots", s.slots[1]);
  add("host_used", s.used[1]);
  add("blocks", s.blocks);
  add("sessions", s.sessions);
  add("read_leases", s.read_leases);
  add("write_leases", s.write_leases);
  add("copies_in_flight", s.copies_in_flight);
  add("hit_blocks", static_cast<double>(s.hit_blocks));
  add("miss_blocks", static_cast<double>(s.miss_blocks));
  add("committed_blocks", static_cast<double>(s.committed_blocks));
  add("duplicate_blocks", static_cast<double>(s.duplicate_blocks));
  add("demoted_blocks", static_cast<double>(s.demoted_blocks));
  add("promoted_blocks", static_cast<double>(s.promoted_blocks));
  add("dropped_blocks", static_cast<double>(s.dropped_blocks));
  add("evicted_sessions", static_cast<double>(s.evicted_sessions));
  add("allocation_failures", static_cast<double>(s.allocation_failures));
  return out;
}

}  // namespace kvtier::daemon
