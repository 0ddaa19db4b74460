// Stats: every figure kvtierd reports, in one table that drives both outputs.
//
// A row of the table is one figure: its name in cachectl's list (StatsResponse:
// "demoted_blocks", "gpu_slots"), its Prometheus family and the label it adds
// there (kvtier_moved_blocks_total{direction="gpu_to_host"}), the family's type
// and help, what it is reported over (the daemon, each profile, each tier, ...)
// and how to read it. Either name may be absent: some figures are for one
// output only (Prometheus has the latency histograms, cachectl the percentiles
// estimated from them). Adding a figure is adding a row.
//
// Order: cachectl lists the rows in table order; consecutive rows reported over
// the same tiers, tenants or copy directions are listed point by point
// ("gpu_slots gpu_used host_slots host_used"). Prometheus writes each family
// once, where its first row stands, with one sample per profile (then tenant,
// tier, direction or request type) and row.
//
// Not thread-safe: the counters, the engines and the renderings all belong to
// the event-loop thread, so no sample ever races engine state.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/stores/store_chain.h"
#include "kvtier/tier.h"
#include "kvtier/tiering/backend.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/wire.h"
#include "service/access.h"
#include "service/engine_set.h"
#include "service/prometheus.h"
#include "service/tenant_registry.h"

namespace kvtier::daemon {

// Latency and errors of one request type (measured by the server, from a
// decoded frame to its reply queued).
struct RequestMetrics {
  Histogram latency{LatencyBuckets()};
  uint64_t errors = 0;
};

// What the Service counts itself; the engines and the backend count the rest.
struct ServiceCounters {
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  uint32_t clients = 0;              // Connected now (after Hello).
  uint64_t connections = 0;          // Clients welcomed since start.
  uint64_t requests = 0;             // Requests answered.
  uint64_t errors = 0;               // Of those, answered with an ErrorResponse.
  uint64_t room_waits = 0;           // Requests deferred for GPU room.
  uint64_t room_wait_timeouts = 0;   // Of those, answered after kRoomWaitLimit without it.
  uint64_t store_fetches = 0;        // Acquires that asked the stores below the host tier.
  uint64_t store_fetch_timeouts = 0;  // Of those, answered with what had come after stores.fetch_budget_ms.
  uint64_t store_fetch_throttled_blocks = 0;  // Not asked of the stores: past the tenant's fetch budget.
  uint64_t store_fetch_ready_blocks = 0;  // Blocks those answers took: the prefix verified by the budget.
  uint64_t store_fetched_blocks = 0;  // Verified blocks the fetches brought (the engines imported those that fit).
  uint64_t store_fetches_landed = 0;       // Of the timed-out ones, fetches that came later and were placed.
  uint64_t store_fetch_landed_blocks = 0;  // Blocks those placed into their sessions.
  // Commits on the cuda backend without a writer event: nothing orders their
  // blocks' demotions after the worker's GPU writes.
  uint64_t gpu_commits_without_writer_event = 0;
  uint64_t bad_frames = 0;           // Frames that did not decode.
  uint64_t refused_connections = 0;  // Peers refused at accept (access:).
  uint64_t connections_over_limit = 0;  // Closed at accept: max_clients + kConnectionsBeforeHello were open.
  uint64_t connections_too_fast = 0;    // Closed at accept: their uid passed limits.connects_per_second.
  uint64_t reloads_applied = 0;
  uint64_t reloads_rejected = 0;
  std::map<wire::MessageType, RequestMetrics> per_type;  // Request types answered so far.
};

// Everything a row reads, gathered for one rendering.
// The KV event stream's figures (EventPublisher's counters; all 0 when off).
struct EventStats {
  uint64_t events = 0, batches = 0, dropped_batches = 0, replays = 0, last_seq = 0, replays_refused = 0;
  // The vllm format's STORAGE medium: store events the stores' I/O thread had
  // no room to keep, and blocks forgotten past EventPublisher::kMaxStorageBlocks.
  uint64_t storage_dropped = 0, storage_forgotten = 0;
  uint64_t helper_restarts = 0;  // Events helper processes started after the first.
};

struct StatsView {
  // Reads every engine's stats() once. REQUIRES: the references outlive the view.
  StatsView(const ServiceCounters& counters, const tiering::Backend& backend, const EngineSet& engines,
            std::vector<std::string> tenants, const AccessPolicy& access, std::vector<stores::StoreStats> stores = {});

