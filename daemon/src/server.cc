// Server: the socket, framing, parked requests, timers, signals and reloads (server.h).
#include "server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

#include "log.h"
#include "metrics_http.h"
#include "notify.h"
#include "service.h"

namespace kvtier::daemon {

namespace asio = boost::asio;
using asio::local::stream_protocol;

namespace {

// True if something accepts connections on `path` right now.
bool SocketIsLive(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

// Runs the loop until it has no work. After handling something it keeps
// polling (non-blocking, yielding) for `spin_us` before it blocks in epoll_wait
// again: a client's next request often follows within microseconds, and a
// thread that went to sleep pays a wake-up (an inter-processor interrupt, on a
// VM an exit) that costs more than the request. `spin_us` (busy_poll_us) is read
// anew after each burst, so a reload changes it at once; 0 never polls. No
// polling while copies run: their completions wake the loop anyway, and the
// host backend's copy thread needs the CPU more.
template <typename CopiesRunning>
void RunLoop(asio::io_context& io, const uint32_t& spin_us, CopiesRunning copies_running) {
  while (io.run_one() > 0) {
    const auto spin = std::chrono::microseconds(spin_us);
    auto until = std::chrono::steady_clock::now() + spin;
    while (!io.stopped() && std::chrono::steady_clock::now() < until && !copies_running()) {
      if (io.poll() > 0) {
        until = std::chrono::steady_clock::now() + spin;
      } else {
        std::this_thread::yield();  // A client on this CPU runs meanwhile.
      }
    }
    if (io.stopped()) break;
  }
}

}  // namespace

class Connection;

// How often systemd's STATUS= line is refreshed (only sent when it changed).
constexpr auto kStatusPeriod = std::chrono::seconds(5);
// The largest frame a connection may send before its Hello (a Hello is a few
// strings of at most wire::kMaxString bytes).
constexpr uint32_t kMaxFrameBeforeHello = 64 * 1024;
// After an accept failed for want of descriptors or memory, the next waits this
// long, doubling up to kAcceptBackoffMax; an accept that succeeds resets it.
constexpr auto kAcceptBackoffMin = std::chrono::milliseconds(10);
constexpr auto kAcceptBackoffMax = std::chrono::milliseconds(1000);

struct Server::Impl {
  Impl(Service& s, const DaemonConfig& c, ConfigSource r)
      : service(s),
        config(c),
        reload_source(std::move(r)),
        acceptor(io),
        signals(io, SIGINT, SIGTERM),
        reload_signal(io, SIGHUP),
        ticker(io),
        accept_timer(io),
        watchdog(io),
        status_timer(io) {}

  Service& service;
  DaemonConfig config;  // The effective configuration; a reload replaces it.
  ConfigSource reload_source;
  asio::io_context io;
  stream_protocol::acceptor acceptor;
  asio::signal_set signals;
  asio::signal_set reload_signal;
  asio::steady_timer ticker;
  asio::steady_timer accept_timer;  // The wait after an accept that failed (AcceptFailed).
  std::chrono::milliseconds accept_backoff{0};
  bool accept_waiting = false;  // accept_timer runs; no accept is pending.
  asio::steady_timer watchdog;
  asio::steady_timer status_timer;
  std::unique_ptr<MetricsEndpoint> metrics;  // Null unless metrics.listen is set.
  std::unordered_set<std::shared_ptr<Connection>> connections;
  std::atomic<bool> poll_posted{false};
  std::string status;  // The last STATUS= sent.
  bool listening = false;
  bool stopping = false;

  // Connections whose current request waits for GPU room (Reply::deferred),
  // oldest first. Retried after copies complete and at every tick.
  std::deque<std::weak_ptr<Connection>> parked;
  void ResumeParked();

