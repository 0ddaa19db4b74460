// Daemon logging: one line per event on stderr (log.h).
#include "log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <utility>

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

void LogLimited(LogLevel level, std::string_view key, const std::string& text) {
  if (!LogEnabled(level)) return;
  struct Recent {
    std::chrono::steady_clock::time_point last;
    uint64_t suppressed = 0;
  };
  static std::mutex mu;
  static std::unordered_map<std::string, Recent> recent;  // One entry per key: a few literals.
  const auto now = std::chrono::steady_clock::now();
  uint64_t suppressed = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, first] = recent.try_emplace(std::string(key));
    if (!first && now - it->second.last < std::chrono::seconds(1)) {
      ++it->second.suppressed;
      return;
    }
    it->second.last = now;
    suppressed = std::exchange(it->second.suppressed, 0);
  }
  Log(level, suppressed == 0 ? text : text + " (" + std::to_string(suppressed) + " similar suppressed)");
}

std::string Printable(std::string_view text, size_t max) {
  std::string out;
  for (char ch : text.substr(0, max)) out += ch >= 0x20 && ch < 0x7f ? ch : '?';
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace kvtier::daemon
