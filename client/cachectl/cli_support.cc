// What cachectl's commands share (cli_support.h).
#include "cli_support.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace kvtier::cachectl {

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

json NumberOrNull(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

}  // namespace kvtier::cachectl
