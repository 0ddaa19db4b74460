#include "commands.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kvtier/client.h"

namespace kvtier::cachectl {

int Usage(const std::string& what) {
  std::fprintf(stderr, "cachectl: %s (see --help)\n", what.c_str());
  return kExitUsage;
}

// "30s", "5m", "2h", "1h30m", "250ms", "1d" -> milliseconds (> 0).
Result<std::chrono::milliseconds> ParseDuration(const std::string& text) {
  const Status bad = InvalidArgument("'" + text + "' is not a duration such as 30s, 5m, 2h or 1h30m");
  if (text.empty()) return bad;
  int64_t total = 0;
  size_t i = 0;
  while (i < text.size()) {
    const size_t digits = i;
    int64_t n = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (n > 1'000'000'000) return bad;
      n = n * 10 + (text[i++] - '0');
    }
    if (i == digits) return bad;
    size_t unit_end = i;
    while (unit_end < text.size() && !(text[unit_end] >= '0' && text[unit_end] <= '9')) ++unit_end;
    const std::string unit = text.substr(i, unit_end - i);
    i = unit_end;
    int64_t ms_per = 0;
    if (unit == "ms")
      ms_per = 1;
    else if (unit == "s")
      ms_per = 1000;
    else if (unit == "m")
      ms_per = 60 * 1000;
    else if (unit == "h")
      ms_per = 3600 * 1000;
    else if (unit == "d")
      ms_per = 24 * 3600 * 1000;
    else
      return bad;
    total += n * ms_per;
    if (total > int64_t{1} << 50) return InvalidArgument("'" + text + "' is too long a duration");
  }
  if (total <= 0) return InvalidArgument("a duration must be longer than 0");
  return std::chrono::milliseconds(total);
}

namespace {

using nlohmann::json;

// ---- Errors and exit codes ----

int ExitCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kNotFound:
      return kExitNotFound;
    case StatusCode::kUnavailable:
      return kExitUnavailable;
    case StatusCode::kPermissionDenied:
      return kExitPermission;
    default:
      return kExitError;
  }
}

int Fail(const std::string& what, const Status& st, int rc) {
  std::fprintf(stderr, "cachectl: %s: %s\n", what.c_str(), st.message().c_str());
  return rc;
}

int Fail(const std::string& what, const Status& st) { return Fail(what, st, ExitCodeFor(st.code())); }

// Connects as "cachectl", once, within --timeout. On failure prints the error
// and sets *rc (3 when no daemon answers).
std::unique_ptr<Client> ConnectOrFail(const GlobalOptions& g, int* rc) {
  ClientOptions o;
  o.socket_path = g.socket;
  o.client_name = "cachectl";
  o.connect_timeout = std::chrono::milliseconds(g.timeout_ms);
  o.reconnect = false;
  o.server_uid = g.server_uid;
  o.open_gpu = false;  // cachectl reads no KV bytes: no driver, no context, no GPU memory.
  auto c = Client::Connect(o);
  if (!c.ok()) {
    const StatusCode code = c.status().code();
    const bool unreachable = code == StatusCode::kUnavailable || code == StatusCode::kTimeout;
    *rc = Fail("connect", c.status(),
               unreachable ? kExitUnavailable : code == StatusCode::kPermissionDenied ? kExitPermission : kExitError);
    return nullptr;
  }
  return std::move(c).value();
}

// ---- Formatting ----

void PrintJson(const json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

json Number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
    if (v >= 0) return json(static_cast<uint64_t>(v));
    return json(static_cast<int64_t>(v));
  }
  return json(v);
}

std::string FormatNumber(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
    std::snprintf(buf, sizeof buf, "%" PRId64, static_cast<int64_t>(v));
  } else {
    std::snprintf(buf, sizeof buf, "%.3f", v);
  }
  return buf;
}

