// The attack suite's raw connection and memory probe (attack.h).
#include "attack.h"

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "kvtier/fd_passing.h"

namespace kvtier::testing {

double StatOf(Client& c, const std::string& name) {
  auto s = c.Stats();
  if (!s.ok()) return -1;
  for (const auto& [k, v] : *s) {
    if (k == name) return v;
  }
  return -1;
}

int RunAs(uint32_t uid, const std::function<int()>& body, const std::vector<gid_t>& groups) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(100);
    ::_exit(body());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

long VmRssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

Result<RawConnection> RawConnection::Open(const std::string& socket_path) {
  RawConnection c;
  c.fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c.fd_ < 0) return Internal(std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(c.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Unavailable("connect " + socket_path + ": " + std::strerror(errno));
  }
  return c;
}

RawConnection::RawConnection(RawConnection&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), buffer_(std::move(o.buffer_)) {}

RawConnection& RawConnection::operator=(RawConnection&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    buffer_ = std::move(o.buffer_);
  }
  return *this;
}

RawConnection::~RawConnection() { Close(); }

void RawConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool RawConnection::SendBytes(const std::vector<uint8_t>& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool RawConnection::Send(uint64_t request_id, const wire::Message& m) {
  std::vector<uint8_t> frame;
  if (!wire::TryAppendFrame(frame, request_id, m).ok()) return false;
  return SendBytes(frame);
}

Result<wire::Message> RawConnection::Receive(std::chrono::milliseconds timeout, std::vector<int>* fds) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (buffer_.size() >= wire::kHeaderBytes) {
      auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(buffer_.data(), wire::kHeaderBytes));
      if (!h.ok()) return h.status();
      const size_t frame = wire::kHeaderBytes + h->payload_length;
      if (buffer_.size() >= frame) {
        auto m = wire::DecodePayload(*h, std::span<const uint8_t>(buffer_.data() + wire::kHeaderBytes, h->payload_length));
        buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<ptrdiff_t>(frame));
        return m;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status(StatusCode::kTimeout, "no reply in time");
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    uint8_t chunk[64 * 1024];
    const ssize_t n = ReceiveWithFds(fd_, chunk, fds, 64);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Unavailable("kvtierd closed the connection");
    buffer_.insert(buffer_.end(), chunk, chunk + n);
  }
}

Result<wire::Welcome> RawConnection::Hello(const std::string& tenant, std::vector<int>* fds) {
  wire::Hello h;
  h.client_name = "attacker";
  h.pid = static_cast<uint32_t>(::getpid());
  h.tenant = tenant;
  if (!Send(1, h)) return Unavailable("kvtierd closed the connection before Hello");
  auto m = Receive(std::chrono::seconds(10), fds);
  if (!m.ok()) return m.status();
  if (const auto* e = std::get_if<wire::ErrorResponse>(&*m)) return wire::ToStatus(*e);
  const auto* w = std::get_if<wire::Welcome>(&*m);
  if (w == nullptr) return ProtocolError("Hello was not answered with Welcome");
  return *w;
}

bool RawConnection::ClosedByPeer(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint8_t sink[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd_, sink, sizeof sink, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
}

}  // namespace kvtier::testing
