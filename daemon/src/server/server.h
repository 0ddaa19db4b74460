// Server: kvtierd's Unix-socket front end on a Boost.Asio event loop.
//
// One thread runs everything: accepting, framing, the Service, copy completions
// (posted from the backend's thread), the watermark timer, the metrics endpoint,
// configuration reloads (SIGHUP) and systemd notifications. A connection whose
// peer sends a bad frame gets an ErrorResponse and is closed; every other
// connection goes on. When a connection ends for any reason its leases end.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

class Service;

class Server {
 public:
  // What SIGHUP re-reads: the configuration as it would be at start now.
  using ConfigSource = std::function<Result<DaemonConfig>()>;

  Server(Service& service, const DaemonConfig& config, ConfigSource reload);
  ~Server();

  // Replaces a stale socket, binds and listens; starts the metrics endpoint when
  // configured. REQUIRES: the InstanceLock (instance_lock.h) is held.
  // kAlreadyExists when another process serves this socket.
  Status Start();
  // Serves until SIGTERM/SIGINT (or Stop), then drains and cleans up. On SIGHUP
  // it reloads: settings that can change take effect (see PlanReload), the rest
  // are kept with a warning naming each, and a file that does not parse is
  // rejected whole. Returns the process exit code.
  int Run();
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::daemon