  const ServiceCounters& counters;
  const tiering::Backend& backend;
  const EngineSet& engines;
  // engine_stats[p]: profile p's figures, over all its engines (the shared
  // one and the isolated tenants'): counts and slots add up, the oldest
  // lease's age is the oldest of all.
  std::vector<tiering::EngineStats> engine_stats;
  std::vector<std::string> tenants;                // The tenants whose figures are reported.
  const AccessPolicy& access;                      // Their quotas.
  std::vector<stores::StoreStats> stores;          // The stores below the host tier, in chain order.
  std::vector<std::string> store_names;            // Theirs in names and labels (StoreNames).
  EventStats events;
  const TenantRegistry* registry = nullptr;       // The tenants' traffic (TenantTraffic); none: not reported.
};

// What a row is reported over: one figure, or one per point of these dimensions.
enum class StatScope : uint8_t {
  kDaemon,       // One figure.
  kBuild,        // One figure labelled with kvtierd's version and backend.
  kProfile,      // Per profile (label profile).
  kProfileTier,  // Per profile and tier (profile, tier); the name holds "{tier}".
  kTenantTier,   // Per profile, tenant and tier (profile, tenant, tier); "{tenant}", "{tier}". Its engine's.
  kTenant,       // Per profile and tenant (profile, tenant); the name holds "{tenant}". Its engine's.
  kDirection,    // Per copy direction, for the backend's copy engine (direction); "{direction}".
  kRequestType,  // Per request type answered so far (type).
  kStore,        // Per store below the host tier (store); the name holds "{store}".
  // Per store and each counter the store keeps itself (BlockStore::Counters:
  // reconnects, held_bytes, ...): store, kind, counter; "{store}", "{counter}".
  kStoreCounter,
};

// Where one figure is read: which profile, tier, tenant, direction or request
// type, as far as the row's scope has them.
struct StatPoint {
  size_t profile = 0;
  Tier tier = Tier::kGpu;
  const std::string* tenant = nullptr;
  CopyDirection direction = CopyDirection::kGpuToHost;
  wire::MessageType type{};
  size_t store = 0;
  size_t counter = 0;  // Into stores[store].counters.
};

struct StatRow {
  const char* name;    // In cachectl's list; nullptr: Prometheus only.
  const char* family;  // Prometheus family; nullptr: cachectl only.
  Exposition::Type type;
  const char* help;  // The family's HELP (on its first row); for cachectl-only rows, what it counts.
  StatScope scope;   // Every row of a family has the same scope.
  std::pair<const char*, const char*> label;  // A label the row adds in its family; {nullptr, nullptr}: none.
  // The figure at `at`; nullopt: none there (a tenant without a quota). Null for histograms.
  std::optional<double> (*value)(const StatsView& view, const StatPoint& at);
  // A kHistogram row's histogram at `at`; null for every other row.
  const Histogram* (*histogram)(const StatsView& view, const StatPoint& at) = nullptr;
};

// The table, in cachectl's order.
std::span<const StatRow> StatsTable();

// cachectl's list for a client of profile `profile`: every row with a name, for
// that profile and the view's tenants (the name's placeholders filled in, an
// empty tenant written "-").
std::vector<std::pair<std::string, double>> StatsList(const StatsView& view, size_t profile);

// Every family in the Prometheus text exposition format (GET /metrics).
std::string RenderPrometheus(const StatsView& view);

}  // namespace kvtier::daemon
