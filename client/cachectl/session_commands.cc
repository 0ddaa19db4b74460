// cachectl's session commands: sessions, session, evict, demote / prefetch, pin / unpin.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cli_support.h"
#include "commands.h"

namespace kvtier::cachectl {
namespace {

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

}  // namespace


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
  auto place = [&](size_t i) {
    return i < info.tiers.size() ? PlaceName(info.tiers[i], info.stores) : std::string("?");
  };
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
                const std::string& ttl) {
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

}  // namespace kvtier::cachectl
