// Transport: socket connect, framing and the reply spin.
#include "transport.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "kvtier/fd_passing.h"

namespace kvtier::client_internal {
namespace {

std::string UserName(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  return pw ? std::string(pw->pw_name) + " (uid " + std::to_string(uid) + ")" : "uid " + std::to_string(uid);
}

std::string GroupName(gid_t gid) {
  const group* gr = ::getgrgid(gid);
  return gr ? std::string(gr->gr_name) + " (gid " + std::to_string(gid) + ")" : "gid " + std::to_string(gid);
}

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// connect() refused by the socket's (or its directory's) permissions: say who
// may open it and who the caller is, so the fix (a group, a socket) is obvious.
Status SocketPermissionDenied(const std::string& path, const std::string& error) {
  std::string msg = "cannot connect to kvtierd at " + path + ": " + error;
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    msg += "; the socket has mode " + Octal(st.st_mode) + ", owner " + UserName(st.st_uid) + ", group " +
           GroupName(st.st_gid) + ", and you are " + UserName(::geteuid()) +
           ": connect as a member of that group (or one access: allows), or use a socket you may open";
  } else {
    msg += "; a directory on the way to the socket does not let you in (" + std::string(std::strerror(errno)) + ")";
  }
  return Status(StatusCode::kPermissionDenied, msg);
}

}  // namespace

Result<uid_t> Transport::ExpectedServerUid() const {
  if (options_.server_uid) return static_cast<uid_t>(*options_.server_uid);
  if (const char* env = std::getenv("KVTIER_SERVER_UID"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const unsigned long v = std::strtoul(env, &end, 10);
    if (*end != '\0' || v > 0xfffffffful) return InvalidArgument(std::string("KVTIER_SERVER_UID='") + env + "' is not a uid");
    return static_cast<uid_t>(v);
  }
  const std::string& path = options_.socket_path;
  struct stat sock{}, dir{};
  const size_t slash = path.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::lstat(path.c_str(), &sock) != 0 || ::stat(parent.c_str(), &dir) != 0) {
    return Unavailable("cannot check who owns " + path + ": " + std::strerror(errno));
  }
  // Whoever may write the directory may have put the socket there: its owner
  // vouches for kvtierd only where no one else can.
  const bool others_write = (dir.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (others_write && sock.st_uid != 0 && sock.st_uid != dir.st_uid) {
    return Status(StatusCode::kPermissionDenied,
                  "the socket " + path + " (owner " + UserName(sock.st_uid) + ") is in " + parent + ", which others may write (mode " +
                      Octal(dir.st_mode) + "): anyone could have put it there. Set server_uid (or KVTIER_SERVER_UID) to "
                      "kvtierd's uid, or serve kvtierd from a directory only its user may write, such as /run/kvtier");
  }
  return sock.st_uid;
}

Status Transport::CheckServer() {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Unavailable(std::string("cannot learn who serves the socket (SO_PEERCRED): ") + std::strerror(errno));
  }
  auto expected = ExpectedServerUid();
  if (!expected.ok()) return expected.status();
  if (peer.uid == *expected || peer.uid == 0) return Status::Ok();
  return Status(StatusCode::kPermissionDenied,
                "the process serving " + options_.socket_path + " (pid " + std::to_string(peer.pid) + ") runs as " +
                    UserName(peer.uid) + ", but kvtierd runs as " + UserName(*expected) +
                    ": refusing to talk to an impostor (see ClientOptions::server_uid)");
}