// "850ms", "12.3s", "4m05s", "2h10m", "3d04h".
std::string FormatDuration(double seconds) {
  char buf[64];
  if (seconds < 1) {
    std::snprintf(buf, sizeof buf, "%.0fms", seconds * 1000);
  } else if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else if (seconds < 3600) {
    const auto s = static_cast<uint64_t>(seconds);
    std::snprintf(buf, sizeof buf, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
  } else if (seconds < 86400) {
    const auto m = static_cast<uint64_t>(seconds / 60);
    std::snprintf(buf, sizeof buf, "%" PRIu64 "h%02" PRIu64 "m", m / 60, m % 60);
  } else {
    const auto h = static_cast<uint64_t>(seconds / 3600);
    std::snprintf(buf, sizeof buf, "%" PRIu64 "d%02" PRIu64 "h", h / 24, h % 24);
  }
  return buf;
}

// "512 B", "1.5 KiB", "3.2 GiB".
std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[u]);
  return buf;
}

// Latencies: "850ns", "12us", "3.4ms", "1.20s".
std::string FormatLatency(double seconds) {
  char buf[64];
  if (seconds < 1e-6) {
    std::snprintf(buf, sizeof buf, "%.0fns", seconds * 1e9);
  } else if (seconds < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0fus", seconds * 1e6);
  } else if (seconds < 1) {
    std::snprintf(buf, sizeof buf, "%.1fms", seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fs", seconds);
  }
  return buf;
}

json SessionJson(const SessionSummary& s) {
  return json{{"id", s.id},
              {"tenant", s.tenant},
              {"blocks", s.blocks},
              {"gpu_blocks", s.gpu_blocks},
              {"host_blocks", s.host_blocks},
              {"moving", s.moving},
              {"tokens", s.tokens},
              {"idle_ms", s.last_use_ms_ago},
              {"priority", s.priority},
              {"model", s.model.IsNull() ? json(nullptr) : json(s.model.ToHex())}};
}

const char* kSessionHeader = "%-24s %-12s %-8s %7s %6s %6s %9s %8s %4s\n";

void PrintSessionHeader() {
  std::printf(kSessionHeader, "SESSION", "TENANT", "MODEL", "BLOCKS", "GPU", "HOST", "TOKENS", "IDLE", "PRIO");
}

void PrintSessionLine(const SessionSummary& s) {
  const std::string tenant = s.tenant.empty() ? "-" : s.tenant;
  const std::string model = s.model.IsNull() ? "-" : s.model.ToHex().substr(0, 8);  // Enough to tell models apart.
  std::printf(kSessionHeader, s.id.c_str(), tenant.c_str(), model.c_str(), std::to_string(s.blocks).c_str(),
              std::to_string(s.gpu_blocks).c_str(), std::to_string(s.host_blocks).c_str(),
              std::to_string(s.tokens).c_str(), FormatDuration(static_cast<double>(s.last_use_ms_ago) / 1000).c_str(),
              std::to_string(s.priority).c_str());
}

using StatMap = std::vector<std::pair<std::string, double>>;

double StatValue(const StatMap& stats, const std::string& name) {
  for (const auto& [k, v] : stats) {
    if (k == name) return v;
  }
  return 0;
}

std::string InstanceHex(uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, id);
  return buf;
}

// ---- Commands ----

