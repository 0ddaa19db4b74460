// Service: kvtierd's state and request handling, apart from any socket.
//
// It owns the backend and the engines (engine_set.h: one per model profile that
// its tenants share, and one per isolated tenant and profile), and turns each decoded
// request of a client into a reply: every message type that is a request has
// one handler, Result<Reply> On(ClientState&, const M&), chosen from the
// message's alternative (Dispatch); any other type is answered "not a request".
// Everything runs on one thread (the event loop); nothing here blocks except
// WaitIdle at shutdown. A failing request gets an ErrorResponse; it never takes
// the daemon or another client down. Building the backend (backend_factory.h),
// warm restart (warm_lifecycle.h) and the figures it reports (stats.h) live apart.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "config/config.h"
#include "events/kv_events.h"
#include "kvtier/stores/store_chain.h"
#include "kvtier/tiering/backend.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/wire.h"
#include "rate_buckets.h"
#include "service/access.h"
#include "service/engine_set.h"
#include "service/stats.h"
#include "service/store_waits.h"
#include "service/tenant_registry.h"
#include "service/warm_lifecycle.h"

namespace kvtier::daemon {

// One connection's state.
struct ClientState {
  uint32_t id = 0;
  bool welcomed = false;
  std::string name;
  uint32_t pid = 0;
  std::string tenant;       // Authenticated at Hello (AccessPolicy::TenantFor).
  PeerCredentials peer;     // From the kernel at accept.
  bool admin = false;       // May act on other tenants, evict all, read the configuration.
  size_t profile = 0;       // Index into the profiles; valid once welcomed.
  size_t engine_index = 0;  // The EngineSet member serving its tenant and profile; valid once welcomed.
  Namespace ns;             // Its tenant's (accounts, sessions).
  ModelId model;            // The identity its Hello gave (null: none); keys are chained in KeyNamespace(ns, model).
  std::unordered_set<uint64_t> leases;
  // Its read leases (among `leases`), each with when its Acquire leased it.
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> reading;
  // Set while an Allocate or Acquire of this client waits for GPU room (the
  // reply is deferred); when it was first deferred.
  std::optional<std::chrono::steady_clock::time_point> waiting_for_room;
  // It used a lease the lease timeout had revoked, and the log said so.
  bool told_lease_expired = false;
  // The Acquire it waits on asked the stores below the host tier for the
  // blocks after its cached prefix (`start` of them): fetch `id`, wanted until
  // `deadline` (stores.fetch_budget_ms). `result` holds it once it came, while
  // the Acquire still waits for GPU room; past the deadline, the prefix it had
  // verified by then (id 0: the rest is a detached fetch's, or cancelled).
  // A SessionInfo waits the same way on the stores saying where the session's
  // dropped blocks are (`located`: the keys asked about).
  struct StoreFetch {
    uint64_t id = 0;
    uint32_t start = 0;
    std::chrono::steady_clock::time_point deadline;
    std::optional<stores::FetchResult> result;
    std::vector<BlockKey> located;
  };
  std::optional<StoreFetch> fetch;
};

// What a request gets.
struct Reply {
  wire::Message message;
  bool close = false;  // Close the connection after sending (a protocol violation).
  // No reply yet: the request waits for GPU room that demotions in flight will
  // free. Handle the same request again after copies completed (Poll, Tick);
  // nothing was changed meanwhile, and `message` is empty.
  bool deferred = false;
  // Descriptors sent with `message` (SCM_RIGHTS, on its first byte): the
  // Welcome's segments. Borrowed: their segments own them and stay open.
  std::vector<int> fds{};

  static Reply Deferred() {
    Reply r;
    r.deferred = true;
    return r;
  }
};

// How long an Allocate or Acquire may wait for demotions to free GPU slots
// before it is answered with what there is (Allocate: drops the coldest
// unleased blocks or fails with resource_exhausted; Acquire: leases the prefix
// without promoting it, its host-tier blocks in the host tier).
inline constexpr std::chrono::milliseconds kRoomWaitLimit{5000};

// What the stores' I/O thread keeps of its block events between two ticks
// (the vllm format's STORAGE medium); past it they are dropped and counted.
inline constexpr size_t kMaxStoreEvents = 16384;

// Leases revoked by limits.lease_timeout_ms are logged at most this often (in
// one line with the counts since the last one).
inline constexpr std::chrono::seconds kExpiredLeaseLogPeriod{10};
// One page of a paged ListSessions holds at most this many sessions, bytes of
// them and chain blocks read to describe them (at least one session, though),
// so building one costs about a millisecond whatever the table holds.
inline constexpr size_t kSessionsPerPage = 4096;
inline constexpr size_t kPageBytes = size_t{4} << 20;
inline constexpr uint64_t kPageChainBlocks = uint64_t{1} << 18;
// An unpaged ListSessions (an older client's) is answered whole or with an
// error, after reading at most this many chain blocks.
inline constexpr uint64_t kUnpagedChainBlocks = uint64_t{1} << 22;

class Service {
 public:
  static Result<std::unique_ptr<Service>> Create(const DaemonConfig& config);
  ~Service();

