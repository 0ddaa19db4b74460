// systemd notifications: readiness, status, reload and stop, watchdog pings (notify.h).
#include "notify.h"

#include <time.h>

#include <cstdint>

#ifdef KVTIER_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace kvtier::daemon::notify {
namespace {

void Send(const std::string& state) {
#ifdef KVTIER_HAVE_SYSTEMD
  (void)sd_notify(0, state.c_str());
#else
  (void)state;
#endif
}

}  // namespace

bool Available() {
#ifdef KVTIER_HAVE_SYSTEMD
  return true;
#else
  return false;
#endif
}

void Ready(const std::string& status) { Send("READY=1\nSTATUS=" + status); }

void Reloading() {
  // systemd >= 253 matches the reload to this timestamp; older ones ignore it.
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const uint64_t usec = static_cast<uint64_t>(now.tv_sec) * 1000000u + static_cast<uint64_t>(now.tv_nsec) / 1000u;
  Send("RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=" + std::to_string(usec));
}

void Stopping(const std::string& status) { Send("STOPPING=1\nSTATUS=" + status); }

void SetStatus(const std::string& status) { Send("STATUS=" + status); }

void ExtendStartTimeout(std::chrono::microseconds more) { Send("EXTEND_TIMEOUT_USEC=" + std::to_string(more.count())); }

std::chrono::microseconds WatchdogInterval() {
#ifdef KVTIER_HAVE_SYSTEMD
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0) return std::chrono::microseconds(usec);
#endif
  return std::chrono::microseconds(0);
}

void WatchdogPing() { Send("WATCHDOG=1"); }

}  // namespace kvtier::daemon::notify