int CmdStatus(const GlobalOptions& g) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  auto stats = c->Stats();
  if (!stats.ok()) return Fail("status", stats.status());
  const StatMap& s = *stats;
  const ModelProfile p = c->profile();
  if (g.json) {
    json pools = json::object();
    for (Tier t : kTiers) {
      const std::string tier = TierName(t);
      const double slots = StatValue(s, tier + "_slots");
      const double used = StatValue(s, tier + "_used");
      pools[tier] = json{{"slots", Number(slots)},
                         {"used", Number(used)},
                         {"free", Number(slots - used)},
                         {"occupancy", slots > 0 ? used / slots : 0.0}};
    }
    PrintJson(json{{"socket", g.socket},
                   {"backend", c->backend()},
                   {"profile", p.name},
                   {"profile_description", p.Describe()},
                   {"block_tokens", p.block_tokens},
                   {"instance_id", InstanceHex(c->instance_id())},
                   {"pools", pools},
                   {"sessions", Number(StatValue(s, "sessions"))},
                   {"blocks", Number(StatValue(s, "blocks"))},
                   {"clients", Number(StatValue(s, "clients"))},
                   {"uptime_s", StatValue(s, "uptime_s")}});
    return kExitOk;
  }
  std::printf("socket:      %s\n", g.socket.c_str());
  std::printf("backend:     %s\n", c->backend().c_str());
  std::printf("profile:     %s\n", p.Describe().c_str());
  std::printf("instance:    %s\n", InstanceHex(c->instance_id()).c_str());
  for (Tier t : kTiers) {
    const std::string tier = TierName(t);
    const double slots = StatValue(s, tier + "_slots");
    const double used = StatValue(s, tier + "_used");
    std::printf("%-5s pool:  %s / %s blocks used (%.1f%%)\n", tier.c_str(), FormatNumber(used).c_str(),
                FormatNumber(slots).c_str(), slots > 0 ? 100.0 * used / slots : 0.0);
  }
  std::printf("sessions:    %s (%s blocks)\n", FormatNumber(StatValue(s, "sessions")).c_str(),
              FormatNumber(StatValue(s, "blocks")).c_str());
  std::printf("clients:     %s\n", FormatNumber(StatValue(s, "clients")).c_str());
  std::printf("uptime:      %s\n", FormatDuration(StatValue(s, "uptime_s")).c_str());
  return kExitOk;
}

struct SessionsArgs {
  std::string tenant;
  std::string sort = "id";
  size_t limit = 0;
};

int CmdSessions(const GlobalOptions& g, const SessionsArgs& a) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  auto r = c->ListSessions(a.tenant);
  if (!r.ok()) return Fail("sessions", r.status());
  std::vector<SessionSummary> list = std::move(r).value();
  auto by = [&](const SessionSummary& x, const SessionSummary& y) {
    if (a.sort == "blocks" && x.blocks != y.blocks) return x.blocks > y.blocks;
    if (a.sort == "tokens" && x.tokens != y.tokens) return x.tokens > y.tokens;
    if (a.sort == "idle" && x.last_use_ms_ago != y.last_use_ms_ago) return x.last_use_ms_ago > y.last_use_ms_ago;
    return std::tie(x.id, x.tenant) < std::tie(y.id, y.tenant);
  };
  std::stable_sort(list.begin(), list.end(), by);
  if (a.limit > 0 && list.size() > a.limit) list.resize(a.limit);
  if (g.json) {
    json arr = json::array();
    for (const auto& s : list) arr.push_back(SessionJson(s));
    PrintJson(json{{"count", list.size()}, {"sessions", arr}});
    return kExitOk;
  }
  PrintSessionHeader();
  for (const auto& s : list) PrintSessionLine(s);
  return kExitOk;
}

