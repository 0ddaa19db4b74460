// What the attack suite (label security) shares: a raw wire connection that
// speaks the protocol directly, as a hostile client would, and the daemon's
// resident memory, read from /proc.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"

namespace kvtier::testing {

// The figure `name` of c.Stats(); -1 if absent or the call failed.
double StatOf(Client& c, const std::string& name);

// Runs `body` in a forked child as `uid` (its gid the same number, and the
// supplementary `groups` only); the child's exit code, -1 if it died. REQUIRES: root.
int RunAs(uint32_t uid, const std::function<int()>& body, const std::vector<gid_t>& groups = {});

// kvtierd's resident set in KiB (VmRSS), -1 if it cannot be read.
long VmRssKiB(pid_t pid);

// A Unix-socket connection with no libkvtier in between.
class RawConnection {
 public:
  // Connects (blocking); kUnavailable if nobody listens.
  static Result<RawConnection> Open(const std::string& socket_path);
  RawConnection() = default;
  RawConnection(RawConnection&& o) noexcept;
  RawConnection& operator=(RawConnection&& o) noexcept;
  ~RawConnection();

  int fd() const { return fd_; }
  // Sends every byte (blocking); false if the daemon closed the connection.
  bool SendBytes(const std::vector<uint8_t>& bytes);
  bool Send(uint64_t request_id, const wire::Message& m);
  // The next frame, decoded; kTimeout after `timeout`, kUnavailable at EOF.
  // File descriptors sent with it (SCM_RIGHTS) are appended to `fds` when
  // given, else closed.
  Result<wire::Message> Receive(std::chrono::milliseconds timeout, std::vector<int>* fds = nullptr);
  // Hello (tenant, default profile) and its Welcome; the descriptors that came
  // with the Welcome go to `fds` (closed when null).
  Result<wire::Welcome> Hello(const std::string& tenant, std::vector<int>* fds = nullptr);
  // True once the daemon has closed its end (EOF or reset), waiting up to `timeout`.
  bool ClosedByPeer(std::chrono::milliseconds timeout);
  void Close();

 private:
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
};

}  // namespace kvtier::testing
