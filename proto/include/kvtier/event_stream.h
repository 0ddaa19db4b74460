// The KV event stream's framing, shared by kvtierd's publisher, cachectl events
// and subscribers written in C++ (docs/events.md has the whole format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvtier::events {

// A batch's format version (its "v" field).
inline constexpr uint32_t kFormatVersion = 1;
// The sequence number of a replay's end marker.
inline constexpr uint64_t kReplayEnd = ~uint64_t{0};
// The sequence-number frame: 8 bytes, big-endian.
inline constexpr size_t kSeqBytes = 8;

// Where kvtierd publishes and answers replays unless events.publish and
// events.replay say otherwise: ipc sockets next to its own socket.
inline std::string DefaultPublishEndpoint(std::string_view socket_path) {
  return "ipc://" + std::string(socket_path) + ".events";
}
inline std::string DefaultReplayEndpoint(std::string_view socket_path) {
  return "ipc://" + std::string(socket_path) + ".replay";
}

inline std::string EncodeSeq(uint64_t seq) {
  std::string out(kSeqBytes, '\0');
  for (size_t i = 0; i < kSeqBytes; ++i) out[i] = static_cast<char>((seq >> (56 - 8 * i)) & 0xff);
  return out;
}

// The sequence number in `frame`, or kReplayEnd if it is not kSeqBytes long.
inline uint64_t DecodeSeq(const void* frame, size_t size) {
  if (size != kSeqBytes) return kReplayEnd;
  const auto* p = static_cast<const unsigned char*>(frame);
  uint64_t v = 0;
  for (size_t i = 0; i < kSeqBytes; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace kvtier::events
