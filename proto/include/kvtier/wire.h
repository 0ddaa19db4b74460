// The control-plane wire format: frames and the messages they carry.
//
// A frame is a 24-byte header followed by `payload_length` bytes of payload,
// all little-endian regardless of the host:
//
//   offset  size  field
//        0     4  magic           0x3154564B ("KVT1" in byte order)
//        4     2  version         kProtocolVersion
//        6     2  type            MessageType
//        8     8  request_id      chosen by the requester, echoed in the reply
//       16     4  payload_length  <= kMaxPayload
//       20     4  flags           must be 0
//
// The payload is the message's fields in declaration order, encoded as
// wire_codec.h describes. Every message has exactly one encoding, so
// EncodeFrame(DecodeFrame(b)) == b for every frame b that decodes.
//
// Decoding never trusts the peer: any byte string yields a message or a
// kProtocolError (kVersionMismatch for a wrong header version) that names the
// offending field, without reading out of bounds or allocating more than a small
// multiple of the payload. A receiver reads the header, calls DecodeHeader (which
// rejects an oversized length before any payload is read), reads exactly
// payload_length bytes and calls DecodePayload.
//
// Message type values are stable: append new types, never renumber. A message's
// layout never changes within a protocol version, with one exception: a message
// may gain *extension fields* after its last field (marked "Extension" below).
// An extension field is encoded only when it differs from its default; absent
// means the default, and an encoded default is a protocol error, so every
// message keeps exactly one encoding and a frame without the extension is byte
// for byte the older layout. A receiver that predates an extension rejects a
// message carrying it (trailing bytes), so senders set one only where an older
// peer must fail rather than ignore it. Extension fields are u64s (ExtensionU64)
// or byte strings (ExtensionBytes: a u32 length and at least one byte); a
// message has at most one, so "absent" can only mean "the last field is absent".
//
// Version 2 (version 1 named shared-memory segments in /dev/shm, where any
// member of the group could open, write and truncate them): the Welcome frame
// arrives with file descriptors (SCM_RIGHTS, on its first byte), one per
// segment, in this order: each pool of Welcome.pools that has no IPC handle,
// in tier order, then the index, then the fence segment. The names in the
// Welcome are labels for messages. Every descriptor but the host backend's
// GPU pool is sealed read-only; none can be resized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/wire_messages.h"

namespace kvtier::wire {

inline constexpr uint32_t kMagic = 0x3154564B;  // "KVT1"
inline constexpr size_t kHeaderBytes = 24;

struct FrameHeader {
  uint16_t version = kProtocolVersion;
  MessageType type = MessageType::kPing;
  uint64_t request_id = 0;
  uint32_t payload_length = 0;
  uint32_t flags = 0;

  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// Writes the 24 header bytes (with kMagic).
void EncodeHeader(const FrameHeader& header, std::span<uint8_t, kHeaderBytes> out);
// Checks, in order: magic, version (kVersionMismatch), type known, flags == 0,
// payload_length <= kMaxPayload. Every failure but the version is kProtocolError.
Result<FrameHeader> DecodeHeader(std::span<const uint8_t, kHeaderBytes> bytes);

// ---- Frames ----

// Bytes a SessionSummary takes in a reply (ListSessionsResponse.sessions): its
// fixed fields and its two strings.
size_t EncodedSize(const SessionSummary& s);
// The payload bytes `m` encodes to (a counting pass: nothing is written), or
// kInvalidArgument if it breaks a bound of the format, as TryAppendFrame would.
Result<size_t> PayloadSize(const Message& m);

// Appends one frame (header + payload) to `out`. Fails with kInvalidArgument,
// leaving `out` unchanged, if `m` breaks a bound of the format (a string or array
// too long, an enum out of range, Hello.min_version > max_version, ...), or with
// kResourceExhausted if the payload would exceed kMaxPayload.
Status TryAppendFrame(std::vector<uint8_t>& out, uint64_t request_id, const Message& m);
// Like TryAppendFrame, but never fails: a message that cannot be encoded is
// replaced by an ErrorResponse carrying the reason, so the peer always receives
// a frame it can decode. Use TryAppendFrame where the sender must know.
void AppendFrame(std::vector<uint8_t>& out, uint64_t request_id, const Message& m);
std::vector<uint8_t> EncodeFrame(uint64_t request_id, const Message& m);

// Decodes the payload of a frame whose header DecodeHeader accepted.
// payload.size() must equal header.payload_length.
Result<Message> DecodePayload(const FrameHeader& header, std::span<const uint8_t> payload);
// Decodes exactly one whole frame; a short or long `bytes` is an error.
Result<std::pair<FrameHeader, Message>> DecodeFrame(std::span<const uint8_t> bytes);

}  // namespace kvtier::wire