  void Accept();
  // Accepts again, at once or (out of descriptors or memory) after a backoff.
  void AcceptFailed(const boost::system::error_code& ec);
  // Closes a connection past max_clients + kConnectionsBeforeHello at once.
  void RefuseOverLimit(stream_protocol::socket& socket);
  // A connection closed, and its descriptor is free: an accept waiting out a
  // backoff goes ahead now.
  void ConnectionClosed();
  void ScheduleTick();
  // Closes connections that sent no Hello within limits.hello_timeout_ms.
  void CloseSilentConnections();
  // Closes connections that held an incomplete frame for limits.frame_timeout_ms.
  void CloseStalledConnections();
  void WaitForReload();
  void Reload();
  void ScheduleWatchdog(std::chrono::microseconds interval);
  void ScheduleStatus();
  void Shutdown(const char* why);
  // The backend can no longer copy: logs why and exits with status 1 at once
  // (systemd's Restart=on-failure starts a fresh kvtierd). No orderly
  // shutdown: draining would wait for fences that never complete, and the
  // last periodic warm snapshot stands.
  [[noreturn]] void BackendFailed(const Status& why);
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl& server, stream_protocol::socket socket)
      : server_(server), socket_(std::move(socket)) {
    client_.id = server_.service.NextClientId();
  }

  bool welcomed() const { return client_.welcomed; }
  std::chrono::steady_clock::time_point accepted() const { return accepted_; }
  // When the frame being received began to arrive, while one is incomplete and
  // more of it is being read; unset while nothing is read (reading paused for
  // the reply backlog, or a request parked).
  std::optional<std::chrono::steady_clock::time_point> partial_since() const { return partial_since_; }
  // Since when its reading is paused for unread replies; unset while it is not.
  std::optional<std::chrono::steady_clock::time_point> paused_since() const {
    return paused_ ? std::optional(paused_since_) : std::nullopt;
  }
  // "client 7 (worker-3)", for the log.
  std::string Describe() const {
    return "client " + std::to_string(client_.id) + " (" + (client_.name.empty() ? "no hello" : client_.name) + ")";
  }

  void Start() {
    if (refused_) Send(0, wire::FromStatus(why_refused_));
    if (!closed_) Read();
  }
  void SetPeer(const PeerCredentials& peer) { client_.peer = peer; }
  // The peer may not use kvtierd: it gets `why` (permission_denied) at once,
  // and the connection ends once its first bytes (its Hello, usually on its way
  // already) arrived. Closing first would fail its Hello with EPIPE before it
  // could read why.
  void Refuse(const Status& why) {
    refused_ = true;
    why_refused_ = why;
  }

  // Retries the request that waits for GPU room. True while it still waits.
  bool Resume() {
    if (closed_ || !parked_) return false;
    Reply reply = server_.service.Handle(client_, parked_->request);
    if (reply.deferred) return true;
    const Parked p = std::move(*parked_);
    parked_.reset();
    if (Answer(p.request_id, p.type, reply, p.start) && HandleFrames() == Next::kRead) Read();
    return false;
  }

  // Ends the connection now (shutdown); its leases end with it.
  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.shutdown(stream_protocol::socket::shutdown_both, ec);
    socket_.close(ec);
    server_.service.Disconnect(client_);
    server_.connections.erase(shared_from_this());
    server_.ConnectionClosed();
  }

