// cachectl: the operator CLI for kvtierd. Every command talks to the daemon
// through the public client API only (kvtier/client.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "kvtier/status.h"

namespace CLI {
class App;
}

namespace kvtier::cachectl {

// Exit codes.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnavailable = 3;
inline constexpr int kExitNotFound = 4;
inline constexpr int kExitPermission = 5;  // kvtierd refused: not allowed, or another tenant's and not an admin.

// Options every command shares.
struct GlobalOptions {
  std::string socket = "/run/kvtier/kvtierd.sock";
  bool json = false;
  int timeout_ms = 1000;
  // The uid kvtierd must run as (libkvtier checks the peer); unset: libkvtier's
  // default ($KVTIER_SERVER_UID, else the socket's owner in a safe directory).
  std::optional<uint32_t> server_uid;
};

// Prints "cachectl: <what> (see --help)"; returns kExitUsage.
int Usage(const std::string& what);
// "30s", "5m", "2h", "1h30m", "250ms", "1d" -> milliseconds (> 0).
Result<std::chrono::milliseconds> ParseDuration(const std::string& text);

// The commands (session_commands.cc, stats_commands.cc); each returns its exit code.
struct SessionsArgs {
  std::string tenant;
  std::string sort = "id";
  size_t limit = 0;
};
struct EvictArgs {
  std::string session;
  std::string tenant;
  bool all = false;
};
struct StatsArgs {
  std::string tenant;  // Only this tenant's per-tenant figures.
  double watch = 0;
  bool watching = false;
  uint64_t count = 0;
};
int CmdStatus(const GlobalOptions& g);
int CmdSessions(const GlobalOptions& g, const SessionsArgs& a);
int CmdSession(const GlobalOptions& g, const std::string& id);
int CmdEvict(const GlobalOptions& g, const EvictArgs& a);
// demote / prefetch: one session, a block count back.
int CmdMove(const GlobalOptions& g, const std::string& verb, const std::string& id);
// pin / unpin. `ttl` (pin --ttl) empty: until changed.
int CmdPriority(const GlobalOptions& g, const std::string& verb, const std::string& id, int priority,
                const std::string& ttl = "");
int CmdStats(const GlobalOptions& g, const StatsArgs& a);
int CmdConfig(const GlobalOptions& g);

// cachectl events (events.cc).
struct EventsArgs {
  std::string publish;  // Empty: ipc://<socket>.events, kvtierd's default.
  std::string replay;   // Empty: ipc://<socket>.replay.
  std::string topic = "kvtier";
  uint64_t from = 0;      // Replay from this seq first (0: live only).
  uint64_t count = 0;     // Exit after this many batches (0: never).
  std::string idle_exit;  // Exit after this long without a batch (empty: never).
};
int CmdEvents(const GlobalOptions& g, const EventsArgs& a);

// Registers every subcommand on `app`. After a successful parse, `action`
// holds the selected command; running it returns the exit code.
void AddCommands(CLI::App& app, const GlobalOptions& global, std::function<int()>& action);

}  // namespace kvtier::cachectl