int CmdSession(const GlobalOptions& g, const std::string& id) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  auto r = c->GetSession(id);
  if (!r.ok()) return Fail("session '" + id + "'", r.status());
  const SessionInfo& info = *r;
  const SessionSummary& s = info.summary;
  // Past the session's own blocks: those pressure dropped into the stores below
  // the host tier, which the stores (or another session) hold.
  const size_t dropped = info.chain.size() - std::min<size_t>(info.chain.size(), s.blocks);
  std::vector<std::string> stores;
  if (dropped > 0) {
    auto stats = c->Stats();
    if (stats.ok()) stores = StoreNames(*stats);  // Else they show as "store<i>".
  }
  auto place = [&](size_t i) { return i < info.tiers.size() ? PlaceName(info.tiers[i], stores) : std::string("?"); };
  if (g.json) {
    json chain = json::array();
    for (size_t i = 0; i < info.chain.size(); ++i) {
      chain.push_back(json{{"index", i}, {"key", info.chain[i].ToHex()}, {"tier", place(i)}, {"own", i < s.blocks}});
    }
    json j = SessionJson(s);
    j["dropped_blocks"] = dropped;
    j["chain"] = chain;
    PrintJson(j);
    return kExitOk;
  }
  std::printf("session:  %s\n", s.id.c_str());
  std::printf("tenant:   %s\n", s.tenant.empty() ? "-" : s.tenant.c_str());
  std::printf("model:    %s\n", s.model.IsNull() ? "- (no identity given)" : s.model.ToHex().c_str());
  std::printf("blocks:   %u (gpu %u, host %u, moving %u)\n", s.blocks, s.gpu_blocks, s.host_blocks, s.moving);
  if (dropped > 0) {
    std::map<std::string, size_t> where;
    for (size_t i = s.blocks; i < info.chain.size(); ++i) ++where[place(i)];
    std::string list;
    for (const auto& [name, n] : where) list += (list.empty() ? "" : ", ") + name + " " + std::to_string(n);
    std::printf("dropped:  %zu more, into the stores (now: %s)\n", dropped, list.c_str());
  }
  std::printf("tokens:   %" PRIu64 "\n", s.tokens);
  std::printf("idle:     %s\n", FormatDuration(static_cast<double>(s.last_use_ms_ago) / 1000).c_str());
  std::printf("priority: %d\n", s.priority);
  std::printf("%5s  %-32s  %s\n", "INDEX", "KEY", "TIER");
  for (size_t i = 0; i < info.chain.size(); ++i) {
    std::printf("%5zu  %-32s  %s\n", i, info.chain[i].ToHex().c_str(), place(i).c_str());
  }
  return kExitOk;
}

struct EvictArgs {
  std::string session;
  std::string tenant;
  bool all = false;
};

int CmdEvict(const GlobalOptions& g, const EvictArgs& a) {
  const int given = (a.session.empty() && a.tenant.empty() ? 0 : 1) + (a.all ? 1 : 0);
  if (given != 1) return Usage("evict: give a session ID (with --tenant T: that tenant's), --tenant T or --all");
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  Result<uint32_t> r = !a.session.empty() ? c->Evict(a.session, a.tenant)
                       : a.all            ? c->EvictAll()
                                          : c->EvictTenant(a.tenant);
  const std::string what =
      !a.session.empty() ? "evict '" + a.session + "'" : a.all ? "evict --all" : "evict --tenant '" + a.tenant + "'";
  if (!r.ok()) return Fail(what, r.status());
  if (g.json) {
    json j{{"evicted", *r}};
    if (!a.session.empty()) j["session"] = a.session;
    if (!a.tenant.empty()) j["tenant"] = a.tenant;
    PrintJson(j);
  } else {
    std::printf("evicted %u session%s\n", *r, *r == 1 ? "" : "s");
  }
  return kExitOk;
}

// demote / prefetch: one session, a block count back.
int CmdMove(const GlobalOptions& g, const std::string& verb, const std::string& id) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  Result<uint32_t> r = verb == "demote" ? c->Demote(id) : c->Prefetch(id);
  if (!r.ok()) return Fail(verb + " '" + id + "'", r.status());
  const std::string field = verb == "demote" ? "demoted" : "prefetched";
  if (g.json) {
    PrintJson(json{{"session", id}, {field, *r}});
  } else {
    std::printf("%s: %s %u block%s\n", id.c_str(), field.c_str(), *r, *r == 1 ? "" : "s");
  }
  return kExitOk;
}

// pin / unpin. `ttl` (pin --ttl) empty: until changed.
int CmdPriority(const GlobalOptions& g, const std::string& verb, const std::string& id, int priority,
                const std::string& ttl = "") {
  std::chrono::milliseconds ttl_ms{0};
  if (!ttl.empty()) {
    auto d = ParseDuration(ttl);
    if (!d.ok()) return Usage("--ttl: " + d.status().message());
    ttl_ms = *d;
  }
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  const Status st = c->SetPriority(id, priority, ttl_ms);
  if (!st.ok()) return Fail(verb + " '" + id + "'", st);
  if (g.json) {
    json j{{"session", id}, {"priority", priority}};
    if (ttl_ms.count() > 0) j["ttl_ms"] = ttl_ms.count();
    PrintJson(j);
  } else if (ttl_ms.count() > 0) {
    std::printf("%s: priority %d for %s, then 0\n", id.c_str(), priority,
                FormatDuration(static_cast<double>(ttl_ms.count()) / 1000).c_str());
  } else {
    std::printf("%s: priority %d\n", id.c_str(), priority);
  }
  return kExitOk;
}