 private:
  // Reads whatever the peer sent into in_ (one syscall usually brings a whole
  // request), then handles every complete frame in it. The buffer grows with
  // the bytes that arrived, never with what a header declares: it makes room
  // for a read chunk, or for as many bytes as the frame has brought so far (a
  // large frame takes a few reads, the buffer at most doubling each time), but
  // not past the end of the frame.
  void Read() {
    const size_t want = std::max(kReadChunk, std::min(in_end_ - in_begin_, frame_rest_));
    if (in_.size() - in_end_ < want) {
      if (in_begin_ > 0) {
        std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
        in_end_ -= in_begin_;
        in_begin_ = 0;
      }
      if (in_.size() - in_end_ < want) in_.resize(in_end_ + want);
    }
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(in_.data() + in_end_, in_.size() - in_end_),
                            [this, self](boost::system::error_code ec, size_t n) {
                              if (ec) return Close();
                              in_end_ += n;
                              if (HandleFrames() == Next::kRead) Read();
                            });
  }

  enum class Next {
    kRead,    // Read more.
    kParked,  // A request waits for GPU room; Resume goes on (nothing is read meanwhile).
    kPaused,  // The reply backlog is too long; Write goes on once it drained (nothing is read meanwhile).
    kClosing,
  };

  // Handles the complete frames in in_, in order, while the replies not yet
  // sent stay within limits.max_reply_backlog_bytes: past it, a peer that does
  // not read what it asked for gets nothing more handled or read until they
  // drain, so what it costs is bounded by the backlog and the socket buffers.
  Next HandleFrames() {
    if (refused_) {
      // What it sent is read (closing with unread bytes would reset the peer
      // before it read the error), discarded, and the connection ends.
      in_begin_ = in_end_ = 0;
      close_after_write_ = true;
      if (out_.empty()) Close();
      return Next::kClosing;
    }
    bool progressed = false;  // A frame was handled.
    size_t rest = 0;          // Bytes the incomplete frame still lacks, once its header is in.
    for (;;) {
      if (closed_) return Next::kClosing;
      if (unsent_ > server_.config.max_reply_backlog_bytes) {
        if (!paused_) paused_since_ = std::chrono::steady_clock::now();
        paused_ = true;
        partial_since_.reset();
        return Next::kPaused;
      }
      if (in_end_ - in_begin_ < wire::kHeaderBytes) break;
      const uint8_t* at = in_.data() + in_begin_;
      auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(at, wire::kHeaderBytes));
      if (!h.ok()) return Fail(0, h.status());
      if (h->payload_length > server_.config.max_frame_bytes) {
        return Fail(h->request_id, ResourceExhausted("frame of " + std::to_string(h->payload_length) +
                                                     " bytes exceeds limits.max_frame_bytes (" +
                                                     std::to_string(server_.config.max_frame_bytes) + ")"));
      }
      if (!client_.welcomed && h->payload_length > kMaxFrameBeforeHello) {
        return Fail(h->request_id, ResourceExhausted("frame of " + std::to_string(h->payload_length) +
                                                     " bytes before Hello; at most " +
                                                     std::to_string(kMaxFrameBeforeHello) + " may come before it"));
      }
      const size_t frame = wire::kHeaderBytes + h->payload_length;
      if (in_end_ - in_begin_ < frame) {
        rest = frame - (in_end_ - in_begin_);
        break;  // Wait for the rest.
      }
      auto msg = wire::DecodePayload(*h, std::span<const uint8_t>(at + wire::kHeaderBytes, h->payload_length));
      in_begin_ += frame;
      progressed = true;
      if (!msg.ok()) return Fail(h->request_id, msg.status());
      const auto start = std::chrono::steady_clock::now();
      Reply reply = server_.service.Handle(client_, *msg);
      if (reply.deferred) {
        parked_ = Parked{h->request_id, h->type, std::move(*msg), start};
        server_.parked.push_back(shared_from_this());
        partial_since_.reset();
        return Next::kParked;
      }
      if (!Answer(h->request_id, h->type, reply, start)) return Next::kClosing;
    }
    frame_rest_ = rest;
    if (in_begin_ == in_end_) {
      in_begin_ = in_end_ = 0;
      partial_since_.reset();
      if (in_.size() > kKeptBuffer) std::vector<uint8_t>().swap(in_);  // A large frame's room is not kept.
    } else if (progressed || !partial_since_) {
      partial_since_ = std::chrono::steady_clock::now();  // A new frame begins.
    }
    return Next::kRead;
  }

  // Sends the reply to a request that arrived at `start`. False if the
  // connection closes after it.
  bool Answer(uint64_t request_id, wire::MessageType type, const Reply& reply,
              std::chrono::steady_clock::time_point start) {
    if (reply.fds.empty()) {
      Send(request_id, reply.message);
    } else if (!SendWithDescriptors(request_id, reply.message, reply.fds)) {
      return false;
    }
    server_.service.ObserveRequest(type, std::chrono::steady_clock::now() - start);
    if (reply.close) {
      const auto* err = std::get_if<wire::ErrorResponse>(&reply.message);
      LogLimited(LogLevel::kWarn, "reply closes",
                 "client " + std::to_string(client_.id) + ": " + (err ? wire::ToStatus(*err).ToString() : "closing"));
      close_after_write_ = true;
      return false;
    }
    return !closed_;
  }

  // A protocol violation: answer with the error, then close.
  Next Fail(uint64_t request_id, const Status& st) {
    server_.service.CountBadFrame();
    LogLimited(LogLevel::kWarn, "bad frame", Describe() + ": bad frame: " + st.ToString() + "; closing the connection");
    Send(request_id, wire::FromStatus(st));
    close_after_write_ = true;
    return Next::kClosing;
  }

  // Queues a reply. Reading pauses past the backlog limit (HandleFrames), so
  // this only finds kReplyCloseFactor times the limit unsent if something
  // sends without asking: it closes the connection then.
  void Send(uint64_t request_id, const wire::Message& m) {
    if (closed_) return;
    const uint64_t limit = uint64_t{kReplyCloseFactor} * server_.config.max_reply_backlog_bytes;
    if (unsent_ > limit) {
      LogLimited(LogLevel::kWarn, "reply backlog",
                 Describe() + ": " + std::to_string(unsent_) + " bytes of replies unsent, more than " +
                     std::to_string(kReplyCloseFactor) + " x limits.max_reply_backlog_bytes; closing the connection");
      return Close();
    }
    std::vector<uint8_t> frame;
    wire::AppendFrame(frame, request_id, m);
    unsent_ += frame.size();
    out_.push_back(std::move(frame));
    if (out_.size() == 1) Write();
  }

  // Sends the frame's first bytes with `fds` attached (SCM_RIGHTS), the rest
  // as any frame. Only the first frame of a connection (the Welcome) carries
  // descriptors, so nothing is queued before it. False (and closing) if the
  // kernel would not take them.
  bool SendWithDescriptors(uint64_t request_id, const wire::Message& m, const std::vector<int>& fds) {
    std::vector<uint8_t> frame;
    wire::AppendFrame(frame, request_id, m);
    if (!out_.empty()) {
      LogError("client " + std::to_string(client_.id) + ": descriptors to send behind queued replies; closing");
      Close();
      return false;
    }
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    iovec iov{frame.data(), frame.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    ssize_t n;
    do {
      n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      LogWarn("client " + std::to_string(client_.id) + ": cannot pass its segments: " +
              (n < 0 ? std::strerror(errno) : "nothing sent") + "; closing");
      Close();
      return false;
    }
    if (static_cast<size_t>(n) < frame.size()) {
      frame.erase(frame.begin(), frame.begin() + n);
      unsent_ += frame.size();
      out_.push_back(std::move(frame));
      Write();
    }
    return true;
  }

  void Write() {
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_.front()), [this, self](boost::system::error_code ec, size_t) {
      if (ec) return Close();
      unsent_ -= out_.front().size();
      out_.pop_front();
      if (!out_.empty()) {
        Write();
      } else if (close_after_write_) {
        return Close();
      }
      if (paused_ && unsent_ <= server_.config.max_reply_backlog_bytes) {
        paused_ = false;  // Drained enough: handle and read requests again.
        if (HandleFrames() == Next::kRead) Read();
      }
    });
  }

  struct Parked {
    uint64_t request_id = 0;
    wire::MessageType type{};
    wire::Message request;
    std::chrono::steady_clock::time_point start;
  };

  Server::Impl& server_;
  stream_protocol::socket socket_;
  ClientState client_;
  std::optional<Parked> parked_;  // The request waiting for GPU room, if any.
  static constexpr size_t kReadChunk = 64 * 1024;
  static constexpr size_t kKeptBuffer = 4 * kReadChunk;  // An empty in_ larger than this is freed.
  std::vector<uint8_t> in_;  // Bytes received: [in_begin_, in_end_) not yet handled.
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  size_t frame_rest_ = 0;  // Bytes the incomplete frame in in_ still lacks (0: its header is not in yet).
  std::optional<std::chrono::steady_clock::time_point> partial_since_;
  std::deque<std::vector<uint8_t>> out_;
  uint64_t unsent_ = 0;  // Bytes in out_.
  bool paused_ = false;  // Nothing is read until out_ drains (Next::kPaused).
  std::chrono::steady_clock::time_point paused_since_;
  bool close_after_write_ = false;
  bool closed_ = false;
  bool refused_ = false;
  Status why_refused_;
  std::chrono::steady_clock::time_point accepted_ = std::chrono::steady_clock::now();
};