  // Answers `request`, or defers it (Reply::deferred) while it waits for GPU
  // room; the caller then calls Handle again with the same request after Poll
  // or Tick, and handles no later request of that client meanwhile.
  Reply Handle(ClientState& client, const wire::Message& request);
  // The client is gone: end its leases (uncommitted slots come free).
  void Disconnect(ClientState& client);
  // Applies finished copies, revokes leases held past limits.lease_timeout_ms,
  // expires priorities and enforces watermarks on every engine.
  void Tick();
  void Poll();
  // `wake` is called (from another thread) when something a deferred request
  // waits for came (a store's fetch): the caller then handles deferred
  // requests again. Set it before serving; nullptr before the Service goes.
  void SetWakeup(std::function<void()> wake);
  // Copies are running on some engine (the host backend's copy thread then
  // needs the CPU more than a busy-polling event loop does).
  bool CopiesInFlight() const;
  Status WaitIdle(std::chrono::milliseconds timeout);
  // With warm_restart: demotes what fits from the GPU tier to the host tier,
  // waits up to `budget` for the copies, and writes each profile's manifest
  // (clean). Call at shutdown, after the clients are gone.
  void SaveForRestart(std::chrono::milliseconds budget);
  // Without warm restart, with a write-back store: demotes what fits to the
  // host tier and offers the host tier's blocks to the write-back stores,
  // writing them for at most `budget` (what a restart then finds there).
  // Call at shutdown, after SaveForRestart.
  void SpillForRestart(std::chrono::milliseconds budget);

  // Metrics the server measures: a request of `type` was answered `took` after
  // its frame was decoded (reply encoded and queued); a frame did not decode.
  void ObserveRequest(wire::MessageType type, std::chrono::steady_clock::duration took);
  void CountBadFrame() { ++counters_.bad_frames; }
  void CountRefused() { ++counters_.refused_connections; }
  void CountOverLimit() { ++counters_.connections_over_limit; }
  void CountTooFast() { ++counters_.connections_too_fast; }
  const AccessPolicy& access() const { return access_; }
  void CountReload(bool applied) { ++(applied ? counters_.reloads_applied : counters_.reloads_rejected); }

  // Runs with `next` from now on: PlanReload(config(), loaded).next, which
  // differs from config() in reloadable settings only. The engines take the new
  // watermarks, copy batch and lease timeout, all or none (they check them
  // alike). The log level is the
  // caller's to set (after it logged the reload).
  Status Reconfigure(const DaemonConfig& next);

  // Every metric in the Prometheus text format (GET /metrics).
  std::string RenderMetrics() const;
  // "serving 3 clients, gpu 41% host 7%", for systemd's STATUS=.
  std::string StatusLine() const;

  tiering::Backend& backend() { return *backend_; }
  const DaemonConfig& config() const { return config_; }
  uint64_t instance_id() const { return instance_id_; }
  uint32_t NextClientId() { return ++last_client_id_; }
  size_t profile_count() const { return engines_.profiles(); }
  // Every engine; engines().Of(profile, tenant) is the one serving `tenant`.
  const EngineSet& engines() const { return engines_; }
  // A human summary for the start-up log.
  std::string Describe() const;

 private:
  Service(DaemonConfig config, std::unique_ptr<tiering::Backend> backend);

  // Finds the handler of `request`'s type; turns its error into an
  // ErrorResponse, which closes the connection of a client not welcomed (yet).
  Reply Dispatch(ClientState& c, const wire::Message& request);
  // Every reply is sized before it is sent: one that would not fit one frame
  // (those that grow with what the daemon holds: sessions, chains, tenants,
  // the configuration) becomes an ErrorResponse (resource_exhausted) saying
  // so, never a frame the client rejects.
  static void FitOneFrame(Reply& reply);

