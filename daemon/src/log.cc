// Daemon logging: one line per event on stderr (log.h).
#include "log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace kvtier::daemon {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* Name(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}

}  // namespace

void SetLogLevel(std::string_view level) {
  LogLevel l = LogLevel::kInfo;
  if (level == "error") l = LogLevel::kError;
  else if (level == "warn") l = LogLevel::kWarn;
  else if (level == "debug") l = LogLevel::kDebug;
  g_level.store(static_cast<int>(l));
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed); }

void Log(LogLevel level, const std::string& text) {
  if (!LogEnabled(level)) return;
  std::string line = "kvtierd: ";
  line += Name(level);
  line += ": ";
  line += text;
  line += '\n';
  // One write per line so lines from different threads never interleave.
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace kvtier::daemon