void Server::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec, stream_protocol::socket socket) {
    if (ec == asio::error::operation_aborted || stopping) return;
    if (ec) return AcceptFailed(ec);
    accept_backoff = std::chrono::milliseconds(0);
    if (connections.size() >= size_t{config.max_clients} + kConnectionsBeforeHello) {
      RefuseOverLimit(socket);
      return Accept();
    }
    // Who the peer is, from the kernel; one not allowed gets a permission_denied
    // error frame (request id 0) and is closed before anything else.
    auto peer = GetPeerCredentials(socket.native_handle());
    Status allowed = peer.ok() ? service.access().CheckConnect(*peer) : peer.status();
    if (!allowed.ok()) {
      service.CountRefused();
      LogLimited(LogLevel::kWarn, "refused", "refused a connection: " + allowed.message());
    }
    auto conn = std::make_shared<Connection>(*this, std::move(socket));
    if (allowed.ok()) conn->SetPeer(*peer); else conn->Refuse(allowed);
    connections.insert(conn);
    conn->Start();
    Accept();
  });
}

void Server::Impl::AcceptFailed(const boost::system::error_code& ec) {
  // A peer gone before it was accepted: accept the next one at once. Anything
  // else (EMFILE, ENFILE, ENOBUFS, ENOMEM above all) would fail again at once,
  // the connection still queued and the socket still readable: wait first.
  if (ec == asio::error::connection_aborted || ec == asio::error::interrupted) {
    LogLimited(LogLevel::kDebug, "accept", "accept: " + ec.message());
    return Accept();
  }
  accept_backoff = std::clamp(accept_backoff * 2, kAcceptBackoffMin, kAcceptBackoffMax);
  LogLimited(LogLevel::kWarn, "accept",
             "accept: " + ec.message() + " (" + std::to_string(connections.size()) +
                 " connections open); accepting again in " + std::to_string(accept_backoff.count()) + " ms");
  accept_waiting = true;
  accept_timer.expires_after(accept_backoff);
  accept_timer.async_wait([this](boost::system::error_code wait_ec) {
    // ConnectionClosed may have accepted already (even after the timer expired).
    if (wait_ec || stopping || !accept_waiting) return;
    accept_waiting = false;
    Accept();
  });
}

