// Connection: framing, parked requests and reply backlog of one client (connection.h).
#include "server/connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "kvtier/fd_passing.h"
#include "log.h"

namespace kvtier::daemon {

namespace asio = boost::asio;
using asio::local::stream_protocol;

namespace {

// The largest frame a connection may send before its Hello (a Hello is a few
// strings of at most wire::kMaxString bytes).
constexpr uint32_t kMaxFrameBeforeHello = 64 * 1024;

}  // namespace

Connection::Connection(ConnectionHost& host, Socket socket) : host_(host), socket_(std::move(socket)) {
  client_.id = host_.service.NextClientId();
}

std::string Connection::Describe() const {
  return "client " + std::to_string(client_.id) + " (" + (client_.name.empty() ? "no hello" : client_.name) + ")";
}

void Connection::Start() {
  if (refused_) Send(0, wire::FromStatus(why_refused_));
  if (!closed_) Read();
}

void Connection::Refuse(const Status& why) {
  refused_ = true;
  why_refused_ = why;
}

bool Connection::Resume() {
  if (closed_ || !parked_) return false;
  Reply reply = host_.service.Handle(client_, parked_->request);
  if (reply.deferred) return true;
  const Parked p = std::move(*parked_);
  parked_.reset();
  if (Answer(p.request_id, p.type, reply, p.start) && HandleFrames() == Next::kRead) Read();
  return false;
}

void Connection::Close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  socket_.shutdown(stream_protocol::socket::shutdown_both, ec);
  socket_.close(ec);
  host_.service.Disconnect(client_);
  host_.closed(shared_from_this());
}

void Connection::Read() {
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

Connection::Next Connection::HandleFrames() {
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
    if (unsent_ > host_.config.max_reply_backlog_bytes) {
      if (!paused_) paused_since_ = std::chrono::steady_clock::now();
      paused_ = true;
      partial_since_.reset();
      return Next::kPaused;
    }
    if (in_end_ - in_begin_ < wire::kHeaderBytes) break;
    const uint8_t* at = in_.data() + in_begin_;
    auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(at, wire::kHeaderBytes));
    if (!h.ok()) return Fail(0, h.status());
    if (h->payload_length > host_.config.max_frame_bytes) {
      return Fail(h->request_id, ResourceExhausted("frame of " + std::to_string(h->payload_length) +
                                                   " bytes exceeds limits.max_frame_bytes (" +
                                                   std::to_string(host_.config.max_frame_bytes) + ")"));
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
    Reply reply = host_.service.Handle(client_, *msg);
    if (reply.deferred) {
      parked_ = Parked{h->request_id, h->type, std::move(*msg), start};
      host_.park(shared_from_this());
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

bool Connection::Answer(uint64_t request_id, wire::MessageType type, const Reply& reply,
                        std::chrono::steady_clock::time_point start) {
  if (reply.fds.empty()) {
    Send(request_id, reply.message);
  } else if (!SendWithDescriptors(request_id, reply.message, reply.fds)) {
    return false;
  }
  host_.service.ObserveRequest(type, std::chrono::steady_clock::now() - start);
  if (reply.close) {
    const auto* err = std::get_if<wire::ErrorResponse>(&reply.message);
    LogLimited(LogLevel::kWarn, "reply closes",
               "client " + std::to_string(client_.id) + ": " + (err ? wire::ToStatus(*err).ToString() : "closing"));
    close_after_write_ = true;
    return false;
  }
  return !closed_;
}

Connection::Next Connection::Fail(uint64_t request_id, const Status& st) {
  host_.service.CountBadFrame();
  LogLimited(LogLevel::kWarn, "bad frame", Describe() + ": bad frame: " + st.ToString() + "; closing the connection");
  Send(request_id, wire::FromStatus(st));
  close_after_write_ = true;
  return Next::kClosing;
}

void Connection::Send(uint64_t request_id, const wire::Message& m) {
  if (closed_) return;
  const uint64_t limit = uint64_t{kReplyCloseFactor} * host_.config.max_reply_backlog_bytes;
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

bool Connection::SendWithDescriptors(uint64_t request_id, const wire::Message& m,
                                     const std::vector<int>& fds) {
  std::vector<uint8_t> frame;
  wire::AppendFrame(frame, request_id, m);
  if (!out_.empty()) {
    LogError("client " + std::to_string(client_.id) + ": descriptors to send behind queued replies; closing");
    Close();
    return false;
  }
  const ssize_t n = SendWithFds(socket_.native_handle(), frame, fds, MSG_DONTWAIT);
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

void Connection::Write() {
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
    if (paused_ && unsent_ <= host_.config.max_reply_backlog_bytes) {
      paused_ = false;  // Drained enough: handle and read requests again.
      if (HandleFrames() == Next::kRead) Read();
    }
  });
}

}  // namespace kvtier::daemon
