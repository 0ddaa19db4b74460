// InstanceLock: proof that this process is the only kvtierd for its socket and
// its instance name.
//
// Exclusive flocks on "<socket>.lock" and, with warm restart (the only names
// kvtierd puts in /dev/shm), "/dev/shm/<instance>.lock" (shm_names::SocketLock,
// InstanceLock), held until destruction, which removes the files. Take it
// before creating any shared segment: a second instance then refuses cleanly,
// and a crashed one's socket and segments can be replaced. A lock file of
// another uid is never used.
#pragma once

#include <string>

#include "config/config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

class InstanceLock {
 public:
  // Creates the socket's directory if it is missing, then takes the locks.
  // kAlreadyExists when another process holds either; kUnavailable when the
  // socket's lock file cannot be opened or is another uid's (or keeps being
  // replaced under us). An instance lock that cannot be had (another uid made
  // the file: squatted) is not an error: instance_lost() says why, and the
  // caller runs without warm restart.
  static Result<InstanceLock> Acquire(const DaemonConfig& config);
  const std::string& instance_lost() const { return instance_lost_; }
  InstanceLock(InstanceLock&& other) noexcept;
  InstanceLock& operator=(InstanceLock&&) = delete;
  ~InstanceLock();

 private:
  InstanceLock() = default;
  int fds_[2] = {-1, -1};
  std::string paths_[2];
  std::string instance_lost_;
};

}  // namespace kvtier::daemon
