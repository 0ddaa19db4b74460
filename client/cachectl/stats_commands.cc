// cachectl's daemon-wide commands: status, stats (with --watch and --tenant), config.
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cli_support.h"
#include "commands.h"

namespace kvtier::cachectl {

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

}  // namespace kvtier::cachectl
