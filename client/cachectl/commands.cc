// cachectl's command line: every subcommand and its options (AddCommands), and
// the parsing they share. The commands are in session_commands.cc,
// stats_commands.cc and events.cc; what they share in cli_support.h.
#include "commands.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

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
