// Server: the socket, accepting, parked requests, timers, signals and reloads (server.h); each
// client's framing is its Connection's (connection.h).
#include "server/server.h"

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
#include "notify.h"
#include "server/connect_rate.h"
#include "server/connection.h"
#include "server/metrics_endpoint.h"
#include "service/service.h"

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

// Closes a connection refused at accept: the reason goes out (an ErrorResponse,
// request id 0) if the socket takes it without waiting, then it closes.
void CloseWithError(stream_protocol::socket& socket, const Status& why) {
  std::vector<uint8_t> frame;
  wire::AppendFrame(frame, 0, wire::FromStatus(why));
  (void)!::send(socket.native_handle(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  boost::system::error_code ignored;
  socket.close(ignored);
}

}  // namespace

// How often systemd's STATUS= line is refreshed (only sent when it changed).
constexpr auto kStatusPeriod = std::chrono::seconds(5);
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
  // What the connections reach the server through; declared before them, so it outlives them.
  ConnectionHost host{service, config,
                      [this](const std::shared_ptr<Connection>& c) { parked.push_back(c); },
                      [this](const std::shared_ptr<Connection>& c) {
                        connections.erase(c);
                        ConnectionClosed();
                      }};
  asio::io_context io;
  stream_protocol::acceptor acceptor;
  asio::signal_set signals;
  asio::signal_set reload_signal;
  asio::steady_timer ticker;
  asio::steady_timer accept_timer;  // The wait after an accept that failed (AcceptFailed).
  std::chrono::milliseconds accept_backoff{0};
  ConnectRate connect_rate;  // New connections per uid (limits.connects_per_second).
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
  // Refuses a connection of a uid past limits.connects_per_second, saying so.
  void RefuseTooFast(stream_protocol::socket& socket, uint32_t uid);
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
    if (peer.ok() && !connect_rate.Admit(peer->uid, config.connects_per_second, std::chrono::steady_clock::now())) {
      RefuseTooFast(socket, peer->uid);
      return Accept();
    }
    Status allowed = peer.ok() ? service.access().CheckConnect(*peer) : peer.status();
    if (!allowed.ok()) {
      service.CountRefused();
      LogLimited(LogLevel::kWarn, "refused", "refused a connection: " + allowed.message());
    }
    auto conn = std::make_shared<Connection>(host, std::move(socket));
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
  CloseWithError(socket, ResourceExhausted(why));
}

void Server::Impl::RefuseTooFast(stream_protocol::socket& socket, uint32_t uid) {
  service.CountTooFast();
  const std::string why = "uid " + std::to_string(uid) + " opened more than limits.connects_per_second (" +
                          std::to_string(config.connects_per_second) + ") connections in the last second";
  LogLimited(LogLevel::kWarn, "too fast", "refused a connection at accept: " + why);
  CloseWithError(socket, ResourceExhausted(why));
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
