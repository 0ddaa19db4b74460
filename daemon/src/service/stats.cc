// Rendering the stats table (stats_table.cc) for cachectl and for Prometheus (stats.h).
#include "service/stats.h"

#include <algorithm>
#include <cstring>

#include "stores/store_factory.h"

namespace kvtier::daemon {
namespace {

using Type = Exposition::Type;
using Value = std::optional<double>;

constexpr CopyDirection kDirections[] = {CopyDirection::kGpuToHost, CopyDirection::kHostToGpu};

using S = StatScope;

const char* DirectionName(CopyDirection d) { return d == CopyDirection::kGpuToHost ? "gpu_to_host" : "host_to_gpu"; }

// One profile's figures over its engines.
void Accumulate(tiering::EngineStats& sum, const tiering::EngineStats& s) {
  for (Tier t : kTiers) {
    sum.slots[t] += s.slots[t];
    sum.used[t] += s.used[t];
  }
  sum.blocks += s.blocks;
  sum.sessions += s.sessions;
  sum.read_leases += s.read_leases;
  sum.write_leases += s.write_leases;
  sum.leased_slots += s.leased_slots;
  sum.oldest_lease_ms = std::max(sum.oldest_lease_ms, s.oldest_lease_ms);
  sum.copies_in_flight += s.copies_in_flight;
  sum.hit_blocks += s.hit_blocks;
  for (Tier t : kTiers) sum.hit_blocks_in[t] += s.hit_blocks_in[t];
  sum.miss_blocks += s.miss_blocks;
  sum.committed_blocks += s.committed_blocks;
  sum.duplicate_blocks += s.duplicate_blocks;
  sum.demoted_blocks += s.demoted_blocks;
  sum.promoted_blocks += s.promoted_blocks;
  sum.dropped_blocks += s.dropped_blocks;
  sum.evicted_sessions += s.evicted_sessions;
  sum.ended_sessions += s.ended_sessions;
  sum.allocation_failures += s.allocation_failures;
  sum.share_limited += s.share_limited;
  sum.expired_priorities += s.expired_priorities;
  sum.expired_write_leases += s.expired_write_leases;
  sum.expired_read_leases += s.expired_read_leases;
  sum.gpu_work_pending += s.gpu_work_pending;
  sum.expired_gpu_work += s.expired_gpu_work;
  sum.unfinished_writes_dropped += s.unfinished_writes_dropped;
  sum.imported_blocks += s.imported_blocks;
  sum.spilled_blocks += s.spilled_blocks;
  sum.after_read_promotions += s.after_read_promotions;
  sum.after_read_given_up += s.after_read_given_up;
  sum.warm_adopted_blocks += s.warm_adopted_blocks;
  sum.warm_dropped_blocks += s.warm_dropped_blocks;
  sum.warm_adopted_sessions += s.warm_adopted_sessions;
  sum.warm_snapshots += s.warm_snapshots;
}

// ---- Rendering ----

bool PerProfile(StatScope s) {
  return s == S::kProfile || s == S::kProfileTier || s == S::kTenantTier || s == S::kTenant;
}

// The points of `scope` within profile `profile`, in the order they are listed.
std::vector<StatPoint> Points(const StatsView& v, StatScope scope, size_t profile) {
  std::vector<StatPoint> out;
  StatPoint at;
  at.profile = profile;
  // `at` once per value of one of its fields.
  auto each = [&](auto field, const auto& values) {
    for (const auto& value : values) {
      at.*field = value;
      out.push_back(at);
    }
  };
  switch (scope) {
    case S::kDaemon:
    case S::kBuild:
    case S::kProfile:
      out.push_back(at);
      break;
    case S::kProfileTier:
      each(&StatPoint::tier, kTiers);
      break;
    case S::kTenantTier:
      for (const std::string& tenant : v.tenants) {
        at.tenant = &tenant;
        each(&StatPoint::tier, kTiers);
      }
      break;
    case S::kTenant:
      for (const std::string& tenant : v.tenants) {
        at.tenant = &tenant;
        out.push_back(at);
      }
      break;
    case S::kDirection:
      each(&StatPoint::direction, kDirections);
      break;
    case S::kRequestType:
      for (const auto& [type, m] : v.counters.per_type) {
        at.type = type;
        out.push_back(at);
      }
      break;
    case S::kStore:
      for (size_t i = 0; i < v.stores.size(); ++i) {
        at.store = i;
        out.push_back(at);
      }
      break;
    case S::kStoreCounter:
      for (size_t i = 0; i < v.stores.size(); ++i) {
        at.store = i;
        for (size_t k = 0; k < v.stores[i].counters.size(); ++k) {
          at.counter = k;
          out.push_back(at);
        }
      }
      break;
  }
  return out;
}

void Replace(std::string& s, std::string_view placeholder, std::string_view value) {
  const size_t at = s.find(placeholder);
  if (at != std::string::npos) s.replace(at, placeholder.size(), value);
}

// A row's cachectl name at `at`: "{tier}_slots" -> "gpu_slots".
std::string NameAt(const StatsView& v, const StatRow& row, const StatPoint& at) {
  std::string name = row.name;
  Replace(name, "{tier}", TierName(at.tier));
  if (at.tenant != nullptr) Replace(name, "{tenant}", at.tenant->empty() ? "-" : *at.tenant);
  Replace(name, "{direction}", DirectionName(at.direction));
  if (at.store < v.store_names.size()) Replace(name, "{store}", v.store_names[at.store]);
  if (row.scope == S::kStoreCounter) Replace(name, "{counter}", v.stores[at.store].counters[at.counter].name);
  return name;
}

// A sample's labels: those of the row's scope, then the row's own.
Labels LabelsAt(const StatsView& v, const StatRow& row, const StatPoint& at) {
  Labels out;
  auto profile = [&] { out.emplace_back("profile", v.engines.Shared(at.profile).profile().name); };
  switch (row.scope) {
    case S::kDaemon:
      break;
    case S::kBuild:
      out.emplace_back("version", KVTIER_VERSION);
      out.emplace_back("backend", tiering::BackendKindName(v.backend.kind()));
      break;
    case S::kProfile:
      profile();
      break;
    case S::kProfileTier:
      profile();
      out.emplace_back("tier", TierName(at.tier));
      break;
    case S::kTenantTier:
      profile();
      out.emplace_back("tenant", *at.tenant);
      out.emplace_back("tier", TierName(at.tier));
      break;
    case S::kTenant:
      profile();
      out.emplace_back("tenant", *at.tenant);
      break;
    case S::kDirection:
      out.emplace_back("direction", DirectionName(at.direction));
      break;
    case S::kRequestType:
      out.emplace_back("type", wire::MessageTypeName(at.type));
      break;
    case S::kStore:
      out.emplace_back("store", v.store_names[at.store]);
      out.emplace_back("kind", v.stores[at.store].kind);
      break;
    case S::kStoreCounter:
      out.emplace_back("store", v.store_names[at.store]);
      out.emplace_back("kind", v.stores[at.store].kind);
      out.emplace_back("counter", v.stores[at.store].counters[at.counter].name);
      break;
  }
  if (row.label.first != nullptr) out.emplace_back(row.label.first, row.label.second);
  return out;
}

bool SameFamily(const StatRow& a, const StatRow& b) {
  return a.family != nullptr && b.family != nullptr && std::strcmp(a.family, b.family) == 0;
}

}  // namespace

StatsView::StatsView(const ServiceCounters& c, const tiering::Backend& b, const EngineSet& e,
                     std::vector<std::string> t, const AccessPolicy& a, std::vector<stores::StoreStats> s)
    : counters(c), backend(b), engines(e), tenants(std::move(t)), access(a), stores(std::move(s)) {
  store_names = StoreNames(stores);
  engine_stats.resize(engines.profiles());
  for (const EngineMember& m : engines) Accumulate(engine_stats[m.profile], m.engine->stats());
}

std::vector<std::pair<std::string, double>> StatsList(const StatsView& view, size_t profile) {
  std::vector<std::pair<std::string, double>> out;
  const std::span<const StatRow> rows = StatsTable();
  // A run of rows with one scope is listed point by point, the run's rows at each.
  for (size_t begin = 0, end = 0; begin < rows.size(); begin = end) {
    while (end < rows.size() && rows[end].scope == rows[begin].scope) ++end;
    for (const StatPoint& at : Points(view, rows[begin].scope, profile)) {
      for (size_t i = begin; i < end; ++i) {
        const StatRow& row = rows[i];
        if (row.name == nullptr || row.value == nullptr) continue;
        if (const Value v = row.value(view, at)) out.emplace_back(NameAt(view, row, at), *v);
      }
    }
  }
  return out;
}

std::string RenderPrometheus(const StatsView& view) {
  Exposition x;
  const std::span<const StatRow> rows = StatsTable();
  for (size_t first = 0; first < rows.size(); ++first) {
    const StatRow& head = rows[first];
    if (head.family == nullptr) continue;
    bool written = false;  // The family was written where an earlier row of it stands.
    for (size_t i = 0; i < first && !written; ++i) written = SameFamily(rows[i], head);
    if (written) continue;
    std::vector<const StatRow*> family;
    for (size_t i = first; i < rows.size(); ++i) {
      if (SameFamily(rows[i], head)) family.push_back(&rows[i]);
    }
    x.Family(head.family, head.type, head.help);
    const size_t profiles = PerProfile(head.scope) ? view.engines.profiles() : 1;
    for (size_t p = 0; p < profiles; ++p) {
      for (const StatRow* row : family) {
        for (const StatPoint& at : Points(view, row->scope, p)) {
          if (row->histogram != nullptr) {
            x.Histogram(LabelsAt(view, *row, at), *row->histogram(view, at));
          } else if (const Value v = row->value(view, at)) {
            x.Sample(LabelsAt(view, *row, at), *v);
          }
        }
      }
    }
  }
  return x.text();
}

}  // namespace kvtier::daemon
