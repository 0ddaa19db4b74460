// kvtierd's side of the KV events helper: spawn, feed, reap, restart (events_link.h).
#include "events/events_link.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "log.h"

extern char** environ;

namespace kvtier::daemon {
namespace {

// The helper's descriptors: the stream, the counters' memfd.
constexpr int kHelperSock = 3;
constexpr int kHelperShm = 4;
// Asked of the stream's send buffer (the kernel caps it at net.core.wmem_max):
// most batches go in one write.
constexpr int kSendBuffer = 4 << 20;

std::string Describe(int status) {
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                  ::strsignal(WTERMSIG(status)) + ")";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended";
}

// `fd` moved to a number of at least 5, so that placing the helper's two at 3
// and 4 never overwrites one with the other.
int Above4(int fd) {
  if (fd > kHelperShm) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, kHelperShm + 1);
  ::close(fd);
  return moved;
}

}  // namespace

EventsLink::EventsLink(HelperConfig config, int shm, HelperCounters* counters)
    : config_(std::move(config)),
      config_frame_(std::make_shared<const std::string>(config_.Encode())),
      shm_(shm),
      counters_(counters) {}

Result<std::unique_ptr<EventsLink>> EventsLink::Start(HelperConfig config) {
  int shm = ::memfd_create("kvtierd-events-counters", MFD_CLOEXEC);
  if (shm < 0) return Internal(std::string("events: memfd_create: ") + std::strerror(errno));
  shm = Above4(shm);
  void* mem = MAP_FAILED;
  if (shm >= 0 && ::ftruncate(shm, sizeof(HelperCounters)) == 0) {
    mem = ::mmap(nullptr, sizeof(HelperCounters), PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
  }
  if (mem == MAP_FAILED) {
    const int err = errno;
    if (shm >= 0) ::close(shm);
    return Internal(std::string("events: the helper's counters: ") + std::strerror(err));
  }
  std::unique_ptr<EventsLink> link(new EventsLink(std::move(config), shm, new (mem) HelperCounters()));
  KVTIER_RETURN_IF_ERROR(link->Spawn());
  // Until the helper says it has bound both endpoints (or why it could not).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (link->said_.find('\n') == std::string::npos) {
    link->Pump();
    if (!link->Listen() || Clock::now() > deadline) break;
    pollfd p{link->sock_, static_cast<short>(POLLIN | (link->out_.empty() ? 0 : POLLOUT)), 0};
    (void)::poll(&p, 1, 100);
  }
  if (link->said_.starts_with("OK\n")) {
    link->said_.clear();
    return link;
  }
  std::string why = link->said_.starts_with("ERR ") ? link->said_.substr(4) : std::string();
  if (!why.empty() && why.back() == '\n') why.pop_back();
  if (why.empty()) why = "events: the helper process did not start";
  return Unavailable(why);  // The destructor stops and reaps the helper.
}