struct StatsArgs {
  std::string tenant;  // Only this tenant's per-tenant figures.
  double watch = 0;
  bool watching = false;
  uint64_t count = 0;
};

// What `stats` derives from the daemon's counters (since it started).
struct StatsSummary {
  double hit_rate_blocks = NAN;  // NaN: nothing looked up yet.
  double hit_rate_tokens = NAN;
  // Of the prompt tokens asked for: found in the GPU tier, in the host tier,
  // fetched from the stores below it, missed (NaN: nothing asked yet).
  double from_gpu = NAN, from_host = NAN, from_stores = NAN, missed = NAN;
  double copy_bps[2] = {NAN, NAN};  // gpu->host, host->gpu; NaN: nothing copied yet.
};

StatsSummary Summarize(const StatMap& s) {
  StatsSummary out;
  auto ratio = [](double part, double whole) { return whole > 0 ? part / whole : NAN; };
  out.hit_rate_blocks = ratio(StatValue(s, "hit_blocks"), StatValue(s, "hit_blocks") + StatValue(s, "miss_blocks"));
  out.hit_rate_tokens = ratio(StatValue(s, "hit_tokens"), StatValue(s, "hit_tokens") + StatValue(s, "miss_tokens"));
  const double asked = StatValue(s, "hit_tokens") + StatValue(s, "miss_tokens") + StatValue(s, "store_hit_tokens");
  out.from_gpu = ratio(StatValue(s, "hit_tokens_gpu"), asked);
  out.from_host = ratio(StatValue(s, "hit_tokens_host"), asked);
  out.from_stores = ratio(StatValue(s, "store_hit_tokens"), asked);
  out.missed = ratio(StatValue(s, "miss_tokens"), asked);
  out.copy_bps[0] = ratio(StatValue(s, "copy_gpu_to_host_bytes"), StatValue(s, "copy_gpu_to_host_seconds"));
  out.copy_bps[1] = ratio(StatValue(s, "copy_host_to_gpu_bytes"), StatValue(s, "copy_host_to_gpu_seconds"));
  return out;
}

