// Core: a Client's connection to kvtierd across reconnects — the Hello that
// opens each connection, the connection generation, the Attachment made from
// its Welcome, and Call.
//
// Thread-safe. Requests are serialized by one mutex, which also guards the
// transport and the generation. Leases hold a weak_ptr to their Core and may
// outlive the Client.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "attachment.h"
#include "kvtier/client.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"
#include "transport.h"

namespace kvtier::client_internal {

// Whether a request may be sent again on a new connection when the one it was
// sent on is lost (only requests that hold no state of the old connection).
enum class Resend : bool { kNo = false, kYes = true };

class Core {
 public:
  explicit Core(ClientOptions options) : options_(std::move(options)), transport_(options_) {}
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Connects now (closing any connection first), says Hello and maps the new
  // daemon's segments: a new generation. On failure nothing is connected and
  // the attachment and generation stay what they were.
  Status Reconnect();

  // The current connection's attachment. REQUIRES: a Reconnect succeeded once.
  std::shared_ptr<const Attachment> attachment() const;

  // Sends `request` and returns the reply (an ErrorResponse becomes its
  // Status). Connects first if no connection is open (unless options.reconnect
  // is off: kUnavailable); if the connection is lost during the call and
  // `resend`, reconnects and sends once more.
  Result<wire::Message> Call(const wire::Message& request, Resend resend);
  // Release of a lease made on connection `generation`.
  Status ReleaseLease(uint64_t id, uint64_t generation);
  uint64_t current_generation();

 private:
  // Opens the transport, says Hello, maps the Welcome. REQUIRES: mu_ held.
  Status ConnectLocked();

  const ClientOptions options_;
  std::mutex mu_;         // Serializes requests.
  Transport transport_;   // GUARDED_BY(mu_)
  uint64_t generation_ = 0;  // GUARDED_BY(mu_); counts successful connections.
  mutable std::mutex att_mu_;
  std::shared_ptr<const Attachment> att_;  // Written under mu_ and att_mu_, so either suffices to read it.
};

// The reply as a T; kProtocolError naming both types if it is another message.
template <typename T>
Result<T> Expect(Result<wire::Message> reply) {
  if (!reply.ok()) return reply.status();
  if (auto* v = std::get_if<T>(&*reply)) return std::move(*v);
  return ProtocolError(std::string("unexpected reply ") + wire::MessageTypeName(wire::TypeOf(*reply)) + ", wanted " +
                       wire::MessageTypeName(T::kType));
}

}  // namespace kvtier::client_internal
