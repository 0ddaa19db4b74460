#include "kvtier/wire.h"

#include "wire_fields.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace kvtier::wire {
namespace {

using namespace fields;  // Fields of every message, and the bounds they check.

// Encodes m's payload with `w`; returns false (w.status() says why) on a bound.
bool EncodePayload(Writer& w, const Message& m) {
  std::visit([&w](const auto& msg) { Fields(w, msg); }, m);
  return w.ok();
}

template <typename T>
Result<Message> DecodeAs(std::span<const uint8_t> payload) {
  T msg;
  Reader r(payload, T::kName);
  Fields(r, msg);
  if (Status st = r.Finish(); !st.ok()) return st;
  return Message(std::move(msg));
}

// Per alternative of Message, in its order: type, name and decoder; and the
// alternative's index by type value, for the header's type field.
template <typename V>
struct Alternatives;
template <typename... M>
struct Alternatives<std::variant<M...>> {
  using Decoder = Result<Message> (*)(std::span<const uint8_t>);
  static constexpr size_t kCount = sizeof...(M);
  static constexpr std::array<MessageType, kCount> kTypes = {M::kType...};
  static constexpr std::array<const char*, kCount> kNames = {M::kName...};
  static constexpr std::array<Decoder, kCount> kDecoders = {&DecodeAs<M>...};
  // Type values are small (below 64 today): a dense table finds one in O(1).
  static constexpr size_t kTypeEnd = static_cast<size_t>(kTypes[kCount - 1]) + 1;
  static constexpr std::array<int16_t, kTypeEnd> kIndex = [] {
    std::array<int16_t, kTypeEnd> index{};
    index.fill(-1);
    for (size_t i = 0; i < kCount; ++i) index[static_cast<size_t>(kTypes[i])] = static_cast<int16_t>(i);
    return index;
  }();
  // The alternative of type value `type`, or -1.
  static int IndexOf(uint16_t type) { return type < kTypeEnd ? kIndex[type] : -1; }
};
using Messages = Alternatives<Message>;
static_assert(Messages::kTypeEnd <= 4096, "MessageType values are dense enough for a lookup table");

Status EncodeChecked(std::vector<uint8_t>& out, uint64_t request_id, const Message& m) {
  const MessageType type = TypeOf(m);
  Writer sizer(nullptr, MessageTypeName(type));
  if (!EncodePayload(sizer, m)) return sizer.status();
  if (sizer.size() > kMaxPayload) {
    return ResourceExhausted(std::string(MessageTypeName(type)) + " payload of " + std::to_string(sizer.size()) +
                             " bytes exceeds the " + std::to_string(kMaxPayload) + "-byte frame limit");
  }
  const size_t start = out.size();
  out.resize(start + kHeaderBytes + sizer.size());
  FrameHeader h;
  h.type = type;
  h.request_id = request_id;
  h.payload_length = static_cast<uint32_t>(sizer.size());
  EncodeHeader(h, std::span<uint8_t, kHeaderBytes>(out.data() + start, kHeaderBytes));
  Writer w(std::span<uint8_t>(out.data() + start + kHeaderBytes, sizer.size()), MessageTypeName(type));
  // Same input as the sizing pass, so it fits exactly; anything else is a bug.
  if (!EncodePayload(w, m) || w.size() != sizer.size()) std::abort();
  return Status::Ok();
}

}  // namespace

const char* MessageTypeName(MessageType type) {
  const int i = Messages::IndexOf(static_cast<uint16_t>(type));
  return i < 0 ? "Unknown" : Messages::kNames[static_cast<size_t>(i)];
}

bool IsKnownMessageType(uint16_t type) { return Messages::IndexOf(type) >= 0; }

MessageType TypeOf(const Message& m) {
  return std::visit([](const auto& msg) { return std::decay_t<decltype(msg)>::kType; }, m);
}

