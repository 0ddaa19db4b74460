// Server: the socket, framing, parked requests, timers, signals and reloads (server.h).
#include "server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <unordered_set>
#include <thread>
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

struct Server::Impl {
  Impl(Service& s, const DaemonConfig& c, ConfigSource r)
      : service(s),
        config(c),
        reload_source(std::move(r)),
        acceptor(io),
        signals(io, SIGINT, SIGTERM),
        reload_signal(io, SIGHUP),
        ticker(io),
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
  void ScheduleTick();
  // Closes connections that sent no Hello within limits.hello_timeout_ms.
  void CloseSilentConnections();
  void WaitForReload();
  void Reload();
  void ScheduleWatchdog(std::chrono::microseconds interval);
  void ScheduleStatus();
  void Shutdown(const char* why);
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl& server, stream_protocol::socket socket)
      : server_(server), socket_(std::move(socket)) {
    client_.id = server_.service.NextClientId();
  }

  bool welcomed() const { return client_.welcomed; }
  std::chrono::steady_clock::time_point accepted() const { return accepted_; }

  void Start() {
    if (refused_) Send(0, wire::FromStatus(why_refused_));
    Read();
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
  }

 private:
  // Reads whatever the peer sent into in_ (one syscall usually brings a whole
  // request), then handles every complete frame in it.
  void Read() {
    if (in_.size() - in_end_ < kReadChunk) {
      // Compact, and grow only as far as a declared (and accepted) frame needs.
      if (in_begin_ > 0) {
        std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
        in_end_ -= in_begin_;
        in_begin_ = 0;
      }
      if (in_.size() - in_end_ < kReadChunk) in_.resize(in_end_ + kReadChunk);
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
    kClosing,
  };

  // Handles the complete frames in in_, in order.
  Next HandleFrames() {
    if (refused_) {
      // What it sent is read (closing with unread bytes would reset the peer
      // before it read the error), discarded, and the connection ends.
      in_begin_ = in_end_ = 0;
      close_after_write_ = true;
      if (out_.empty()) Close();
      return Next::kClosing;
    }
    while (in_end_ - in_begin_ >= wire::kHeaderBytes) {
      const uint8_t* at = in_.data() + in_begin_;
      auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(at, wire::kHeaderBytes));
      if (!h.ok()) return Fail(0, h.status());
      if (h->payload_length > server_.config.max_frame_bytes) {
        return Fail(h->request_id, ResourceExhausted("frame of " + std::to_string(h->payload_length) +
                                                     " bytes exceeds limits.max_frame_bytes (" +
                                                     std::to_string(server_.config.max_frame_bytes) + ")"));
      }
      const size_t frame = wire::kHeaderBytes + h->payload_length;
      if (in_end_ - in_begin_ < frame) {
        if (in_.size() - in_begin_ < frame) in_.resize(in_begin_ + frame + kReadChunk);
        return Next::kRead;  // Wait for the rest.
      }
      auto msg = wire::DecodePayload(*h, std::span<const uint8_t>(at + wire::kHeaderBytes, h->payload_length));
      in_begin_ += frame;
      if (!msg.ok()) return Fail(h->request_id, msg.status());
      const auto start = std::chrono::steady_clock::now();
      Reply reply = server_.service.Handle(client_, *msg);
      if (reply.deferred) {
        parked_ = Parked{h->request_id, h->type, std::move(*msg), start};
        server_.parked.push_back(shared_from_this());
        return Next::kParked;
      }
      if (!Answer(h->request_id, h->type, reply, start)) return Next::kClosing;
    }
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
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
      LogWarn("client " + std::to_string(client_.id) + ": " + (err ? wire::ToStatus(*err).ToString() : "closing"));
      close_after_write_ = true;
      return false;
    }
    return true;
  }

  // A protocol violation: answer with the error, then close.
  Next Fail(uint64_t request_id, const Status& st) {
    server_.service.CountBadFrame();
    LogWarn("client " + std::to_string(client_.id) + " (" + (client_.name.empty() ? "no hello" : client_.name) +
            "): bad frame: " + st.ToString() + "; closing the connection");
    Send(request_id, wire::FromStatus(st));
    close_after_write_ = true;
    return Next::kClosing;
  }

  void Send(uint64_t request_id, const wire::Message& m) {
    std::vector<uint8_t> frame;
    wire::AppendFrame(frame, request_id, m);
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
      out_.push_back(std::move(frame));
      Write();
    }
    return true;
  }

  void Write() {
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_.front()), [this, self](boost::system::error_code ec, size_t) {
      if (ec) return Close();
      out_.pop_front();
      if (!out_.empty()) return Write();
      if (close_after_write_) Close();
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
  std::vector<uint8_t> in_;  // Bytes received: [in_begin_, in_end_) not yet handled.
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  std::deque<std::vector<uint8_t>> out_;
  bool close_after_write_ = false;
  bool closed_ = false;
  bool refused_ = false;
  Status why_refused_;
  std::chrono::steady_clock::time_point accepted_ = std::chrono::steady_clock::now();
};

void Server::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec, stream_protocol::socket socket) {
    if (ec) {
      if (ec != asio::error::operation_aborted) LogWarn("accept: " + ec.message());
      if (!stopping && ec != asio::error::operation_aborted) Accept();
      return;
    }
    // Who the peer is, from the kernel; one not allowed gets a permission_denied
    // error frame (request id 0) and is closed before anything else.
    auto peer = GetPeerCredentials(socket.native_handle());
    Status allowed = peer.ok() ? service.access().CheckConnect(*peer) : peer.status();
    if (!allowed.ok()) {
      service.CountRefused();
      LogWarn("refused a connection: " + allowed.message());
    }
    auto conn = std::make_shared<Connection>(*this, std::move(socket));
    if (allowed.ok()) conn->SetPeer(*peer); else conn->Refuse(allowed);
    connections.insert(conn);
    conn->Start();
    Accept();
  });
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
    LogWarn("closing a connection that sent no Hello within limits.hello_timeout_ms (" +
            std::to_string(config.hello_timeout_ms) + " ms)");
    c->Close();
  }
}

void Server::Impl::ScheduleTick() {
  ticker.expires_after(std::chrono::milliseconds(config.tick_ms));
  ticker.async_wait([this](boost::system::error_code ec) {
    if (ec || stopping) return;
    service.Tick();
    ResumeParked();
    CloseSilentConnections();
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

void Server::Impl::Shutdown(const char* why) {
  if (stopping) return;
  stopping = true;
  LogInfo(std::string("shutting down (") + why + "): " + std::to_string(connections.size()) + " clients connected");
  notify::Stopping("stopping (" + std::string(why) + "): closing " + std::to_string(connections.size()) +
                   " connections, draining copies");
  boost::system::error_code ec;
  acceptor.close(ec);
  ticker.cancel();
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

  // Copy completions arrive on the backend's thread: hand them to the loop, once.
  m.service.backend().SetCompletionNotifier([&m] {
    if (!m.poll_posted.exchange(true)) {
      asio::post(m.io, [&m] {
        m.poll_posted.store(false);
        m.service.Poll();
        m.ResumeParked();
      });
    }
  });
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
  LogInfo("stopped");
  return 0;
}

void Server::Stop() {
  asio::post(impl_->io, [this] { impl_->Shutdown("stop requested"); });
}

}  // namespace kvtier::daemon