json NumberOrNull(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

void PrintStatsSummary(const StatMap& s) {
  const StatsSummary d = Summarize(s);
  auto percent = [](double r) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * r);
    return std::isnan(r) ? std::string("-") : std::string(buf);
  };
  auto bandwidth = [](double bps) { return std::isnan(bps) ? std::string("-") : FormatBytes(bps) + "/s"; };
  const double hits = StatValue(s, "hit_blocks"), misses = StatValue(s, "miss_blocks");
  const double hit_tokens = StatValue(s, "hit_tokens"), miss_tokens = StatValue(s, "miss_tokens");
  std::printf("hit rate:     blocks %s (%s of %s), tokens %s (%s of %s)\n", percent(d.hit_rate_blocks).c_str(),
              FormatNumber(hits).c_str(), FormatNumber(hits + misses).c_str(), percent(d.hit_rate_tokens).c_str(),
              FormatNumber(hit_tokens).c_str(), FormatNumber(hit_tokens + miss_tokens).c_str());
  std::printf("tokens from:  gpu %s, host %s, stores %s, missed %s\n", percent(d.from_gpu).c_str(),
              percent(d.from_host).c_str(), percent(d.from_stores).c_str(), percent(d.missed).c_str());
  std::printf("moved:        gpu->host %s (%s blocks), host->gpu %s (%s blocks)\n",
              FormatBytes(StatValue(s, "demoted_bytes")).c_str(), FormatNumber(StatValue(s, "demoted_blocks")).c_str(),
              FormatBytes(StatValue(s, "promoted_bytes")).c_str(),
              FormatNumber(StatValue(s, "promoted_blocks")).c_str());
  std::printf("copy speed:   gpu->host %s, host->gpu %s\n", bandwidth(d.copy_bps[0]).c_str(),
              bandwidth(d.copy_bps[1]).c_str());
  std::printf("rpc latency:  p50 %s, p90 %s, p99 %s (%s requests)\n",
              FormatLatency(StatValue(s, "rpc_latency_p50_s")).c_str(),
              FormatLatency(StatValue(s, "rpc_latency_p90_s")).c_str(),
              FormatLatency(StatValue(s, "rpc_latency_p99_s")).c_str(), FormatNumber(StatValue(s, "requests")).c_str());
  std::printf("evictions:    %s sessions evicted, %s blocks dropped under pressure\n",
              FormatNumber(StatValue(s, "evicted_sessions")).c_str(),
              FormatNumber(StatValue(s, "dropped_blocks")).c_str());
  const double read = StatValue(s, "read_leases"), write = StatValue(s, "write_leases");
  std::printf("leases:       %s held (%s read, %s write on %s gpu slots), oldest %s; %s expired (%s write, %s read)\n",
              FormatNumber(read + write).c_str(), FormatNumber(read).c_str(), FormatNumber(write).c_str(),
              FormatNumber(StatValue(s, "leased_slots")).c_str(),
              read + write > 0 ? FormatDuration(StatValue(s, "oldest_lease_age_s")).c_str() : "-",
              FormatNumber(StatValue(s, "leases_expired")).c_str(),
              FormatNumber(StatValue(s, "write_leases_expired")).c_str(),
              FormatNumber(StatValue(s, "read_leases_expired")).c_str());
}

int CmdStats(const GlobalOptions& g, const StatsArgs& a) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  const auto period = std::chrono::duration<double>(a.watch);
  auto next = std::chrono::steady_clock::now();
  if (!a.tenant.empty()) {
    // The daemon decides who may see another tenant: its session list says so
    // (one session of it is enough to ask for).
    auto allowed = c->ListSessionsPage(a.tenant, nullptr, 1);
    if (!allowed.ok()) return Fail("stats --tenant '" + a.tenant + "'", allowed.status());
  }
  for (uint64_t n = 0;; ++n) {
    auto r = c->Stats();
    if (!r.ok()) return Fail("stats", r.status());
    // "tenant.<name>.<what>" entries: kept for the --tenant one only, and
    // gathered per tenant for the summary and JSON.
    std::map<std::string, std::map<std::string, double>> tenants;
    std::erase_if(*r, [&](const auto& kv) {
      const std::string& k = kv.first;
      if (k.rfind("tenant.", 0) != 0) return false;
      const size_t dot = k.rfind('.');
      const std::string name = k.substr(7, dot - 7);
      if (!a.tenant.empty() && name != a.tenant) return true;
      tenants[name][k.substr(dot + 1)] = kv.second;
      return false;
    });
    if (g.json) {
      json j = json::object();
      for (const auto& [k, v] : *r) j[k] = Number(v);
      json t = json::object();
      for (const auto& [name, values] : tenants) {
        for (const auto& [what, v] : values) t[name][what] = Number(v);
      }
      j["tenants"] = t;
      const StatsSummary d = Summarize(*r);
      j["hit_rate_blocks"] = NumberOrNull(d.hit_rate_blocks);
      j["hit_rate_tokens"] = NumberOrNull(d.hit_rate_tokens);
      j["tokens_from_gpu"] = NumberOrNull(d.from_gpu);
      j["tokens_from_host"] = NumberOrNull(d.from_host);
      j["tokens_from_stores"] = NumberOrNull(d.from_stores);
      j["tokens_missed"] = NumberOrNull(d.missed);
      j["copy_gpu_to_host_bytes_per_s"] = NumberOrNull(d.copy_bps[0]);
      j["copy_host_to_gpu_bytes_per_s"] = NumberOrNull(d.copy_bps[1]);
      PrintJson(j);
    } else {
      if (a.watching && n > 0) std::printf("\n");
      PrintStatsSummary(*r);
      for (const auto& [name, v] : tenants) {
        auto quota = [&](const char* key) {
          auto it = v.find(key);
          return it == v.end() || it->second == 0 ? std::string("unlimited") : FormatNumber(it->second);
        };
        auto get = [&](const char* key) { auto it = v.find(key); return it == v.end() ? 0.0 : it->second; };
        std::printf("tenant %-8s gpu %s blocks + %s leased slots (quota %s), host %s blocks (quota %s)\n",
                    name.c_str(), FormatNumber(get("gpu_blocks")).c_str(), FormatNumber(get("leased_blocks")).c_str(),
                    quota("gpu_quota").c_str(), FormatNumber(get("host_blocks")).c_str(), quota("host_quota").c_str());
        if (v.count("read_blocks")) {
          const double leases = get("read_leases");
          std::printf("       %-8s read %s blocks in %s leases (%s each), %s read errors; saved %s blocks\n", "",
                      FormatNumber(get("read_blocks")).c_str(), FormatNumber(leases).c_str(),
                      leases > 0 ? FormatLatency(get("read_seconds") / leases).c_str() : "-",
                      FormatNumber(get("read_errors")).c_str(), FormatNumber(get("saved_blocks")).c_str());
        }
      }
      std::printf("\n");
      size_t width = 0;
      for (const auto& kv : *r) width = std::max(width, kv.first.size());
      for (const auto& [k, v] : *r) std::printf("%-*s  %s\n", static_cast<int>(width), k.c_str(), FormatNumber(v).c_str());
      std::fflush(stdout);
    }
    if (!a.watching || (a.count > 0 && n + 1 >= a.count)) break;
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    std::this_thread::sleep_until(next);
  }
  return kExitOk;
}

