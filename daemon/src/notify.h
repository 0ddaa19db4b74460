// systemd service notifications (sd_notify(3)): readiness, status lines, reload
// and stop, watchdog pings.
//
// Every call is a no-op when systemd did not start the daemon (NOTIFY_SOCKET is
// unset) or kvtierd was built without libsystemd (KVTIER_HAVE_SYSTEMD undefined).
#pragma once

#include <chrono>
#include <string>

namespace kvtier::daemon::notify {

// True when this build can notify systemd at all.
bool Available();

// The socket listens and the pools exist: "READY=1" with a status line.
void Ready(const std::string& status);
// A configuration reload starts; Ready ends it.
void Reloading();
// Shutdown has begun.
void Stopping(const std::string& status);
void SetStatus(const std::string& status);
// Start-up work is still progressing (pinning a large host tier): systemd's
// start timeout (TimeoutStartSec) is extended to `more` from now, so a slow but
// advancing start is not killed ("EXTEND_TIMEOUT_USEC=").
void ExtendStartTimeout(std::chrono::microseconds more);

// How often systemd expects a watchdog ping from this process (WATCHDOG_USEC,
// when WATCHDOG_PID is unset or this process); zero when there is no watchdog.
std::chrono::microseconds WatchdogInterval();
void WatchdogPing();

}  // namespace kvtier::daemon::notify
