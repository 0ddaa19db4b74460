// Service: the engines and the clients, one handler per request type (service.h).
#include "service/service.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <type_traits>
#include <utility>

#include "log.h"
#include "service/backend_factory.h"
#include "stores/store_factory.h"

namespace kvtier::daemon {

using tiering::Engine;
using kvtier::Tier;

Result<std::unique_ptr<Service>> Service::Create(const DaemonConfig& config) {
  auto backend = CreateBackend(config);
  if (!backend.ok()) return backend.status();
  std::unique_ptr<Service> svc(new Service(config, std::move(backend).value()));
  Service* raw = svc.get();
  // The stores say what they learnt of their blocks only for the vllm format's STORAGE medium.
  const bool storage_events = config.events.enabled && config.events.format == "vllm";
  auto opened = OpenStores(
      config.stores,
      [raw] {
        std::lock_guard<std::mutex> lock(raw->wake_mu_);
        if (raw->wake_) raw->wake_();
      },
      storage_events ? kMaxStoreEvents : 0);
  if (!opened.ok()) return opened.status();
  svc->stores_ = std::move(opened).value();
  svc->store_waits_.Attach(svc->stores_.get());
  if (config.events.enabled) {
    auto events = EventPublisher::Start(config.events, EventsPublishEndpoint(config.events, config.socket_path),
                                        EventsReplayEndpoint(config.events, config.socket_path), config.access,
                                        svc->instance_id_);
    if (!events.ok()) return events.status();
    svc->events_ = std::move(events).value();
  }
  KVTIER_RETURN_IF_ERROR(
      BuildEngines(config, *svc->backend_, EngineWiring{svc->stores_.get(), svc->events_.get(), svc->warm_},
                   svc->engines_));
  svc->FlushEvents();  // The stream's first batch ("cleared", and what a warm restart took back) before any client.
  return svc;
}

Service::Service(DaemonConfig config, std::unique_ptr<tiering::Backend> backend)
    : config_(std::move(config)),
      backend_(std::move(backend)),
      warm_(config_, backend_->kind()),
      access_(config_, ::geteuid()),
      tenants_(config_.tenants) {
  std::random_device rd;
  instance_id_ = (uint64_t{rd()} << 32) | rd();
}

Service::~Service() {
  engines_.Clear();  // Engines before the backend they use, and the stores and events they report to.
  events_.reset();
  stores_.reset();   // Writes what is queued (for a bounded time).
  backend_.reset();
}

void Service::SetWakeup(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  wake_ = std::move(wake);
}

std::vector<stores::StoreStats> Service::StoreStatsNow() const {
  return stores_ != nullptr ? stores_->stats() : std::vector<stores::StoreStats>{};
}

std::string Service::Describe() const {
  std::string out = "backend " + std::string(tiering::BackendKindName(backend_->kind()));
  for (const EngineMember& m : engines_) {
    const Engine& e = *m.engine;
    out += m.tenant.empty() ? "; profile " + e.profile().Describe() + ", gpu "
                            : "; isolated tenant '" + m.tenant + "' of profile '" + e.profile().name + "', gpu ";
    out +=
        std::to_string(e.options().gpu_slots) + " blocks, host " + std::to_string(e.options().host_slots) + " blocks";
  }
  const uint32_t per_tenant = SessionsPerTenant(config_);
  out += "; at most " + std::to_string(config_.engine_limits.max_sessions) + " sessions per profile, " +
         (per_tenant == 0 ? std::string("shared fairly between tenants") : std::to_string(per_tenant) + " per tenant");
  if (config_.tenants.empty()) out += "; at most " + std::to_string(config_.max_tenants) + " tenant labels";
  if (stores_ != nullptr) {
    out += "; stores below the host tier:";
    for (const stores::StoreStats& s : stores_->stats()) {
      out += " " + s.description + (s.write_through ? " (write-through)," : " (write-back),");
    }
    out.pop_back();
    const stores::RecordKey* key = stores_->record_key();
    out += key != nullptr ? "; records signed with HMAC-SHA-256, key id " + key->IdHex() + " (stores.record_key_file)"
                          : "; records unsigned (no stores.record_key_file): whoever writes to a store can forge them";
  }
  if (events_ != nullptr) {
    out += "; KV events on " + events_->publish_endpoint() + " (replays: " + events_->replay_endpoint() +
           "; helper process " + std::to_string(events_->helper_pid()) + ")";
  }
  return out;
}

void Service::Tick() {
  for (EngineMember& m : engines_) {
    const tiering::LeaseExpiry expired = m.engine->Tick();
    lease_log_.write += expired.write;
    lease_log_.read += expired.read;
    lease_log_.slots += expired.slots;
  }
  LogExpiredLeases();
  store_waits_.LandDetached(engines_);
  if (stores_ != nullptr && events_ != nullptr) {
    for (const stores::StoreEvent& e : stores_->TakeEvents()) events_->AddStorage(e);
  }
  FlushLimitedLogs();
  warm_.MaybeSnapshot(engines_, config_);
  // One batch per tick (tick_ms) of what changed since (or sooner, at events.max_batch_events).
  FlushEvents();
}

void Service::LogExpiredLeases() {
  ExpiredLeaseLog& l = lease_log_;
  if (l.write + l.read == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (l.logged && now - *l.logged < kExpiredLeaseLogPeriod) return;
  l.logged = now;
  auto count = [](uint64_t n, const char* what) {
    return std::to_string(n) + " " + what + " lease" + (n == 1 ? "" : "s");
  };
  LogWarn("revoked " + count(l.write, "write") + " (" + std::to_string(l.slots) + " gpu slots back to the pool) and " +
          count(l.read, "read") + " held longer than limits.lease_timeout_ms (" +
          std::to_string(config_.engine.lease_timeout.count()) + " ms); at most one such line every " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kExpiredLeaseLogPeriod).count()) + " s");
  l.write = l.read = l.slots = 0;
}