void EncodeHeader(const FrameHeader& header, std::span<uint8_t, kHeaderBytes> out) {
  uint8_t* p = out.data();
  StoreLE<uint32_t>(p + 0, kMagic);
  StoreLE<uint16_t>(p + 4, header.version);
  StoreLE<uint16_t>(p + 6, static_cast<uint16_t>(header.type));
  StoreLE<uint64_t>(p + 8, header.request_id);
  StoreLE<uint32_t>(p + 16, header.payload_length);
  StoreLE<uint32_t>(p + 20, header.flags);
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t, kHeaderBytes> bytes) {
  const uint8_t* p = bytes.data();
  const uint32_t magic = LoadLE<uint32_t>(p + 0);
  if (magic != kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad frame magic 0x%08x (expected 0x%08x)", magic, kMagic);
    return ProtocolError(buf);
  }
  FrameHeader h;
  h.version = LoadLE<uint16_t>(p + 4);
  if (h.version != kProtocolVersion) {
    return Status(StatusCode::kVersionMismatch, "protocol version mismatch: peer speaks " + std::to_string(h.version) +
                                                    ", this side speaks " + std::to_string(kProtocolVersion));
  }
  const uint16_t type = LoadLE<uint16_t>(p + 6);
  if (!IsKnownMessageType(type)) return ProtocolError("unknown message type " + std::to_string(type));
  h.type = static_cast<MessageType>(type);
  h.request_id = LoadLE<uint64_t>(p + 8);
  h.payload_length = LoadLE<uint32_t>(p + 16);
  h.flags = LoadLE<uint32_t>(p + 20);
  if (h.flags != 0) return ProtocolError("frame flags " + std::to_string(h.flags) + " set; must be 0");
  if (h.payload_length > kMaxPayload) {
    return ProtocolError("payload length " + std::to_string(h.payload_length) + " exceeds the " +
                         std::to_string(kMaxPayload) + "-byte limit");
  }
  return h;
}

Status ToStatus(const ErrorResponse& e) {
  if (e.code == StatusCode::kOk) return Internal("error response with code ok: " + e.message);
  return Status(e.code, e.message);
}

ErrorResponse FromStatus(const Status& status) {
  ErrorResponse e;
  if (status.ok()) {
    e.code = StatusCode::kInternal;
    e.message = "FromStatus called with an ok status";
    return e;
  }
  const auto code = static_cast<uint64_t>(status.code());
  if (code < kFirstErrorCode || code >= StatusCodeEnd()) {
    e.code = StatusCode::kInternal;
    e.message = "status code " + std::to_string(code) + ": " + status.message();
  } else {
    e.code = status.code();
    e.message = status.message();
  }
  if (e.message.size() > kMaxString) e.message.resize(kMaxString);
  return e;
}

size_t EncodedSize(const SessionSummary& s) { return kSessionSummaryMinBytes + s.id.size() + s.tenant.size(); }

Result<size_t> PayloadSize(const Message& m) {
  Writer sizer(nullptr, MessageTypeName(TypeOf(m)));
  if (!EncodePayload(sizer, m)) return sizer.status();
  return sizer.size();
}

Status TryAppendFrame(std::vector<uint8_t>& out, uint64_t request_id, const Message& m) {
  return EncodeChecked(out, request_id, m);
}

void AppendFrame(std::vector<uint8_t>& out, uint64_t request_id, const Message& m) {
  const Status st = EncodeChecked(out, request_id, m);
  if (st.ok()) return;
  // An ErrorResponse from FromStatus is always encodable (bounded message, valid code).
  if (!EncodeChecked(out, request_id, FromStatus(st)).ok()) std::abort();
}

std::vector<uint8_t> EncodeFrame(uint64_t request_id, const Message& m) {
  std::vector<uint8_t> out;
  AppendFrame(out, request_id, m);
  return out;
}

Result<Message> DecodePayload(const FrameHeader& header, std::span<const uint8_t> payload) {
  if (payload.size() != header.payload_length) {
    return ProtocolError(std::string(MessageTypeName(header.type)) + ": payload is " + std::to_string(payload.size()) +
                         " bytes, header declares " + std::to_string(header.payload_length));
  }
  const int i = Messages::IndexOf(static_cast<uint16_t>(header.type));
  if (i >= 0) return Messages::kDecoders[static_cast<size_t>(i)](payload);
  return ProtocolError("unknown message type " + std::to_string(static_cast<uint16_t>(header.type)));
}

Result<std::pair<FrameHeader, Message>> DecodeFrame(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return ProtocolError("frame of " + std::to_string(bytes.size()) + " bytes is shorter than its " +
                         std::to_string(kHeaderBytes) + "-byte header");
  }
  Result<FrameHeader> h = DecodeHeader(bytes.first<kHeaderBytes>());
  if (!h.ok()) return h.status();
  const size_t expected = kHeaderBytes + size_t{h->payload_length};
  if (bytes.size() != expected) {
    return ProtocolError(std::string(MessageTypeName(h->type)) + " frame is " + std::to_string(bytes.size()) +
                         " bytes, header declares " + std::to_string(expected));
  }
  Result<Message> m = DecodePayload(*h, bytes.subspan(kHeaderBytes));
  if (!m.ok()) return m.status();
  return std::pair<FrameHeader, Message>(*h, std::move(m).value());
}

}  // namespace kvtier::wire
