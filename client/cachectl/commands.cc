#include "commands.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kvtier/client.h"

namespace kvtier::cachectl {
namespace {

using nlohmann::json;

// ---- Errors and exit codes ----

int ExitCodeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kNotFound:
      return kExitNotFound;
    case StatusCode::kUnavailable:
      return kExitUnavailable;
    default:
      return kExitError;
  }
}

int Fail(const std::string& what, const Status& st, int rc) {
  std::fprintf(stderr, "cachectl: %s: %s\n", what.c_str(), st.message().c_str());
  return rc;
}

int Fail(const std::string& what, const Status& st) { return Fail(what, st, ExitCodeFor(st.code())); }

int Usage(const std::string& what) {
  std::fprintf(stderr, "cachectl: %s (see --help)\n", what.c_str());
  return kExitUsage;
}

// Connects as "cachectl", once, within --timeout. On failure prints the error
// and sets *rc (3 when no daemon answers).
std::unique_ptr<Client> ConnectOrFail(const GlobalOptions& g, int* rc) {
  ClientOptions o;
  o.socket_path = g.socket;
  o.client_name = "cachectl";
  o.connect_timeout = std::chrono::milliseconds(g.timeout_ms);
  o.reconnect = false;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    const StatusCode code = c.status().code();
    const bool unreachable = code == StatusCode::kUnavailable || code == StatusCode::kTimeout;
    *rc = Fail("connect", c.status(), unreachable ? kExitUnavailable : kExitError);
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

std::string TierLabel(uint8_t tier) {
  switch (tier) {
    case static_cast<uint8_t>(Tier::kGpu):
      return "gpu";
    case static_cast<uint8_t>(Tier::kHost):
      return "host";
    default:
      return "tier" + std::to_string(tier);
  }
}

json SessionJson(const wire::SessionSummary& s) {
  return json{{"id", s.id},
              {"tenant", s.tenant},
              {"blocks", s.blocks},
              {"gpu_blocks", s.gpu_blocks},
              {"host_blocks", s.host_blocks},
              {"moving", s.moving},
              {"tokens", s.tokens},
              {"idle_ms", s.last_use_ms_ago},
              {"priority", s.priority}};
}

const char* kSessionHeader = "%-24s %-12s %7s %6s %6s %9s %8s %4s\n";

void PrintSessionHeader() {
  std::printf(kSessionHeader, "SESSION", "TENANT", "BLOCKS", "GPU", "HOST", "TOKENS", "IDLE", "PRIO");
}

void PrintSessionLine(const wire::SessionSummary& s) {
  const std::string tenant = s.tenant.empty() ? "-" : s.tenant;
  std::printf(kSessionHeader, s.id.c_str(), tenant.c_str(), std::to_string(s.blocks).c_str(),
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
  const ModelProfile& p = c->profile();
  if (g.json) {
    json pools = json::object();
    for (const char* tier : {"gpu", "host"}) {
      const double slots = StatValue(s, std::string(tier) + "_slots");
      const double used = StatValue(s, std::string(tier) + "_used");
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
  for (const char* tier : {"gpu", "host"}) {
    const double slots = StatValue(s, std::string(tier) + "_slots");
    const double used = StatValue(s, std::string(tier) + "_used");
    std::printf("%-5s pool:  %s / %s blocks used (%.1f%%)\n", tier, FormatNumber(used).c_str(),
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
  std::vector<wire::SessionSummary> list = std::move(r).value();
  auto by = [&](const wire::SessionSummary& x, const wire::SessionSummary& y) {
    if (a.sort == "blocks" && x.blocks != y.blocks) return x.blocks > y.blocks;
    if (a.sort == "tokens" && x.tokens != y.tokens) return x.tokens > y.tokens;
    if (a.sort == "idle" && x.last_use_ms_ago != y.last_use_ms_ago) return x.last_use_ms_ago > y.last_use_ms_ago;
    return x.id < y.id;
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
  const wire::SessionInfoResponse& info = *r;
  if (g.json) {
    json chain = json::array();
    for (size_t i = 0; i < info.chain.size(); ++i) {
      chain.push_back(json{{"index", i},
                           {"key", info.chain[i].ToHex()},
                           {"tier", i < info.tiers.size() ? TierLabel(info.tiers[i]) : std::string("?")}});
    }
    json j = SessionJson(info.summary);
    j["chain"] = chain;
    PrintJson(j);
    return kExitOk;
  }
  const wire::SessionSummary& s = info.summary;
  std::printf("session:  %s\n", s.id.c_str());
  std::printf("tenant:   %s\n", s.tenant.empty() ? "-" : s.tenant.c_str());
  std::printf("blocks:   %u (gpu %u, host %u, moving %u)\n", s.blocks, s.gpu_blocks, s.host_blocks, s.moving);
  std::printf("tokens:   %" PRIu64 "\n", s.tokens);
  std::printf("idle:     %s\n", FormatDuration(static_cast<double>(s.last_use_ms_ago) / 1000).c_str());
  std::printf("priority: %d\n", s.priority);
  std::printf("%5s  %-32s  %s\n", "INDEX", "KEY", "TIER");
  for (size_t i = 0; i < info.chain.size(); ++i) {
    std::printf("%5zu  %-32s  %s\n", i, info.chain[i].ToHex().c_str(),
                i < info.tiers.size() ? TierLabel(info.tiers[i]).c_str() : "?");
  }
  return kExitOk;
}

struct EvictArgs {
  std::string session;
  std::string tenant;
  bool all = false;
};

int CmdEvict(const GlobalOptions& g, const EvictArgs& a) {
  const int given = (a.session.empty() ? 0 : 1) + (a.tenant.empty() ? 0 : 1) + (a.all ? 1 : 0);
  if (given != 1) return Usage("evict: give exactly one of a session ID, --tenant T or --all");
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  Result<uint32_t> r = !a.session.empty() ? c->Evict(a.session)
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

int CmdPriority(const GlobalOptions& g, const std::string& verb, const std::string& id, int priority) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  const Status st = c->SetPriority(id, priority);
  if (!st.ok()) return Fail(verb + " '" + id + "'", st);
  if (g.json) {
    PrintJson(json{{"session", id}, {"priority", priority}});
  } else {
    std::printf("%s: priority %d\n", id.c_str(), priority);
  }
  return kExitOk;
}

struct StatsArgs {
  double watch = 0;
  bool watching = false;
  uint64_t count = 0;
};

int CmdStats(const GlobalOptions& g, const StatsArgs& a) {
  int rc = 0;
  auto c = ConnectOrFail(g, &rc);
  if (!c) return rc;
  const auto period = std::chrono::duration<double>(a.watch);
  auto next = std::chrono::steady_clock::now();
  for (uint64_t n = 0;; ++n) {
    auto r = c->Stats();
    if (!r.ok()) return Fail("stats", r.status());
    if (g.json) {
      json j = json::object();
      for (const auto& [k, v] : *r) j[k] = Number(v);
      PrintJson(j);
    } else {
      if (a.watching && n > 0) std::printf("\n");
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

  auto evict_args = std::make_shared<EvictArgs>();
  auto* evict = app.add_subcommand("evict", "Drop a session, a tenant's sessions, or all sessions");
  auto* evict_id = evict->add_option("ID", evict_args->session, "Session id");
  auto* evict_tenant = evict->add_option("--tenant", evict_args->tenant, "Every session of this tenant");
  auto* evict_all = evict->add_flag("--all", evict_args->all, "Every session");
  evict_id->excludes(evict_tenant)->excludes(evict_all);
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
  auto* pin = app.add_subcommand("pin", "Raise a session's eviction priority");
  pin->add_option("ID", *pin_id, "Session id")->required();
  pin->add_option("--priority", *pin_priority, "Priority 1..7 (higher is kept longer)")
      ->check(CLI::Range(1, 7))
      ->capture_default_str();
  pin->callback([=] { *act = [=] { return CmdPriority(*g, "pin", *pin_id, *pin_priority); }; });

  auto unpin_id = std::make_shared<std::string>();
  auto* unpin = app.add_subcommand("unpin", "Reset a session's priority to 0");
  unpin->add_option("ID", *unpin_id, "Session id")->required();
  unpin->callback([=] { *act = [=] { return CmdPriority(*g, "unpin", *unpin_id, 0); }; });

  auto stats_args = std::make_shared<StatsArgs>();
  auto* stats = app.add_subcommand("stats", "Every counter and gauge kvtierd reports");
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