void Service::NoteExpiredLease(ClientState& c, uint64_t lease, const char* use) {
  if (c.told_lease_expired) return;  // Once per client.
  c.told_lease_expired = true;
  LogWarn("client " + std::to_string(c.id) + " (" + c.name + ", pid " + std::to_string(c.pid) + ", tenant '" +
          c.tenant + "') " + use + " lease " + std::to_string(lease) +
          ", which had expired (limits.lease_timeout_ms: " + std::to_string(config_.engine.lease_timeout.count()) +
          " ms); further ones of this client are not logged");
}

void Service::SaveForRestart(std::chrono::milliseconds budget) { warm_.SaveAtShutdown(engines_, config_, budget); }

void Service::SpillForRestart(std::chrono::milliseconds budget) {
  if (stores_ == nullptr || warm_.enabled()) return;
  bool write_back = false;
  for (const StoreTierConfig& t : config_.stores.tiers) write_back |= !t.write_through;
  if (!write_back) return;
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + budget;
  for (EngineMember& m : engines_) m.engine->DemoteForShutdown();
  for (EngineMember& m : engines_) (void)m.engine->WaitIdle(budget / 2);
  stores_->WaitForRoomUntil(until);
  uint32_t offered = 0;
  for (EngineMember& m : engines_) offered += m.engine->SpillHostTier();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  stores_->set_drain(std::max(left, std::chrono::milliseconds(100)));
  if (offered == 0) return;
  LogInfo("stores: offered " + std::to_string(offered) + " host-tier blocks to the write-back stores at shutdown (" +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count()) +
          " ms); writing what is queued for at most " + std::to_string(std::max<int64_t>(left.count(), 100)) + " ms");
}

void Service::Poll() {
  for (EngineMember& m : engines_) m.engine->Poll();
}

bool Service::CopiesInFlight() const {
  for (const EngineMember& m : engines_) {
    if (m.engine->CopiesInFlight()) return true;
  }
  return false;
}

Status Service::WaitIdle(std::chrono::milliseconds timeout) {
  for (EngineMember& m : engines_) KVTIER_RETURN_IF_ERROR(m.engine->WaitIdle(timeout));
  return Status::Ok();
}

