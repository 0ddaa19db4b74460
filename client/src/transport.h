// Transport: the socket to kvtierd and the frames on it — connecting (with
// retries, and a diagnosis when permissions keep the caller out), one request
// and its reply at a time, and the reply spin (reply_spin.h).
//
// Not thread-safe: its owner (Connection) serializes every call. A request and its
// reply are a blocking exchange with SO_SNDTIMEO/SO_RCVTIMEO = request_timeout,
// so a reply wakes the caller straight from recv, as in a bare ping-pong.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/client_options.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"
#include "reply_spin.h"

namespace kvtier::client_internal {

class Transport {
 public:
  explicit Transport(const ClientOptions& options) : options_(options) {}
  ~Transport() { Close(); }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Closes any socket, then connects to options.socket_path, retrying with
  // backoff until connect_timeout (the daemon may be starting). kUnavailable
  // when nothing answers in time, kPermissionDenied (naming the socket's owner,
  // group and mode and the caller) when its permissions keep the caller out,
  // or when the process that accepted runs as another uid than kvtierd's
  // (ClientOptions::server_uid).
  Status Open();
  void Close();
  bool connected() const { return fd_ >= 0; }

  // One request and its reply (an ErrorResponse is a reply). A failure of the
  // transport itself (send, receive, a malformed frame, a reply to another
  // request) closes the socket and is returned. REQUIRES: connected().
  // With `passed`, descriptors that arrive with the reply (SCM_RIGHTS: the
  // Welcome's segments) are appended to it; the caller owns them. Without,
  // none are accepted (the kernel discards them).
  Result<wire::Message> RoundTrip(const wire::Message& request, std::vector<int>* passed = nullptr);

 private:
  using Clock = std::chrono::steady_clock;

  static constexpr size_t kMaxPassedFds = 16;  // More than a Welcome sends (kTierCount pools, index, fences).
  Result<wire::Message> Exchange(const wire::Message& request);
  Status SendAll(const std::vector<uint8_t>& bytes);
  Status RecvAll(uint8_t* out, size_t len);
  ssize_t SpinRecv(uint8_t* dst, size_t cap);
  // recv, or recvmsg collecting descriptors into passed_ while it is set.
  ssize_t Receive(uint8_t* dst, size_t cap, int flags);
  // The uid the peer must run as: ClientOptions::server_uid, $KVTIER_SERVER_UID
  // or the socket's owner in a directory only its owner can write.
  Result<uid_t> ExpectedServerUid() const;
  Status CheckServer();

  const ClientOptions& options_;  // The owning Connection's; outlives this.
  int fd_ = -1;
  std::vector<uint8_t> rbuf_ = std::vector<uint8_t>(64 * 1024);  // Receive buffer.
  size_t rbegin_ = 0, rend_ = 0;                                 // Unread bytes in rbuf_.
  uint64_t next_request_ = 1;
  std::vector<int>* passed_ = nullptr;  // Set during a RoundTrip that takes descriptors.
  ReplySpin spin_{options_.reply_spin};
};

}  // namespace kvtier::client_internal
