// InstanceLock: the locks that keep one kvtierd per socket and instance (instance_lock.h).
#include "instance_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "kvtier/shm_names.h"

namespace kvtier::daemon {

Result<InstanceLock> InstanceLock::Acquire(const DaemonConfig& config) {
  const std::filesystem::path dir = std::filesystem::path(config.socket_path).parent_path();
  std::error_code fec;
  if (!dir.empty()) std::filesystem::create_directories(dir, fec);
  InstanceLock lock;
  const std::string paths[2] = {shm_names::SocketLock(config.socket_path), shm_names::InstanceLock(config.instance)};
  const std::string what[2] = {"socket " + config.socket_path, "instance '" + config.instance + "'"};
  // The instance's names in /dev/shm are only the warm-restart ones (every
  // other segment is nameless): without warm restart there is nothing to guard.
  const int count = config.warm_restart ? 2 : 1;
  for (int i = 0; i < count; ++i) {
    lock.paths_[i] = paths[i];
    // A lock file is removed when its holder exits cleanly; if the file we locked
    // was removed meanwhile, our lock guards nothing: open the new file and retry.
    for (int attempt = 0;; ++attempt) {
      lock.fds_[i] = ::open(paths[i].c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
      struct stat held {};
      // Anyone may create names in /dev/shm (or a sticky socket directory): a
      // lock file of another uid is not ours to trust, hold or remove.
      const bool foreign = lock.fds_[i] >= 0 && ::fstat(lock.fds_[i], &held) == 0 && held.st_uid != ::geteuid();
      if (lock.fds_[i] < 0 || foreign) {
        const std::string why = foreign ? "it belongs to uid " + std::to_string(held.st_uid)
                                        : std::string(std::strerror(errno));
        if (lock.fds_[i] >= 0) ::close(lock.fds_[i]);
        lock.fds_[i] = -1;
        lock.paths_[i].clear();
        if (i == 1) {
          lock.instance_lost_ = "cannot take the lock " + paths[i] + " of " + what[i] + ": " + why;
          return lock;
        }
        return Unavailable("cannot take the lock " + paths[i] + " of " + what[i] + ": " + why +
                           " (keep the socket in a directory only kvtierd's user may write, such as /run/kvtier)");
      }
      if (::flock(lock.fds_[i], LOCK_EX | LOCK_NB) != 0) {
        ::close(lock.fds_[i]);
        lock.fds_[i] = -1;
        lock.paths_[i].clear();
        return Status(StatusCode::kAlreadyExists,
                      "another kvtierd is running for " + what[i] + " (" + paths[i] + " is locked)");
      }
      struct stat now {};
      if (::stat(paths[i].c_str(), &now) == 0 && held.st_ino == now.st_ino && held.st_dev == now.st_dev) break;
      ::close(lock.fds_[i]);
      lock.fds_[i] = -1;
      if (attempt == 10) return Unavailable("lock file " + paths[i] + " keeps changing");
    }
  }
  return lock;
}

InstanceLock::InstanceLock(InstanceLock&& other) noexcept : instance_lost_(std::move(other.instance_lost_)) {
  for (int i = 0; i < 2; ++i) {
    fds_[i] = std::exchange(other.fds_[i], -1);
    paths_[i] = std::move(other.paths_[i]);
    other.paths_[i].clear();
  }
}

InstanceLock::~InstanceLock() {
  for (int i = 0; i < 2; ++i) {
    if (fds_[i] < 0) continue;
    ::unlink(paths_[i].c_str());  // While still locked: no one else holds this inode.
    ::close(fds_[i]);
  }
}

}  // namespace kvtier::daemon
