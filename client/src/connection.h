// Connection: a Client's connection to kvtierd, kept across reconnects: the Hello that
// opens each connection, the connection generation, the Attachment made from
// its Welcome, and Call, which hands every reply back together with the
// connection it came on.
//
// Thread-safe. Requests are serialized by one mutex, which also guards the
// transport and the generation; a reconnect by one thread therefore never
// falls between another thread's request and the attachment its reply is
// read against, as long as that thread uses the attachment Call returned.
// Leases hold a weak_ptr to their Connection and may outlive the Client.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "attachment.h"
#include "kvtier/client_options.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"
#include "transport.h"

namespace kvtier::client_internal {

// A reply of type T and the connection it came on. Slot numbers and fences in
// `message` refer to `attachment`, and a lease it grants belongs to `generation`.
template <typename T>
struct Reply {
  T message;
  std::shared_ptr<const Attachment> attachment;
  uint64_t generation = 0;
};

// Whether a request may be sent again on a new connection when the one it was
// sent on is lost (only requests that hold no state of the old connection).
enum class Resend : bool { kNo = false, kYes = true };

class Connection {
 public:
  explicit Connection(ClientOptions options) : options_(std::move(options)), transport_(options_) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects now (closing any connection first), says Hello and maps the new
  // daemon's segments: a new generation. On failure nothing is connected and
  // the attachment and generation stay what they were.
  Status Reconnect();

  // The current connection's attachment. REQUIRES: a Reconnect succeeded once.
  // It may be replaced by the time the caller reads it: a reply is read only
  // against the attachment of its Reply.
  std::shared_ptr<const Attachment> attachment() const;
  // True while `a` is the current connection's attachment: no reconnect has
  // replaced it with another daemon's (or another connection's) segments.
  bool Current(const std::shared_ptr<const Attachment>& a) const;

  // Sends `request` and returns its reply, which must be a T (an ErrorResponse
  // becomes its Status, any other reply kProtocolError). Connects first if no
  // connection is open (unless options.reconnect is off: kUnavailable); if the
  // connection is lost during the call and `resend`, reconnects and sends once
  // more.
  template <typename T>
  Result<Reply<T>> Call(const wire::Message& request, Resend resend) {
    return Expect<T>(Send(request, resend, /*generation=*/0, {}));
  }

  // Sends `request`, which names a lease made on connection `generation`, on
  // that connection only: never connects, never resends. kUnavailable ("the
  // <lease_kind> ended with its connection to kvtierd") when that connection
  // is gone, so a lease id never reaches a daemon that did not grant it.
  template <typename T>
  Result<Reply<T>> CallOn(uint64_t generation, std::string_view lease_kind, const wire::Message& request) {
    return Expect<T>(Send(request, Resend::kNo, generation, lease_kind));
  }

 private:
  // Call and CallOn: `generation` 0 is any connection, connecting if need be.
  Result<Reply<wire::Message>> Send(const wire::Message& request, Resend resend, uint64_t generation,
                                    std::string_view lease_kind);
  // Opens the transport, says Hello, maps the Welcome. REQUIRES: mu_ held.
  Status ConnectLocked();

  template <typename T>
  static Result<Reply<T>> Expect(Result<Reply<wire::Message>> reply) {
    if (!reply.ok()) return reply.status();
    T* v = std::get_if<T>(&reply->message);
    if (v == nullptr) return UnexpectedReply(reply->message, T::kType);
    return Reply<T>{std::move(*v), std::move(reply->attachment), reply->generation};
  }
  static Status UnexpectedReply(const wire::Message& got, wire::MessageType wanted);

  const ClientOptions options_;
  std::mutex mu_;            // Serializes requests.
  Transport transport_;      // GUARDED_BY(mu_)
  uint64_t generation_ = 0;  // GUARDED_BY(mu_); counts successful connections.
  mutable std::mutex att_mu_;
  std::shared_ptr<const Attachment> att_;  // Written under mu_ and att_mu_, so either suffices to read it.
};

}  // namespace kvtier::client_internal
