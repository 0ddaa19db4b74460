// MetricsEndpoint: kvtierd's Prometheus endpoint, plain HTTP/1.1 (Boost.Beast)
// on the daemon's event loop.
//
// GET /metrics answers what `render` returns (text exposition format 0.0.4);
// any other path is 404 and any other method 405. Since `render` runs on the
// loop thread, it reads engine state without locks. Requests are bounded (8 KiB
// of headers, 4 KiB of body), a connection idle for 10 s is closed, and at most
// 16 connections are open at once: a malformed or slow client costs its own
// socket, never a request of the cache.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "kvtier/status.h"

namespace boost::asio {
class io_context;
}

namespace kvtier::daemon {

class MetricsEndpoint {
 public:
  MetricsEndpoint(boost::asio::io_context& io, std::function<std::string()> render);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Binds and starts accepting. kUnavailable if the address cannot be bound.
  Status Start(const ListenAddress& address);
  // The bound address, "127.0.0.1:9464" or "[::1]:9464" (the real port when 0 was asked for).
  std::string address() const;
  // Stops accepting and closes every connection.
  void Stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvtier::daemon
