// InstanceLock: proof that this process is the only kvtierd for its socket and
// its instance name.
//
// Exclusive flocks on "<socket>.lock" and "/dev/shm/<instance>.lock"
// (shm_names::SocketLock, InstanceLock), held until destruction, which removes
// the files. Take it before creating any shared segment: a second instance then
// refuses cleanly, and a crashed one's socket and segments can be replaced.
#pragma once

#include <string>

#include "config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

class InstanceLock {
 public:
  // Creates the socket's directory if it is missing, then takes both locks.
  // kAlreadyExists when another process holds either; kUnavailable when a lock
  // file cannot be opened (or keeps being replaced under us).
  static Result<InstanceLock> Acquire(const DaemonConfig& config);
  InstanceLock(InstanceLock&& other) noexcept;
  InstanceLock& operator=(InstanceLock&&) = delete;
  ~InstanceLock();

 private:
  InstanceLock() = default;
  int fds_[2] = {-1, -1};
  std::string paths_[2];
};

}  // namespace kvtier::daemon