Status EventsLink::Spawn() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return Unavailable(std::string("events: socketpair: ") + std::strerror(errno));
  }
  const int child = Above4(pair[1]);
  (void)::setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &kSendBuffer, sizeof kSendBuffer);
  (void)::fcntl(pair[0], F_SETFL, ::fcntl(pair[0], F_GETFL) | O_NONBLOCK);
  // Its own executable, freshly: a fork of this multithreaded process could
  // inherit a lock some other thread held. Only the stream, the memfd and
  // stdin/out/err are passed; signals as a new process has them.
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  if (child >= 0) {
    posix_spawn_file_actions_adddup2(&fa, child, kHelperSock);
    posix_spawn_file_actions_adddup2(&fa, shm_, kHelperShm);
    posix_spawn_file_actions_addclosefrom_np(&fa, kHelperShm + 1);
  }
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const std::string sock = std::to_string(kHelperSock), shm = std::to_string(kHelperShm),
                    parent = std::to_string(::getpid());
  std::vector<char*> argv = {const_cast<char*>("kvtierd"), const_cast<char*>(kEventsHelperArg),
                             const_cast<char*>(sock.c_str()), const_cast<char*>(shm.c_str()),
                             const_cast<char*>(parent.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = child < 0 ? errno : ::posix_spawn(&pid, "/proc/self/exe", &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (child >= 0) ::close(child);
  if (rc != 0) {
    ::close(pair[0]);
    return Unavailable(std::string("events: cannot start the helper process: ") + std::strerror(rc));
  }
  sock_ = pair[0];
  pid_ = pid;
  broken_ = false;
  said_.clear();
  started_ = Clock::now();
  out_.clear();
  queued_batches_ = 0;
  Queue(FrameKind::kConfig, 0, config_frame_);
  for (const auto& [seq, batch] : kept_) Queue(FrameKind::kKeep, seq, batch);
  Pump();
  return Status::Ok();
}

EventsLink::~EventsLink() {
  stopping_ = true;
  if (pid_ > 0) {
    if (sock_ >= 0) ::close(sock_);  // EOF: the helper exits.
    sock_ = -1;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (!Reaped(false) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      (void)Reaped(true);
    }
  }
  if (sock_ >= 0) ::close(sock_);
  ::munmap(counters_, sizeof(HelperCounters));
  ::close(shm_);
}

void EventsLink::Queue(FrameKind kind, uint64_t seq, std::shared_ptr<const std::string> body) {
  Out o;
  o.header.size = body->size();
  o.header.seq = seq;
  o.header.kind = static_cast<uint8_t>(kind);
  o.body = std::move(body);
  if (kind == FrameKind::kPublish) ++queued_batches_;
  out_.push_back(std::move(o));
}

bool EventsLink::Send(uint64_t seq, std::shared_ptr<const std::string> batch) {
  if (sock_ < 0 || broken_ || queued_batches_ >= config_.queue_batches || batch->size() > kMaxFrameBody) return false;
  if (config_.replay_batches > 0) {
    kept_.emplace_back(seq, batch);
    if (kept_.size() > config_.replay_batches) kept_.pop_front();
  }
  Queue(FrameKind::kPublish, seq, std::move(batch));
  Pump();
  return true;
}

void EventsLink::Pump() {
  while (sock_ >= 0 && !broken_ && !out_.empty()) {
    Out& o = out_.front();
    const size_t total = sizeof o.header + o.body->size();
    iovec iov[2];
    int n_iov = 0;
    if (o.written < sizeof o.header) {
      iov[n_iov++] = {reinterpret_cast<char*>(&o.header) + o.written, sizeof o.header - o.written};
      iov[n_iov++] = {const_cast<char*>(o.body->data()), o.body->size()};
    } else {
      const size_t at = o.written - sizeof o.header;
      iov[n_iov++] = {const_cast<char*>(o.body->data()) + at, o.body->size() - at};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    const ssize_t n = ::sendmsg(sock_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) broken_ = true;  // EPIPE, ECONNRESET: the helper is ending.
      return;
    }
    o.written += static_cast<size_t>(n);
    if (o.written < total) return;  // The socket is full: the rest at the next tick.
    if (o.header.kind == static_cast<uint8_t>(FrameKind::kPublish)) --queued_batches_;
    out_.pop_front();
  }
}

bool EventsLink::Listen() {
  if (sock_ < 0) return false;
  char buf[256];
  for (;;) {
    const ssize_t n = ::recv(sock_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (said_.size() < 1024) said_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

bool EventsLink::Reaped(bool wait) {
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, wait ? 0 : WNOHANG);
  if (r == 0) return false;
  if (r < 0 && errno == EINTR) return false;
  Ended(r == pid_ ? status : 0, !wait);  // r < 0 (ECHILD): reaped by someone else; it is gone all the same.
  return true;
}

void EventsLink::Ended(int status, bool log) {
  (void)Listen();  // Its last words ("ERR ..."), if any.
  std::string why = Describe(status);
  const size_t err = said_.find("ERR ");
  if (err != std::string::npos) {
    std::string line = said_.substr(err + 4);
    if (const size_t nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
    why += ": " + Printable(line, 200);
  }
  const auto lived = Clock::now() - started_;
  if (lived >= kLivedLongEnough) backoff_ = kFirstBackoff;
  restart_at_ = Clock::now() + backoff_;
  if (log && !stopping_) LogLimited(LogLevel::kWarn, "events-helper",
             "KV events: the helper process (pid " + std::to_string(pid_) + ") " + why + "; batches are dropped until " +
                 "another starts, in " + std::to_string(backoff_.count()) + " ms");
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  pid_ = -1;
  if (sock_ >= 0) ::close(sock_);
  sock_ = -1;
  out_.clear();
  queued_batches_ = 0;
}

void EventsLink::Tick() {
  if (pid_ > 0) {
    Pump();
    if (!Listen()) broken_ = true;  // EOF: the helper is ending; reaped below or at a later tick.
    if (said_.size() > 64 && said_.find("ERR ") == std::string::npos) said_.clear();  // Only "OK"s: nothing to keep.
    (void)Reaped(false);
    return;
  }
  if (Clock::now() < restart_at_) return;
  const Status st = Spawn();
  if (st.ok()) {
    restarts_.fetch_add(1, std::memory_order_relaxed);
  } else {
    restart_at_ = Clock::now() + backoff_;
    LogLimited(LogLevel::kWarn, "events-helper",
               st.message() + "; trying again in " + std::to_string(backoff_.count()) + " ms");
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  }
}

}  // namespace kvtier::daemon