void Server::Impl::ConnectionClosed() {
  if (!accept_waiting || stopping) return;
  accept_waiting = false;
  accept_timer.cancel();
  Accept();
}

void Server::Impl::RefuseOverLimit(stream_protocol::socket& socket) {
  service.CountOverLimit();
  const std::string why = "kvtierd holds " + std::to_string(connections.size()) +
                          " connections, the most it takes (limits.max_clients " + std::to_string(config.max_clients) +
                          ", and " + std::to_string(kConnectionsBeforeHello) + " more before their Hello)";
  LogLimited(LogLevel::kWarn, "over limit", "refused a connection at accept: " + why);
  // The reason goes out if the socket takes it without waiting; then it closes.
  std::vector<uint8_t> frame;
  wire::AppendFrame(frame, 0, wire::FromStatus(ResourceExhausted(why)));
  (void)!::send(socket.native_handle(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  boost::system::error_code ignored;
  socket.close(ignored);
}

void Server::Impl::ResumeParked() {
  if (parked.empty()) return;
  std::deque<std::weak_ptr<Connection>> waiting;
  waiting.swap(parked);
  // Oldest first; a resumed connection may park its next request meanwhile,
  // behind those still waiting.
  std::deque<std::weak_ptr<Connection>> still;
  for (const auto& w : waiting) {
    if (auto c = w.lock(); c && c->Resume()) still.push_back(c);
  }
  for (auto& w : parked) still.push_back(std::move(w));
  parked.swap(still);
}

void Server::Impl::CloseSilentConnections() {
  const auto deadline = std::chrono::steady_clock::now() - std::chrono::milliseconds(config.hello_timeout_ms);
  std::vector<std::shared_ptr<Connection>> silent;
  for (const auto& c : connections) {
    if (!c->welcomed() && c->accepted() < deadline) silent.push_back(c);
  }
  for (const auto& c : silent) {
    LogLimited(LogLevel::kWarn, "hello timeout",
               "closing a connection that sent no Hello within limits.hello_timeout_ms (" +
                   std::to_string(config.hello_timeout_ms) + " ms)");
    c->Close();
  }
}

void Server::Impl::CloseStalledConnections() {
  const auto deadline = std::chrono::steady_clock::now() - std::chrono::milliseconds(config.frame_timeout_ms);
  std::vector<std::shared_ptr<Connection>> stalled;
  for (const auto& c : connections) {
    if (const auto since = c->partial_since(); since && *since < deadline) stalled.push_back(c);
  }
  for (const auto& c : stalled) {
    LogLimited(LogLevel::kWarn, "frame timeout",
               c->Describe() + ": closing the connection: a frame begun more than limits.frame_timeout_ms (" +
                   std::to_string(config.frame_timeout_ms) + " ms) ago is still incomplete");
    c->Close();
  }
  // A client that leaves its replies unread that long (reading it is paused
  // past max_reply_backlog_bytes) holds its backlog for nothing: closed too.
  std::vector<std::shared_ptr<Connection>> unread;
  for (const auto& c : connections) {
    if (const auto since = c->paused_since(); since && *since < deadline) unread.push_back(c);
  }
  for (const auto& c : unread) {
    LogLimited(LogLevel::kWarn, "reply timeout",
               c->Describe() + ": closing the connection: its replies went unread for more than "
                               "limits.frame_timeout_ms (" + std::to_string(config.frame_timeout_ms) + " ms)");
    c->Close();
  }
}

void Server::Impl::ScheduleTick() {
  ticker.expires_after(std::chrono::milliseconds(config.tick_ms));
  ticker.async_wait([this](boost::system::error_code ec) {
    if (ec || stopping) return;
    if (const Status health = service.backend().Health(); !health.ok()) BackendFailed(health);
    service.Tick();
    ResumeParked();
    CloseSilentConnections();
    CloseStalledConnections();
    ScheduleTick();
  });
}

void Server::Impl::WaitForReload() {
  reload_signal.async_wait([this](boost::system::error_code ec, int) {
    if (ec || stopping) return;
    Reload();
    WaitForReload();
  });
}

void Server::Impl::Reload() {
  notify::Reloading();
  auto loaded = reload_source();
  if (!loaded.ok()) {
    service.CountReload(false);
    LogError("reload rejected, the running configuration stays: " + loaded.status().message());
  } else {
    ReloadPlan plan = PlanReload(config, *loaded);
    for (const std::string& k : plan.kept) {
      LogWarn("reload: " + k + " cannot change while kvtierd runs; keeping the running value (restart to apply)");
    }
    const Status st = service.Reconfigure(plan.next);
    service.CountReload(st.ok());
    if (!st.ok()) {
      LogError("reload rejected, the running configuration stays: " + st.message());
    } else {
      config = plan.next;
      std::string applied;
      for (const std::string& a : plan.applied) applied += (applied.empty() ? "" : ", ") + a;
      // Logged before the level changes, so that raising it still shows this line.
      LogInfo("reload: " + (applied.empty() ? std::string("nothing to change") : "applied " + applied));
      SetLogLevel(config.log_level);
    }
  }
  status = service.StatusLine();
  notify::Ready(status);
}

// Pings at half the interval systemd allows, from the event loop itself: a loop
// that stops turning stops the pings, and systemd restarts the daemon.
void Server::Impl::ScheduleWatchdog(std::chrono::microseconds interval) {
  watchdog.expires_after(interval / 2);
  watchdog.async_wait([this, interval](boost::system::error_code ec) {
    if (ec || stopping) return;
    notify::WatchdogPing();
    ScheduleWatchdog(interval);
  });
}

void Server::Impl::ScheduleStatus() {
  status_timer.expires_after(kStatusPeriod);
  status_timer.async_wait([this](boost::system::error_code ec) {
    if (ec || stopping) return;
    std::string now = service.StatusLine();
    if (now != status) {
      status = std::move(now);
      notify::SetStatus(status);
    }
    ScheduleStatus();
  });
}

void Server::Impl::BackendFailed(const Status& why) {
  LogError("exiting: " + why.message() + "; a supervisor (systemd's Restart=on-failure) starts a fresh kvtierd");
  notify::Stopping("backend failed: " + why.message());
  if (listening) ::unlink(config.socket_path.c_str());
  std::_Exit(1);
}

void Server::Impl::Shutdown(const char* why) {
  if (stopping) return;
  stopping = true;
  LogInfo(std::string("shutting down (") + why + "): " + std::to_string(connections.size()) + " clients connected");
  notify::Stopping("stopping (" + std::string(why) + "): closing " + std::to_string(connections.size()) +
                   " connections, draining copies");
  boost::system::error_code ec;
  acceptor.close(ec);
  ticker.cancel();
  accept_timer.cancel();
  watchdog.cancel();
  status_timer.cancel();
  signals.cancel();
  reload_signal.cancel();
  if (metrics) metrics->Stop();
  auto conns = connections;
  for (const auto& c : conns) c->Close();
  const Status st = service.WaitIdle(std::chrono::seconds(10));
  if (!st.ok()) LogWarn("copies still in flight at shutdown: " + st.ToString());
  service.SaveForRestart(std::chrono::seconds(10));
  service.SpillForRestart(std::chrono::seconds(20));
  io.stop();
}

Server::Server(Service& service, const DaemonConfig& config, ConfigSource reload)
    : impl_(std::make_unique<Impl>(service, config, std::move(reload))) {}

Server::~Server() {
  if (impl_->listening) ::unlink(impl_->config.socket_path.c_str());
}

Status Server::Start() {
  Impl& m = *impl_;
  const std::string& path = m.config.socket_path;
  std::error_code fec;
  if (std::filesystem::exists(path, fec)) {
    if (SocketIsLive(path)) {
      return Status(StatusCode::kAlreadyExists, "another process accepts connections on " + path);
    }
    LogInfo("removing stale socket " + path + " left by an earlier instance");
    ::unlink(path.c_str());
  }
  boost::system::error_code ec;
  m.acceptor.open(stream_protocol(), ec);
  {
    // The socket file is born 0600 whatever the umask, then gets the configured
    // group and mode before anyone can be let in by them.
    const mode_t old = ::umask(0177);
    if (!ec) m.acceptor.bind(stream_protocol::endpoint(path), ec);
    ::umask(old);
  }
  if (ec) return Unavailable("cannot listen on " + path + ": " + ec.message());
  m.listening = true;
  const uint32_t group = m.config.access.group_gid;
  if (group != AccessConfig::kNoGroup && ::chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return Status(StatusCode::kPermissionDenied, "cannot give socket " + path + " to group " + m.config.access.group +
                                                     ": " + std::strerror(errno));
  }
  if (::chmod(path.c_str(), m.config.access.mode) != 0) {
    return Unavailable("cannot chmod socket " + path + ": " + std::strerror(errno));
  }
  m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot listen on " + path + ": " + ec.message());

  if (!m.config.metrics_listen.empty()) {
    auto address = ParseListenAddress(m.config.metrics_listen);
    if (!address.ok()) return address.status();
    m.metrics = std::make_unique<MetricsEndpoint>(m.io, [&m] { return m.service.RenderMetrics(); });
    KVTIER_RETURN_IF_ERROR(m.metrics->Start(*address));
    const std::string bound = m.metrics->address();
    LogInfo("metrics: serving http://" + bound + "/metrics");
    const bool loopback = address->host.rfind("127.", 0) == 0 || address->host == "::1";
    if (!loopback) LogWarn("metrics: " + bound + " is not a loopback address; /metrics has no authentication");
  }

  // Copy completions arrive on the backend's thread, and fetches from the
  // stores on theirs: hand them to the loop, once.
  auto wake = [&m] {
    if (!m.poll_posted.exchange(true)) {
      asio::post(m.io, [&m] {
        m.poll_posted.store(false);
        m.service.Poll();
        m.ResumeParked();
      });
    }
  };
  m.service.backend().SetCompletionNotifier(wake);
  m.service.SetWakeup(wake);
  return Status::Ok();
}

int Server::Run() {
  Impl& m = *impl_;
  m.signals.async_wait([&m](boost::system::error_code ec, int sig) {
    if (!ec) m.Shutdown(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  });
  m.WaitForReload();
  m.Accept();
  m.ScheduleTick();
  m.ScheduleStatus();
  if (const auto interval = notify::WatchdogInterval(); interval.count() > 0) {
    LogInfo("systemd watchdog: pinging every " + std::to_string(interval.count() / 2000) + " ms");
    m.ScheduleWatchdog(interval);
  }
  LogInfo("ready: listening on " + m.config.socket_path + " (pid " + std::to_string(::getpid()) + ")");
  m.status = m.service.StatusLine();
  notify::Ready(m.status);
  RunLoop(m.io, m.config.busy_poll_us, [&m] { return m.service.CopiesInFlight(); });
  m.service.backend().SetCompletionNotifier(nullptr);
  m.service.SetWakeup(nullptr);
  LogInfo("stopped");
  return 0;
}

void Server::Stop() {
  asio::post(impl_->io, [this] { impl_->Shutdown("stop requested"); });
}

}  // namespace kvtier::daemon