void Service::Disconnect(ClientState& c) {
  if (c.welcomed) {
    Engine& e = EngineOf(c);
    for (uint64_t lease : c.leases) (void)e.Release(lease);
    // Blocks it committed while its GPU was still writing them are lost with it.
    if (const uint32_t dropped = e.ClientGone(c.id); dropped > 0) {
      LogWarn("client " + std::to_string(c.id) + " (" + c.name + ", pid " + std::to_string(c.pid) +
              ") went before its GPU finished writing " + std::to_string(dropped) +
              " committed blocks: dropped (never served)");
    }
    LogInfo("client " + std::to_string(c.id) + " (" + c.name + ", pid " + std::to_string(c.pid) + ") disconnected" +
            (c.leases.empty() ? std::string() : ": ended its " + std::to_string(c.leases.size()) + " leases"));
    --counters_.clients;
    tenants_.traffic(c.tenant, c.profile).read_errors += c.reading.size();
    tenants_.Disconnect(c.tenant);
    backend_->ForgetClient(c.id);  // Its events, each closed with its last watch.
  }
  store_waits_.Cancel(c);
  c.leases.clear();
  c.reading.clear();
  c.welcomed = false;
}

tiering::Tenant Service::TenantOf(const ClientState& c) { return tiering::Tenant{c.ns, c.tenant, c.model}; }

Result<tiering::GpuWork> Service::WatchClientWork(const ClientState& c,
                                                  const std::optional<wire::IpcEventHandle>& event,
                                                  const char* request) {
  if (!event) return tiering::GpuWork{};
  auto watch = backend_->WatchClientEvent(c.id, *event);
  if (!watch.ok()) return Status(watch.status().code(), std::string(request) + ": " + watch.status().message());
  return tiering::GpuWork{*watch, c.id};
}

tiering::Tenant Service::TenantNamed(const std::string& name, const Engine& e) {
  return tiering::Tenant::Make(e.profile().Fingerprint(), name);
}

Result<std::string> Service::TenantToActOn(const ClientState& c, const std::string& wanted, const char* what) const {
  if (wanted.empty() || wanted == c.tenant) return c.tenant;
  if (!c.admin) {
    return Status(StatusCode::kPermissionDenied, std::string(what) + " of tenant '" + wanted + "': client of tenant '" +
                                                     c.tenant + "' (" + c.peer.Describe() + ") is not an admin");
  }
  return wanted;
}

std::vector<std::string> Service::KnownTenants() const { return tenants_.Names(); }

bool Service::TenantIdle(const std::string& name) const {
  for (const EngineMember& m : engines_) {
    const tiering::TenantUsage u = m.engine->tenant_usage(TenantNamed(name, *m.engine).ns);
    if (u.sessions != 0) return false;
    for (Tier t : kTiers) {
      if (u.blocks[t] != 0) return false;
    }
  }
  return true;
}

// Every reply is sized (a counting pass, no copy: well under a microsecond for
// the common ones), so no reply type that grows with what the daemon holds can
// be forgotten.
void Service::FitOneFrame(Reply& reply) {
  const Result<size_t> bytes = wire::PayloadSize(reply.message);
  if (bytes.ok() && *bytes <= wire::kMaxPayload) return;
  const std::string name = wire::MessageTypeName(wire::TypeOf(reply.message));
  reply.message =
      wire::FromStatus(bytes.ok() ? ResourceExhausted(name + " of " + std::to_string(*bytes) +
                                                      " bytes would exceed the " + std::to_string(wire::kMaxPayload) +
                                                      "-byte frame limit; kvtierd answers this "
                                                      "error instead of a frame no client accepts")
                                  : Status(bytes.status().code(),
                                           "kvtierd could not encode its " + name + ": " + bytes.status().message()));
}

Reply Service::Handle(ClientState& c, const wire::Message& request) {
  Reply reply = Dispatch(c, request);
  if (reply.deferred) return reply;
  FitOneFrame(reply);
  c.waiting_for_room.reset();
  ++counters_.requests;
  if (std::holds_alternative<wire::ErrorResponse>(reply.message)) {
    ++counters_.errors;
    ++counters_.per_type[wire::TypeOf(request)].errors;
  }
  return reply;
}

void Service::ObserveRequest(wire::MessageType type, std::chrono::steady_clock::duration took) {
  counters_.per_type[type].latency.Observe(std::chrono::duration<double>(took).count());
}