  // The handlers. REQUIRES: c.welcomed, except for Hello. Each returns the
  // reply, a deferral (Reply::deferred) or the error to answer with.
  Result<Reply> On(ClientState& c, const wire::Hello& m);
  Result<Reply> On(ClientState& c, const wire::Ping& m);
  // Allocate and Acquire defer while demotions free GPU room (kRoomWaitLimit).
  Result<Reply> On(ClientState& c, const wire::AllocateRequest& m);
  Result<Reply> On(ClientState& c, const wire::CommitRequest& m);
  Result<Reply> On(ClientState& c, const wire::SaveRequest& m);  // A commit and the lease's next slots.
  Result<Reply> On(ClientState& c, const wire::AcquireRequest& m);
  Result<Reply> Acquire(ClientState& c, const wire::AcquireRequest& m);  // On(AcquireRequest), before its counting.
  Result<Reply> On(ClientState& c, const wire::ReleaseRequest& m);
  Result<Reply> On(ClientState& c, const wire::PrefetchRequest& m);
  Result<Reply> On(ClientState& c, const wire::DemoteRequest& m);
  Result<Reply> On(ClientState& c, const wire::EvictRequest& m);
  Result<Reply> On(ClientState& c, const wire::EndSessionRequest& m);
  Result<Reply> On(ClientState& c, const wire::SetPriorityRequest& m);
  Result<Reply> On(ClientState& c, const wire::ListSessionsRequest& m);
  Result<Reply> On(ClientState& c, const wire::SessionInfoRequest& m);
  Result<Reply> On(ClientState& c, const wire::StatsRequest& m);
  Result<Reply> On(ClientState& c, const wire::ConfigRequest& m);
  // Every other message type is a reply, which no client sends. A request
  // without its On above matches nothing: it does not compile.
  template <typename M>
  requires(!wire::kIsRequest<M>) Result<Reply> On(ClientState&, const M&) {
    return InvalidArgument(std::string(M::kName) + " is not a request");
  }

  // True (and the wait starts or goes on) if the client may still wait for room.
  bool MayWaitForRoom(ClientState& c);
  // Logs the leases the ticks revoked, at most once per kExpiredLeaseLogPeriod.
  void LogExpiredLeases();
  // Logs, once per client, that it `use`d ("committed") a lease that had expired.
  void NoteExpiredLease(ClientState& c, uint64_t lease, const char* use);
  wire::SessionSummary Summarize(const tiering::SessionInfo& s) const;
  // The client's own tenant, and tenant `name` in engine `e`'s profile.
  static tiering::Tenant TenantOf(const ClientState& c);
  // A watch on the GPU event a request carries (none without one); the error
  // names the request.
  // A commit's or save's checks before the engine: the lease is the client's,
  // and the writer's event watched (counted when the cuda backend gets none).
  Result<tiering::GpuWork> CommitWriter(const ClientState& c, uint64_t lease_id,
                                        const std::optional<wire::IpcEventHandle>& event, const char* what);
  Result<tiering::GpuWork> WatchClientWork(const ClientState& c, const std::optional<wire::IpcEventHandle>& event,
                                           const char* request);
  static tiering::Tenant TenantNamed(const std::string& name, const tiering::Engine& e);
  // The tenant named by `wanted` (empty: the client's own); kPermissionDenied
  // for another tenant unless the client is an admin.
  Result<std::string> TenantToActOn(const ClientState& c, const std::string& wanted, const char* what) const;
  std::vector<std::string> KnownTenants() const;
  // No engine holds a session or a block of tenant `name`: its label may be forgotten.
  bool TenantIdle(const std::string& name) const;
  // What the figures are read from, reporting the tenants in `tenants`.
  StatsView View(std::vector<std::string> tenants) const;

  // Closes the open KV event batch (events.enabled): at every tick.
  void FlushEvents();
  // The stores' figures (empty without stores).
  std::vector<stores::StoreStats> StoreStatsNow() const;

  // The engine serving client `c` (its tenant's, in its profile).
  tiering::Engine& EngineOf(const ClientState& c) { return *engines_[c.engine_index].engine; }

  DaemonConfig config_;
  std::unique_ptr<tiering::Backend> backend_;
  // Before the engines, whose on_spill offers it blocks; after them at
  // destruction (~Service), so that it writes what they offered last.
  std::unique_ptr<stores::StoreChain> stores_;
  std::unique_ptr<EventPublisher> events_;  // KV events (events.enabled); outlives the engines.
  std::mutex wake_mu_;
  std::function<void()> wake_;  // Guarded by wake_mu_.
  EngineSet engines_;
  WarmLifecycle warm_;
  uint64_t instance_id_ = 0;
  uint32_t last_client_id_ = 0;
  AccessPolicy access_;
  TenantRegistry tenants_;  // The configured tenants and the labels of clients (limits.max_tenants).
  ServiceCounters counters_;
  StoreWaits store_waits_{config_, counters_};  // Requests waiting for stores_ (attached once opened).
  // Leases revoked since the last log line about them.
  struct ExpiredLeaseLog {
    uint64_t write = 0, read = 0, slots = 0;
    std::optional<std::chrono::steady_clock::time_point> logged;  // The last line.
  } lease_log_;
};

}  // namespace kvtier::daemon
