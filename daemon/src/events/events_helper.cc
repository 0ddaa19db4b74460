// The KV events helper process: the ZMQ sockets, the replay ring and the
// replay rate limit, fed batches by kvtierd over a socketpair (events_helper.h).
#include "events/events_helper.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvtier/event_stream.h"

namespace kvtier::daemon {
namespace {

// What a peer may send: a replay request is [empty, 8 bytes], a subscription a
// topic. A larger message closes its connection before it is buffered (two
// peers sending 700 MiB of a declared 1 GiB frame grew kvtierd by 1.4 GiB).
constexpr int64_t kMaxReplayMessage = 64;
constexpr int64_t kMaxSubscription = 4096;
// Replays answered, all peers together: a burst of kReplayBurst, then
// kReplaysPerSecond. A request past it gets the end marker alone (nothing
// replayed; the subscriber reports the batches lost), so a flood of requests
// costs the helper little and kvtierd nothing.
constexpr double kReplaysPerSecond = 20;
constexpr double kReplayBurst = 20;
// Below kvtierd's own priority: under a connection flood the helper's accepts
// take CPU the event loop would otherwise get.
constexpr int kNice = 5;

void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
void PutStr(std::string& out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

// Binds `s` to `endpoint`; an ipc:// socket file is born 0600 (whatever the
// umask), then gets the daemon socket's group and mode.
Status Bind(zmq::socket_t& s, const std::string& endpoint, const HelperConfig& c, const char* what) {
  const bool ipc = endpoint.starts_with("ipc://");
  const std::string path = ipc ? endpoint.substr(6) : std::string();
  const mode_t old = ::umask(0177);
  try {
    s.bind(endpoint);
  } catch (const zmq::error_t& e) {
    ::umask(old);
    return Unavailable(std::string("events: cannot bind ") + what + " '" + endpoint + "': " + e.what());
  }
  ::umask(old);
  if (!ipc) return Status::Ok();
  if (c.group_gid != 0xffffffffu && ::chown(path.c_str(), static_cast<uid_t>(-1), c.group_gid) != 0) {
    return Status(StatusCode::kPermissionDenied, "events: cannot give " + path + " to group " + c.group + ": " +
                                                     std::strerror(errno));
  }
  if (::chmod(path.c_str(), c.mode) != 0) {
    return Unavailable("events: cannot chmod " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

// The line for kvtierd; it is small, and kvtierd reads it, so a blocking write is enough.
void Tell(int fd, const std::string& line) {
  const int flags = ::fcntl(fd, F_GETFL);
  (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  (void)::fcntl(fd, F_SETFL, flags);
}

// Reads frames off the stream from kvtierd, as they come, without blocking.
class FrameReader {
 public:
  explicit FrameReader(int fd) : fd_(fd) {}
  enum class Got { kFrame, kNone, kEnd };
  // kFrame: header() and body() hold one frame. kNone: no whole frame yet.
  // kEnd: kvtierd closed the stream, or it is corrupt (error() says).
  Got Next() {
    for (;;) {
      if (have_header_ < sizeof header_) {
        const ssize_t n = ::recv(fd_, reinterpret_cast<char*>(&header_) + have_header_,
                                 sizeof header_ - have_header_, MSG_DONTWAIT);
        if (!Advance(n, have_header_)) return Again(n) ? Got::kNone : Got::kEnd;
        if (have_header_ < sizeof header_) continue;
        if (header_.size > kMaxFrameBody) {
          error_ = "a frame of " + std::to_string(header_.size) + " bytes";
          return Got::kEnd;
        }
        body_ = zmq::message_t(static_cast<size_t>(header_.size));
        have_body_ = 0;
      }
      if (have_body_ < body_.size()) {
        const ssize_t n =
            ::recv(fd_, static_cast<char*>(body_.data()) + have_body_, body_.size() - have_body_, MSG_DONTWAIT);
        if (!Advance(n, have_body_)) return Again(n) ? Got::kNone : Got::kEnd;
        if (have_body_ < body_.size()) continue;
      }
      have_header_ = 0;
      return Got::kFrame;
    }
  }
  const FrameHeader& header() const { return header_; }
  zmq::message_t& body() { return body_; }
  const std::string& error() const { return error_; }

 private:
  // False at EOF or an error (EAGAIN included: errno says which).
  static bool Advance(ssize_t n, size_t& have) {
    if (n > 0) {
      have += static_cast<size_t>(n);
      return true;
    }
    if (n < 0 && errno == EINTR) return true;
    return false;
  }
  // After Advance returned false: nothing more yet (rather than the end of the stream).
  static bool Again(ssize_t n) { return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK); }
  int fd_;
  FrameHeader header_;
  size_t have_header_ = 0;
  zmq::message_t body_;
  size_t have_body_ = 0;
  std::string error_;
};

zmq::message_t Shared(zmq::message_t& m) {
  zmq::message_t out;
  out.copy(m);
  return out;
}

class Helper {
 public:
  Helper(int fd, HelperCounters* counters, HelperConfig config)
      : fd_(fd), counters_(counters), config_(std::move(config)) {}

  Status Bind() {
    pub_.set(zmq::sockopt::linger, 0);
    pub_.set(zmq::sockopt::sndhwm, static_cast<int>(config_.queue_batches));
    pub_.set(zmq::sockopt::maxmsgsize, kMaxSubscription);
    KVTIER_RETURN_IF_ERROR(daemon::Bind(pub_, config_.publish, config_, "events.publish"));
    router_.set(zmq::sockopt::linger, 0);
    // A replay is at most replay_batches messages: queued whole, never dropped midway.
    router_.set(zmq::sockopt::sndhwm, static_cast<int>(config_.replay_batches + 16));
    router_.set(zmq::sockopt::maxmsgsize, kMaxReplayMessage);
    return daemon::Bind(router_, config_.replay, config_, "events.replay");
  }

  // Until kvtierd closes the stream: 0, or 1 if the stream was corrupt.
  int Run(FrameReader& reader) {
    std::array<zmq::pollitem_t, 2> items = {zmq::pollitem_t{nullptr, fd_, ZMQ_POLLIN, 0},
                                            zmq::pollitem_t{router_.handle(), 0, ZMQ_POLLIN, 0}};
    for (;;) {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      if (items[0].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
        for (;;) {
          const FrameReader::Got got = reader.Next();
          if (got == FrameReader::Got::kNone) break;
          if (got == FrameReader::Got::kEnd) {
            if (reader.error().empty()) return 0;
            std::fprintf(stderr, "kvtierd: error: events helper: %s from kvtierd\n", reader.error().c_str());
            return 1;
          }
          Batch(reader.header(), reader.body());
        }
      }
      if (items[1].revents & ZMQ_POLLIN) Replay();
    }
  }

 private:
  void Batch(const FrameHeader& h, zmq::message_t& body) {
    if (h.kind != static_cast<uint8_t>(FrameKind::kPublish) && h.kind != static_cast<uint8_t>(FrameKind::kKeep))
      return;
    if (config_.replay_batches > 0) {
      kept_.emplace_back(h.seq, Shared(body));
      if (kept_.size() > config_.replay_batches) kept_.pop_front();
    }
    if (h.kind != static_cast<uint8_t>(FrameKind::kPublish)) return;
    // PUB never blocks: past a subscriber's high-water mark its messages are dropped.
    const std::string seq8 = events::EncodeSeq(h.seq);
    std::array<zmq::message_t, 3> out = {zmq::message_t(config_.topic.data(), config_.topic.size()),
                                         zmq::message_t(seq8.data(), seq8.size()), Shared(body)};
    (void)zmq::send_multipart(pub_, out, zmq::send_flags::dontwait);
  }

  void Replay() {
    std::vector<zmq::message_t> req;
    (void)zmq::recv_multipart(router_, std::back_inserter(req));
    if (req.empty()) return;
    // [identity, empty, start]; anything else gets the end marker alone.
    uint64_t start = events::kReplayEnd;
    if (req.size() == 3 && req[1].size() == 0 && req[2].size() == events::kSeqBytes)
      start = events::DecodeSeq(req[2].data(), req[2].size());
    auto reply = [&](uint64_t seq, zmq::message_t batch) {
      const std::string seq8 = events::EncodeSeq(seq);
      zmq::message_t id = Shared(req[0]), seq_frame(seq8.data(), seq8.size());
      if (config_.vllm) {
        // vLLM's: [empty, topic, seq, batch]; the end marker's topic and batch are empty.
        zmq::message_t topic = seq == events::kReplayEnd ? zmq::message_t()
                                                         : zmq::message_t(config_.topic.data(), config_.topic.size());
        std::array<zmq::message_t, 5> out = {std::move(id), zmq::message_t(), std::move(topic), std::move(seq_frame),
                                             std::move(batch)};
        (void)zmq::send_multipart(router_, out, zmq::send_flags::dontwait);
        return;
      }
      std::array<zmq::message_t, 4> out = {std::move(id), zmq::message_t(), std::move(seq_frame), std::move(batch)};
      (void)zmq::send_multipart(router_, out, zmq::send_flags::dontwait);
    };
    const auto now = std::chrono::steady_clock::now();
    tokens_ = std::min(kReplayBurst, tokens_ + std::chrono::duration<double>(now - refilled_).count() * kReplaysPerSecond);
    refilled_ = now;
    if (tokens_ >= 1) {
      tokens_ -= 1;
      for (auto& [seq, batch] : kept_) {
        if (seq >= start) reply(seq, Shared(batch));
      }
      counters_->replays.fetch_add(1, std::memory_order_relaxed);
    } else {
      counters_->replays_refused.fetch_add(1, std::memory_order_relaxed);
    }
    reply(events::kReplayEnd, zmq::message_t());
  }

  int fd_;
  HelperCounters* counters_;
  HelperConfig config_;
  zmq::context_t context_{1};
  zmq::socket_t pub_{context_, zmq::socket_type::pub};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  // The last replay_batches batches, by seq. Sending one shares its bytes (zmq_msg_copy), never copies them.
  std::deque<std::pair<uint64_t, zmq::message_t>> kept_;
  double tokens_ = kReplayBurst;  // Replays that may be answered now (the token bucket above).
  std::chrono::steady_clock::time_point refilled_ = std::chrono::steady_clock::now();
};

}  // namespace

std::string HelperConfig::Encode() const {
  std::string out;
  PutStr(out, publish);
  PutStr(out, replay);
  PutStr(out, topic);
  PutU32(out, vllm ? 1 : 0);
  PutStr(out, group);
  PutU32(out, group_gid);
  PutU32(out, mode);
  PutU32(out, replay_batches);
  PutU32(out, queue_batches);
  return out;
}

Result<HelperConfig> HelperConfig::Decode(const std::string& bytes) {
  size_t at = 0;
  bool ok = true;
  auto u32 = [&]() -> uint32_t {
    uint32_t v = 0;
    if (bytes.size() - at < sizeof v) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
    return v;
  };
  auto str = [&]() -> std::string {
    const uint32_t n = u32();
    if (!ok || bytes.size() - at < n) {
      ok = false;
      return {};
    }
    std::string s = bytes.substr(at, n);
    at += n;
    return s;
  };
  HelperConfig c;
  c.publish = str();
  c.replay = str();
  c.topic = str();
  c.vllm = u32() != 0;
  c.group = str();
  c.group_gid = u32();
  c.mode = u32();
  c.replay_batches = u32();
  c.queue_batches = u32();
  if (!ok || at != bytes.size()) return InvalidArgument("events helper: a malformed configuration frame");
  return c;
}

int RunEventsHelper(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "kvtierd: %s is kvtierd's own, not for use by hand\n", kEventsHelperArg);
    return 2;
  }
  const int fd = std::atoi(argv[2]);
  const int shm = std::atoi(argv[3]);
  const pid_t parent = static_cast<pid_t>(std::atoll(argv[4]));
  // Never outlive kvtierd: killed when it dies (and it may have died before this line).
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 0;
  (void)::prctl(PR_SET_NAME, "kvtierd-events");
  (void)::setpriority(PRIO_PROCESS, 0, kNice);
  // A descriptor per subscriber connection: as many as the hard limit allows.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  auto* counters = static_cast<HelperCounters*>(
      ::mmap(nullptr, sizeof(HelperCounters), PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0));
  if (counters == MAP_FAILED) {
    Tell(fd, std::string("ERR events helper: cannot map its counters: ") + std::strerror(errno) + "\n");
    return 1;
  }
  ::close(shm);

  // The first frame is the configuration.
  FrameReader reader(fd);
  for (;;) {
    const FrameReader::Got got = reader.Next();
    if (got == FrameReader::Got::kEnd) return reader.error().empty() ? 0 : 1;
    if (got == FrameReader::Got::kFrame) break;
    pollfd p{fd, POLLIN, 0};
    (void)::poll(&p, 1, -1);
  }
  if (reader.header().kind != static_cast<uint8_t>(FrameKind::kConfig)) {
    Tell(fd, "ERR events helper: the first frame is not the configuration\n");
    return 1;
  }
  auto config = HelperConfig::Decode(reader.body().to_string());
  if (!config.ok()) {
    Tell(fd, "ERR " + config.status().message() + "\n");
    return 1;
  }
  try {
    Helper helper(fd, counters, std::move(config).value());
    const Status bound = helper.Bind();
    if (!bound.ok()) {
      Tell(fd, "ERR " + bound.message() + "\n");
      return 1;
    }
    Tell(fd, "OK\n");
    return helper.Run(reader);
  } catch (const zmq::error_t& e) {
    Tell(fd, std::string("ERR events helper: ") + e.what() + "\n");
    return 1;
  }
}

}  // namespace kvtier::daemon