Reply Service::Dispatch(ClientState& c, const wire::Message& request) {
  Result<Reply> reply = std::visit(
      [&](const auto& m) -> Result<Reply> {
        using M = std::decay_t<decltype(m)>;
        if (!c.welcomed && !std::is_same_v<M, wire::Hello>) {
          return FailedPrecondition(std::string("the first frame must be Hello, got ") + M::kName);
        }
        return On(c, m);
      },
      request);
  if (reply.ok()) return std::move(reply).value();
  // Before a Hello succeeded, any error ends the connection.
  return {wire::FromStatus(reply.status()), /*close=*/!c.welcomed};
}

bool Service::MayWaitForRoom(ClientState& c) {
  const auto now = std::chrono::steady_clock::now();
  if (!c.waiting_for_room) {
    c.waiting_for_room = now;
    ++counters_.room_waits;
    return true;
  }
  if (now - *c.waiting_for_room < kRoomWaitLimit) return true;
  ++counters_.room_wait_timeouts;
  return false;
}

Result<Reply> Service::On(ClientState&, const wire::Ping& m) { return Reply{wire::Pong{m.nonce}}; }

Result<Reply> Service::On(ClientState& c, const wire::PrefetchRequest& m) {
  auto r = EngineOf(c).Prefetch(TenantOf(c), m.session);
  if (!r.ok()) return r.status();
  return Reply{wire::CountResponse{*r}};
}

Result<Reply> Service::On(ClientState& c, const wire::DemoteRequest& m) {
  auto r = EngineOf(c).Demote(TenantOf(c), m.session);
  if (!r.ok()) return r.status();
  return Reply{wire::CountResponse{*r}};
}

Result<Reply> Service::On(ClientState& c, const wire::StatsRequest&) {
  // A client that is not an admin sees its own tenant's figures only.
  std::vector<std::string> tenants;
  for (const std::string& t : KnownTenants()) {
    if (c.admin || t == c.tenant) tenants.push_back(t);
  }
  return Reply{wire::StatsResponse{StatsList(View(std::move(tenants)), c.profile)}};
}

Result<Reply> Service::On(ClientState& c, const wire::ConfigRequest&) {
  if (!c.admin) {
    return Status(StatusCode::kPermissionDenied,
                  "the configuration is for admins (access.admin_users / admin_groups); " + c.peer.Describe() +
                      " is not an admin");
  }
  return Reply{wire::ConfigResponse{DumpConfig(config_)}};
}

Status Service::Reconfigure(const DaemonConfig& next) {
  // Retune checks first and changes nothing on an error; the engine's
  // settings are alike for every engine, so the first one's answer is every one's.
  for (EngineMember& m : engines_) KVTIER_RETURN_IF_ERROR(m.engine->Retune(next.engine));
  config_ = next;
  return Status::Ok();
}

std::string Service::StatusLine() const {
  PerTier<uint64_t> slots, used;
  for (const EngineMember& m : engines_) {
    const tiering::EngineStats s = m.engine->stats();
    for (Tier t : kTiers) {
      slots[t] += s.slots[t];
      used[t] += s.used[t];
    }
  }
  auto percent = [&](Tier t) { return std::to_string(slots[t] == 0 ? 0 : (100 * used[t] + slots[t] / 2) / slots[t]); };
  return "serving " + std::to_string(counters_.clients) + (counters_.clients == 1 ? " client" : " clients") + ", gpu " +
         percent(Tier::kGpu) + "% host " + percent(Tier::kHost) + "%";
}

StatsView Service::View(std::vector<std::string> tenants) const {
  StatsView v(counters_, *backend_, engines_, std::move(tenants), access_, StoreStatsNow());
  v.registry = &tenants_;
  if (events_ != nullptr) {
    const EventCounters& c = events_->counters();
    v.events = EventStats{c.events.load(),
                          c.batches.load(),
                          c.dropped_batches.load(),
                          c.replays.load(),
                          c.last_seq.load(),
                          c.replays_refused.load(),
                          stores_ != nullptr ? stores_->dropped_events() : 0,
                          c.storage_forgotten.load(),
                          c.helper_restarts.load()};
  }
  return v;
}

void Service::FlushEvents() {
  if (events_ != nullptr) events_->Flush();
}

std::string Service::RenderMetrics() const { return RenderPrometheus(View(KnownTenants())); }

}  // namespace kvtier::daemon
