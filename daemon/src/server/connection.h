// Connection: one client's Unix socket on the event loop: framing, the
// requests it sends handed to the Service in order, a request parked while it
// waits for GPU room, and the replies it has not read yet.
//
// Reading is bounded three ways: a frame's declared size (limits.max_frame_bytes,
// and 64 KiB before Hello), the buffer (it grows with the bytes that arrived, never
// with what a header declares), and the replies not yet sent
// (limits.max_reply_backlog_bytes: past it nothing more is read or handled until
// they drain). A frame that does not decode gets an ErrorResponse and the
// connection closes; whatever ends a connection ends its leases (Service::Disconnect).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "config/config.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"
#include "service/service.h"

namespace kvtier::daemon {

class Connection;

// What a connection needs of the server that accepted it.
struct ConnectionHost {
  Service& service;
  const DaemonConfig& config;  // The effective configuration (a reload replaces it in place).
  // Its request waits for GPU room: the server calls Resume after copies complete and at each tick.
  std::function<void(const std::shared_ptr<Connection>&)> park;
  // It closed: the server forgets it, and an accept waiting for a free descriptor goes ahead.
  std::function<void(const std::shared_ptr<Connection>&)> closed;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;

  Connection(ConnectionHost& host, Socket socket);

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
  std::string Describe() const;

  void Start();
  void SetPeer(const PeerCredentials& peer) { client_.peer = peer; }
  // The peer may not use kvtierd: it gets `why` (permission_denied) at once,
  // and the connection ends once its first bytes (its Hello, usually on its way
  // already) arrived. Closing first would fail its Hello with EPIPE before it
  // could read why.
  void Refuse(const Status& why);
  // Retries the request that waits for GPU room. True while it still waits.
  bool Resume();
  // Ends the connection now (shutdown); its leases end with it.
  void Close();

 private:
  enum class Next {
    kRead,    // Read more.
    kParked,  // A request waits for GPU room; Resume goes on (nothing is read meanwhile).
    kPaused,  // The reply backlog is too long; Write goes on once it drained (nothing is read meanwhile).
    kClosing,
  };
  struct Parked {
    uint64_t request_id = 0;
    wire::MessageType type{};
    wire::Message request;
    std::chrono::steady_clock::time_point start;
  };

  // Reads whatever the peer sent into in_ (one syscall usually brings a whole
  // request), then handles every complete frame in it. The buffer grows with
  // the bytes that arrived, never with what a header declares: it makes room
  // for a read chunk, or for as many bytes as the frame has brought so far (a
  // large frame takes a few reads, the buffer at most doubling each time), but
  // not past the end of the frame.
  void Read();
  // Handles the complete frames in in_, in order, while the replies not yet
  // sent stay within limits.max_reply_backlog_bytes: past it, a peer that does
  // not read what it asked for gets nothing more handled or read until they
  // drain, so what it costs is bounded by the backlog and the socket buffers.
  Next HandleFrames();
  // Sends the reply to a request that arrived at `start`. False if the
  // connection closes after it.
  bool Answer(uint64_t request_id, wire::MessageType type, const Reply& reply,
              std::chrono::steady_clock::time_point start);
  // A protocol violation: answer with the error, then close.
  Next Fail(uint64_t request_id, const Status& st);
  // Queues a reply. Reading pauses past the backlog limit (HandleFrames), so
  // this only finds kReplyCloseFactor times the limit unsent if something
  // sends without asking: it closes the connection then.
  void Send(uint64_t request_id, const wire::Message& m);
  // Sends the frame's first bytes with `fds` attached (SCM_RIGHTS), the rest
  // as any frame. Only the first frame of a connection (the Welcome) carries
  // descriptors, so nothing is queued before it. False (and closing) if the
  // kernel would not take them.
  bool SendWithDescriptors(uint64_t request_id, const wire::Message& m, const std::vector<int>& fds);
  void Write();

  ConnectionHost& host_;
  Socket socket_;
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

}  // namespace kvtier::daemon
