// One connection to one Redis server (redis_node.h).
#include "redis/redis_node.h"

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>

namespace kvtier::stores::redis {
namespace {

using Clock = std::chrono::steady_clock;

// Commands appended before their replies are read, at most (one 2 MiB value
// always goes alone): bounds the copy hiredis keeps of a pipeline.
constexpr size_t kMaxPipelineBytes = 16u << 20;

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

// hiredis writes with write(2): a server that went away would raise SIGPIPE
// and end the process. Blocks it on this thread for the scope and swallows
// one it raised (one pending before is left alone).
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// hiredis reports a timed-out read or write (SO_RCVTIMEO/SO_SNDTIMEO) and a
// timed-out connect as REDIS_ERR_IO with strerror's text.
bool IsTimeout(int err, const char* errstr) {
  if (err != REDIS_ERR_IO) return false;
  const std::string_view s(errstr);
  return s == std::strerror(EAGAIN) || s == std::strerror(EWOULDBLOCK) || s == std::strerror(ETIMEDOUT);
}

}  // namespace

Result<HostPort> ParseHostPort(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument(quoted + " is not host:port (e.g. 127.0.0.1:6379)");
  }
  std::string_view host = text.substr(0, colon);
  const std::string_view port_text = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return InvalidArgument(quoted + ": unbalanced [ ] around the host");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return InvalidArgument(quoted + ": write an IPv6 host in brackets ([::1]:6379)");
  }
  int port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 1 || port > 65535) {
    return InvalidArgument(quoted + ": the port must be a number from 1 to 65535");
  }
  return HostPort{std::string(host), port};
}

std::string FormatHostPort(const HostPort& address) {
  const bool v6 = address.host.find(':') != std::string::npos;
  return (v6 ? "[" + address.host + "]" : address.host) + ":" + std::to_string(address.port);
}

RedisNode::RedisNode(HostPort address, const RedisStoreOptions& options, RedisCounters* counters)
    : host_(address.host),
      port_(address.port),
      address_(FormatHostPort(address)),
      options_(options),
      counters_(counters) {}

RedisNode::~RedisNode() { Close(); }

bool RedisNode::down() const { return ctx_ == nullptr && Clock::now() < retry_at_; }

void RedisNode::Close() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

void RedisNode::MarkDown(Status status) {
  Close();
  last_error_ = std::move(status);
  retry_at_ = Clock::now() + options_.reconnect_interval;
  counters_->node_errors.fetch_add(1, std::memory_order_relaxed);
}

Status RedisNode::ContextError() const {
  if (IsTimeout(ctx_->err, ctx_->errstr)) {
    return Status(StatusCode::kTimeout,
                  "redis node " + address_ + ": no answer within io_timeout (" + Millis(options_.io_timeout) + ")");
  }
  if (ctx_->err == REDIS_ERR_EOF) return Unavailable("redis node " + address_ + ": connection closed by the server");
  return Unavailable("redis node " + address_ + ": " + ctx_->errstr);
}

Status RedisNode::Connect() {
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, ToTimeval(options_.connect_timeout));
  if (c == nullptr) return Internal("redis node " + address_ + ": out of memory for a connection");
  if (c->err != 0) {
    Status s =
        IsTimeout(c->err, c->errstr)
            ? Status(StatusCode::kTimeout, "redis node " + address_ + ": no connection within connect_timeout (" +
                                               Millis(options_.connect_timeout) + ")")
            : Unavailable("redis node " + address_ + ": cannot connect: " + c->errstr);
    redisFree(c);
    return s;
  }
  ctx_ = c;
  if (redisSetTimeout(ctx_, ToTimeval(options_.io_timeout)) != REDIS_OK) {
    Status s = Unavailable("redis node " + address_ + ": cannot set io_timeout: " + ctx_->errstr);
    Close();
    return s;
  }
  if (options_.password.empty()) return Status::Ok();
  Command auth = {"AUTH"};
  if (!options_.user.empty()) auth.push_back(options_.user);
  auth.push_back(options_.password);
  std::vector<Reply> replies;
  Status s = Exchange({&auth, 1}, &replies);
  if (s.ok() && replies[0]->type == REDIS_REPLY_ERROR) {
    const std::string who = options_.user.empty() ? "the default user" : "user '" + options_.user + "'";
    s = Status(StatusCode::kPermissionDenied, "redis node " + address_ + ": AUTH as " + who + " refused (" +
                                                  std::string(replies[0]->str, replies[0]->len) +
                                                  "); check the user and password");
  }
  if (!s.ok()) Close();
  return s;
}

Status RedisNode::EnsureConnected(bool* fresh) {
  *fresh = false;
  if (ctx_ != nullptr) return Status::Ok();
  const auto now = Clock::now();
  if (now < retry_at_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now);
    return Status(last_error_.code(), last_error_.message() + " (down; next attempt in " + Millis(left) + ")");
  }
  *fresh = true;
  Status s = Connect();
  if (!s.ok()) {
    MarkDown(s);
    return s;
  }
  if (ever_connected_) counters_->reconnects.fetch_add(1, std::memory_order_relaxed);
  ever_connected_ = true;
  return Status::Ok();
}

Status RedisNode::Exchange(std::span<const Command> commands, std::vector<Reply>* replies) {
  ScopedSigpipeBlock no_sigpipe;
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
  size_t sent = 0;
  while (replies->size() < commands.size()) {
    size_t bytes = 0;
    while (sent < commands.size() && (sent == replies->size() || bytes < kMaxPipelineBytes)) {
      argv.clear();
      argvlen.clear();
      for (const std::string_view arg : commands[sent]) {
        argv.push_back(arg.data());
        argvlen.push_back(arg.size());
        bytes += arg.size();
      }
      if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), argvlen.data()) != REDIS_OK) {
        return ContextError();
      }
      ++sent;
    }
    while (replies->size() < sent) {
      void* reply = nullptr;
      if (redisGetReply(ctx_, &reply) != REDIS_OK || reply == nullptr) {
        if (reply != nullptr) freeReplyObject(reply);
        return ContextError();
      }
      replies->emplace_back(static_cast<redisReply*>(reply));
    }
  }
  return Status::Ok();
}

PipelineResult RedisNode::Pipeline(std::span<const Command> commands) {
  PipelineResult r;
  for (int attempt = 0;; ++attempt) {
    const bool reused = ctx_ != nullptr;
    r.status = EnsureConnected(&r.fresh_failure);
    if (!r.status.ok()) return r;
    r.replies.clear();
    r.status = Exchange(commands, &r.replies);
    if (r.status.ok()) return r;
    r.replies.clear();
    r.fresh_failure = true;
    if (attempt == 0 && reused && r.status.code() == StatusCode::kUnavailable) {
      // Closed while idle (a restarted server): one new connection, at once.
      Close();
      counters_->node_errors.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    MarkDown(r.status);
    return r;
  }
}

}  // namespace kvtier::stores::redis
