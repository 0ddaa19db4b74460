// Daemon logging: one line per event on stderr, "kvtierd: <level>: <text>".
#pragma once

#include <string>
#include <string_view>

namespace kvtier::daemon {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(std::string_view level);  // "error" | "warn" | "info" | "debug"
bool LogEnabled(LogLevel level);
void Log(LogLevel level, const std::string& text);

inline void LogError(const std::string& t) { Log(LogLevel::kError, t); }
inline void LogWarn(const std::string& t) { Log(LogLevel::kWarn, t); }
inline void LogInfo(const std::string& t) { Log(LogLevel::kInfo, t); }
inline void LogDebug(const std::string& t) {
  if (LogEnabled(LogLevel::kDebug)) Log(LogLevel::kDebug, t);
}

// For events a peer can repeat at will (refused connections, bad frames,
// accept errors): at most one line per `key` per second. The first line after
// some were dropped ends with "(N similar suppressed)".
void LogLimited(LogLevel level, std::string_view key, const std::string& text);
// For a key whose lines were suppressed and that has logged nothing for a
// second (a flood that stopped), logs the last suppressed line with the count,
// so no flood ends unreported. kvtierd calls it from its tick.
void FlushLimitedLogs();
// `text` as a peer may have it shown in a log line: printable ASCII, anything
// else as '?', at most `max` characters ("..." marks a cut), so a client's
// name can neither forge log lines nor flood them.
std::string Printable(std::string_view text, size_t max = 64);

}  // namespace kvtier::daemon