Status Transport::Open() {
  Close();
  const auto deadline = Clock::now() + options_.connect_timeout;
  auto backoff = std::chrono::milliseconds(2);
  std::string last_error;
  for (;;) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return Internal(std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (options_.socket_path.size() >= sizeof(addr.sun_path)) {
      Close();
      return InvalidArgument("socket path too long: " + options_.socket_path);
    }
    std::strncpy(addr.sun_path, options_.socket_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      if (Status who = CheckServer(); !who.ok()) {
        Close();
        return who;
      }
      // At least 1 ms: a socket timeout of 0 means none (a request_timeout of
      // 0, or Python's 0.0005 s, waited forever), and a negative one is refused.
      const auto ms = std::max<std::chrono::milliseconds::rep>(1, options_.request_timeout.count());
      const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      return Status::Ok();
    }
    const int err = errno;
    last_error = std::strerror(err);
    Close();
    // Retrying cannot help a peer the socket's permissions keep out.
    if (err == EACCES || err == EPERM) return SocketPermissionDenied(options_.socket_path, last_error);
    if (Clock::now() + backoff > deadline) {
      return Unavailable("cannot connect to kvtierd at " + options_.socket_path + ": " + last_error +
                         " (is kvtierd running?)");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

void Transport::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  rbegin_ = rend_ = 0;
}

Status Transport::SendAll(const std::vector<uint8_t>& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Status(StatusCode::kTimeout, "kvtierd did not take a request in time");
    } else {
      return Unavailable(std::string("lost connection to kvtierd: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

ssize_t Transport::Receive(uint8_t* dst, size_t cap, int flags) {
  if (passed_ == nullptr) return ::recv(fd_, dst, cap, flags);
  return ReceiveWithFds(fd_, std::span<uint8_t>(dst, cap), passed_, kMaxPassedFds, flags);
}

// Polls for the reply while spin_ says so (reply_spin.h). Returns recv's
// result; -1 with EAGAIN when the caller should block in recv.
ssize_t Transport::SpinRecv(uint8_t* dst, size_t cap) {
  const auto now = Clock::now();
  const auto until = spin_.PollUntil(now);
  errno = EAGAIN;
  if (until == now) return -1;
  ssize_t n;
  while ((n = Receive(dst, cap, MSG_DONTWAIT)) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    if (const auto t = Clock::now(); t >= until) {
      spin_.Missed(t);
      errno = EAGAIN;
      return -1;
    }
    std::this_thread::yield();
  }
  if (n > 0) spin_.Found();
  return n;
}

// Reads exactly `len` bytes, through a buffer so a small reply costs one recv.
Status Transport::RecvAll(uint8_t* out, size_t len) {
  size_t off = 0;
  while (off < len) {
    if (rbegin_ < rend_) {
      const size_t k = std::min(len - off, rend_ - rbegin_);
      std::memcpy(out + off, rbuf_.data() + rbegin_, k);
      rbegin_ += k;
      off += k;
      continue;
    }
    const bool direct = len - off >= rbuf_.size();
    uint8_t* dst = direct ? out + off : rbuf_.data();
    const size_t cap = direct ? len - off : rbuf_.size();
    ssize_t n = SpinRecv(dst, cap);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) n = Receive(dst, cap, 0);
    if (n > 0) {
      if (direct) {
        off += static_cast<size_t>(n);
      } else {
        rbegin_ = 0;
        rend_ = static_cast<size_t>(n);
      }
    } else if (n == 0) {
      return Unavailable("lost connection to kvtierd: it closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Status(StatusCode::kTimeout, "kvtierd did not answer in time");
    } else if (errno != EINTR) {
      return Unavailable(std::string("lost connection to kvtierd: ") + std::strerror(errno));
    }
  }
  return Status::Ok();
}

Result<wire::Message> Transport::RoundTrip(const wire::Message& request, std::vector<int>* passed) {
  passed_ = passed;
  auto m = Exchange(request);
  passed_ = nullptr;
  return m;
}

Result<wire::Message> Transport::Exchange(const wire::Message& request) {
  const uint64_t id = next_request_++;
  std::vector<uint8_t> frame;
  const Status enc = wire::TryAppendFrame(frame, id, request);
  if (!enc.ok()) return enc;
  Status st = SendAll(frame);
  std::array<uint8_t, wire::kHeaderBytes> header{};
  if (st.ok()) st = RecvAll(header.data(), header.size());
  if (!st.ok()) {
    Close();
    return st;
  }
  auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(header));
  if (!h.ok()) {
    Close();
    return h.status();
  }
  std::vector<uint8_t> payload(h->payload_length);
  st = RecvAll(payload.data(), payload.size());
  if (!st.ok()) {
    Close();
    return st;
  }
  spin_.Replied(Clock::now());
  auto m = wire::DecodePayload(*h, payload);
  if (!m.ok() || (h->request_id != id && h->request_id != 0)) {
    Close();
    return m.ok() ? ProtocolError("reply to another request") : m.status();
  }
  return m;
}

}  // namespace kvtier::client_internal
