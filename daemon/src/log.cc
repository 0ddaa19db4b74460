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
#include <vector>

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

namespace {

struct Recent {
  std::chrono::steady_clock::time_point last;  // Of the last line written.
  uint64_t suppressed = 0;                     // Lines dropped since.
  LogLevel level = LogLevel::kInfo;            // Of the last one dropped,
  std::string text;                            // and its text.
};

std::mutex g_recent_mu;
// One entry per key: a few literals.
std::unordered_map<std::string, Recent>& RecentLines() {
  static auto* recent = new std::unordered_map<std::string, Recent>();
  return *recent;
}

std::string Counted(const std::string& text, uint64_t suppressed) {
  return suppressed == 0 ? text : text + " (" + std::to_string(suppressed) + " similar suppressed)";
}

}  // namespace

void LogLimited(LogLevel level, std::string_view key, const std::string& text) {
  if (!LogEnabled(level)) return;
  const auto now = std::chrono::steady_clock::now();
  uint64_t suppressed = 0;
  {
    std::lock_guard<std::mutex> lock(g_recent_mu);
    auto [it, first] = RecentLines().try_emplace(std::string(key));
    Recent& r = it->second;
    if (!first && now - r.last < std::chrono::seconds(1)) {
      ++r.suppressed;
      r.level = level;
      r.text = text;
      return;
    }
    r.last = now;
    r.text.clear();
    suppressed = std::exchange(r.suppressed, 0);
  }
  Log(level, Counted(text, suppressed));
}

void FlushLimitedLogs() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<LogLevel, std::string>> lines;
  {
    std::lock_guard<std::mutex> lock(g_recent_mu);
    for (auto& [key, r] : RecentLines()) {
      if (r.suppressed == 0 || now - r.last < std::chrono::seconds(1)) continue;
      // The last line dropped, as the one that stands for them all.
      lines.emplace_back(r.level, Counted(r.text, r.suppressed - 1) + " (the last of a flood that stopped)");
      r.last = now;
      r.suppressed = 0;
      r.text.clear();
    }
  }
  for (const auto& [level, line] : lines) Log(level, line);
}

std::string Printable(std::string_view text, size_t max) {
  std::string out;
  for (char ch : text.substr(0, max)) out += ch >= 0x20 && ch < 0x7f ? ch : '?';
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace kvtier::daemon