int CmdConfig(const GlobalOptions& g) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  auto r = c->Config();
  if (!r.ok()) return Fail("config", r.status());
  if (g.json) {
    PrintJson(json{{"yaml", *r}});
  } else {
    std::fwrite(r->data(), 1, r->size(), stdout);
    if (!r->empty() && r->back() != '\n') std::printf("\n");
  }
  return kExitOk;
}

}  // namespace

void AddCommands(CLI::App& app, const GlobalOptions& global, std::function<int()>& action) {
  const GlobalOptions* g = &global;  // Read when the command runs, after parsing.
  std::function<int()>* act = &action;

  auto* status = app.add_subcommand("status", "Backend, profile, instance, pool occupancy, clients, uptime");
  status->callback([=] { *act = [=] { return CmdStatus(*g); }; });

  auto sessions_args = std::make_shared<SessionsArgs>();
  auto* sessions = app.add_subcommand("sessions", "One line per session");
  sessions->add_option("--tenant", sessions_args->tenant, "Only this tenant's sessions");
  sessions->add_option("--sort", sessions_args->sort, "Order: id, blocks, idle (longest first), tokens")
      ->check(CLI::IsMember({"id", "blocks", "idle", "tokens"}))
      ->capture_default_str();
  sessions->add_option("--limit", sessions_args->limit, "Show at most N sessions (0: all)");
  sessions->callback([=] { *act = [=] { return CmdSessions(*g, *sessions_args); }; });

  auto session_id = std::make_shared<std::string>();
  auto* session = app.add_subcommand("session", "One session: summary and its block chain");
  session->add_option("ID", *session_id, "Session id")->required();
  session->callback([=] { *act = [=] { return CmdSession(*g, *session_id); }; });

  auto events_args = std::make_shared<EventsArgs>();
  auto* events = app.add_subcommand(
      "events", "Subscribe to kvtierd's KV events (events.enabled) and print them; gaps are filled from its replay");
  events->add_option("--publish", events_args->publish,
                     "kvtierd's events.publish endpoint (default: ipc://SOCKET.events)");
  events->add_option("--replay", events_args->replay,
                     "kvtierd's events.replay endpoint (default: ipc://SOCKET.replay)");
  events->add_option("--topic", events_args->topic, "kvtierd's events.topic")->capture_default_str();
  events->add_option("--from", events_args->from, "First print the batches kvtierd keeps from this sequence number on");
  events->add_option("--count", events_args->count, "Exit after this many batches");
  events->add_option("--idle-exit", events_args->idle_exit, "Exit once no batch came for DURATION (500ms, 5s)");
  events->callback([=] { *act = [=] { return CmdEvents(*g, *events_args); }; });

  auto evict_args = std::make_shared<EvictArgs>();
  auto* evict = app.add_subcommand("evict", "Drop a session, a tenant's sessions, or all sessions");
  auto* evict_id = evict->add_option("ID", evict_args->session, "Session id");
  auto* evict_tenant = evict->add_option("--tenant", evict_args->tenant,
                                         "Every session of this tenant; with ID, that tenant's session ID");
  auto* evict_all = evict->add_flag("--all", evict_args->all, "Every session");
  evict_id->excludes(evict_all);
  evict_tenant->excludes(evict_all);
  evict->callback([=] { *act = [=] { return CmdEvict(*g, *evict_args); }; });

  for (const char* verb : {"demote", "prefetch"}) {
    auto id = std::make_shared<std::string>();
    auto* sub = app.add_subcommand(verb, std::string(verb) == "demote" ? "Move a session's blocks to the host tier"
                                                                      : "Move a session's blocks to the GPU tier");
    sub->add_option("ID", *id, "Session id")->required();
    const std::string v = verb;
    sub->callback([=] { *act = [=] { return CmdMove(*g, v, *id); }; });
  }

  auto pin_id = std::make_shared<std::string>();
  auto pin_priority = std::make_shared<int>(7);
  auto pin_ttl = std::make_shared<std::string>();
  auto* pin = app.add_subcommand("pin", "Raise a session's eviction priority");
  pin->add_option("ID", *pin_id, "Session id")->required();
  pin->add_option("--priority", *pin_priority, "Priority 1..7 (higher is kept longer)")
      ->check(CLI::Range(1, 7))
      ->capture_default_str();
  pin->add_option("--ttl", *pin_ttl,
                  "Back to priority 0 after DURATION (30s, 5m, 2h, 1h30m); kvtierd enforces it after cachectl exits")
      ->check(CLI::Validator(
          [](std::string& v) {
            auto d = ParseDuration(v);
            return d.ok() ? std::string() : d.status().message();
          },
          "DURATION"));
  pin->callback([=] { *act = [=] { return CmdPriority(*g, "pin", *pin_id, *pin_priority, *pin_ttl); }; });

  auto unpin_id = std::make_shared<std::string>();
  auto* unpin = app.add_subcommand("unpin", "Reset a session's priority to 0");
  unpin->add_option("ID", *unpin_id, "Session id")->required();
  unpin->callback([=] { *act = [=] { return CmdPriority(*g, "unpin", *unpin_id, 0); }; });

  auto stats_args = std::make_shared<StatsArgs>();
  auto* stats = app.add_subcommand(
      "stats", "Hit rates, bytes moved, copy speed, RPC latency percentiles, evictions; then every counter and gauge");
  stats->add_option("--tenant", stats_args->tenant, "Only this tenant's blocks per tier (others': admins only)");
  auto* watch = stats->add_option("--watch", stats_args->watch, "Print again every SECONDS")
                    ->check(CLI::PositiveNumber);
  stats->add_option("--count", stats_args->count, "With --watch: stop after N reports (0: never)")
      ->needs(watch);
  stats->callback([=] {
    stats_args->watching = watch->count() > 0;
    *act = [=] { return CmdStats(*g, *stats_args); };
  });

  auto* config = app.add_subcommand("config", "The daemon's effective configuration (YAML)");
  config->callback([=] { *act = [=] { return CmdConfig(*g); }; });
}

}  // namespace kvtier::cachectl
