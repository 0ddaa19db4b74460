// The GET /metrics endpoint (metrics_endpoint.h).
#include "server/metrics_endpoint.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "log.h"

namespace kvtier::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kMaxHeaderBytes = 8 * 1024;
constexpr size_t kMaxBodyBytes = 4 * 1024;
constexpr size_t kMaxConnections = 16;
constexpr auto kIdleTimeout = std::chrono::seconds(10);
// After an accept failed (out of descriptors, say), the next waits this long,
// doubling up to kAcceptBackoffMax: retrying at once would fail at once, the
// connection still queued. An accept that succeeds resets it.
constexpr auto kAcceptBackoffMin = std::chrono::milliseconds(10);
constexpr auto kAcceptBackoffMax = std::chrono::milliseconds(1000);
constexpr const char* kExpositionType = "text/plain; version=0.0.4; charset=utf-8";

std::string Format(const tcp::endpoint& ep) {
  const std::string host = ep.address().to_string();
  return (ep.address().is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(ep.port());
}

}  // namespace

class HttpConnection;

struct MetricsEndpoint::Impl : std::enable_shared_from_this<MetricsEndpoint::Impl> {
  Impl(asio::io_context& io, std::function<std::string()> r)
      : acceptor(io), accept_timer(io), render(std::move(r)) {}

  void Accept();

  tcp::acceptor acceptor;
  asio::steady_timer accept_timer;
  std::chrono::milliseconds accept_backoff{0};
  std::function<std::string()> render;
  std::unordered_set<std::shared_ptr<HttpConnection>> connections;
  bool stopped = false;
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<MetricsEndpoint::Impl> endpoint, tcp::socket socket)
      : endpoint_(std::move(endpoint)), stream_(std::move(socket)) {}

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    endpoint_->connections.erase(shared_from_this());
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) return Close();
    if (ec && ec.category() == http::make_error_code(http::error::bad_target).category()) {
      // The request does not parse (or breaks a limit): say so and hang up, since
      // what follows in the stream cannot be trusted.
      LogDebug("metrics: malformed HTTP request: " + ec.message());
      return Respond(http::status::bad_request, "bad request: " + ec.message() + "\n", 11, false);
    }
    if (ec) return Close();  // Reset, timed out, or the endpoint stopped.

    const auto& req = parser_->get();
    const unsigned version = req.version();
    const bool keep_alive = req.keep_alive();
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get) {
      return Respond(http::status::method_not_allowed, "only GET is served here\n", version, keep_alive, "GET");
    }
    if (path != "/metrics") return Respond(http::status::not_found, "not found; try /metrics\n", version, keep_alive);
    Respond(http::status::ok, endpoint_->render(), version, keep_alive);
  }

  void Respond(http::status status, std::string body, unsigned version, bool keep_alive, const char* allow = nullptr) {
    res_ = {};
    res_.version(version);
    res_.result(status);
    res_.set(http::field::server, "kvtierd");
    res_.set(http::field::content_type, status == http::status::ok ? kExpositionType : "text/plain; charset=utf-8");
    if (allow != nullptr) res_.set(http::field::allow, allow);
    res_.keep_alive(keep_alive);
    res_.body() = std::move(body);
    res_.prepare_payload();
    stream_.expires_after(kIdleTimeout);
    http::async_write(stream_, res_, [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
      if (ec || !keep_alive) return self->Close();
      self->Read();
    });
  }

  std::shared_ptr<MetricsEndpoint::Impl> endpoint_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxHeaderBytes + kMaxBodyBytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  bool closed_ = false;
};

void MetricsEndpoint::Impl::Accept() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (self->stopped || ec == asio::error::operation_aborted) return;
    if (ec == asio::error::connection_aborted) return self->Accept();
    if (ec) {
      self->accept_backoff = std::clamp(self->accept_backoff * 2, kAcceptBackoffMin, kAcceptBackoffMax);
      LogLimited(LogLevel::kWarn, "metrics accept",
                 "metrics: accept: " + ec.message() + "; accepting again in " +
                     std::to_string(self->accept_backoff.count()) + " ms");
      self->accept_timer.expires_after(self->accept_backoff);
      self->accept_timer.async_wait([self](beast::error_code wait_ec) {
        if (!wait_ec && !self->stopped) self->Accept();
      });
      return;
    }
    self->accept_backoff = std::chrono::milliseconds(0);
    if (self->connections.size() >= kMaxConnections) {
      LogDebug("metrics: refusing a connection: " + std::to_string(kMaxConnections) + " are open");
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      auto conn = std::make_shared<HttpConnection>(self, std::move(socket));
      self->connections.insert(conn);
      conn->Read();
    }
    self->Accept();
  });
}

MetricsEndpoint::MetricsEndpoint(asio::io_context& io, std::function<std::string()> render)
    : impl_(std::make_shared<Impl>(io, std::move(render))) {}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

Status MetricsEndpoint::Start(const ListenAddress& address) {
  Impl& m = *impl_;
  beast::error_code ec;
  const auto ip = asio::ip::make_address(address.host, ec);
  const std::string want = address.host + ":" + std::to_string(address.port);
  if (ec) return InvalidArgument("metrics address '" + want + "': " + ec.message());
  const tcp::endpoint ep(ip, address.port);
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && ip.is_v6()) m.acceptor.set_option(asio::ip::v6_only(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    m.acceptor.close(ignored);
    return Unavailable("cannot serve metrics on " + Format(ep) + ": " + ec.message());
  }
  m.Accept();
  return Status::Ok();
}

std::string MetricsEndpoint::address() const {
  beast::error_code ec;
  const tcp::endpoint ep = impl_->acceptor.local_endpoint(ec);
  return ec ? std::string() : Format(ep);
}

void MetricsEndpoint::Stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  beast::error_code ec;
  m.acceptor.close(ec);
  m.accept_timer.cancel();
  auto conns = m.connections;
  for (const auto& c : conns) c->Close();
}

}  // namespace kvtier::daemon
