// Fuzz target for the control-plane frame decoder.
//
// Two views of each input: (1) a whole frame, through DecodeFrame; (2) a payload
// whose type is picked by the first byte, through DecodePayload, so the fuzzer
// reaches every message decoder without first having to forge a header. Whatever
// decodes must re-encode to exactly the input bytes (every message has one
// encoding) and decode again to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "kvtier/wire.h"

namespace {

using kvtier::wire::FrameHeader;
using kvtier::wire::Message;
using kvtier::wire::MessageType;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "frame_fuzz: %s\n", what);
  std::abort();
}

const std::vector<MessageType>& KnownTypes() {
  static const std::vector<MessageType> types = [] {
    std::vector<MessageType> v;
    for (uint32_t t = 0; t <= 0xffff; ++t) {
      if (kvtier::wire::IsKnownMessageType(static_cast<uint16_t>(t))) v.push_back(static_cast<MessageType>(t));
    }
    return v;
  }();
  return types;
}

// Re-encodes `m` and checks it against `expected`, then decodes that and encodes again.
void CheckCanonical(std::span<const uint8_t> expected, uint64_t request_id, const Message& m) {
  std::vector<uint8_t> once;
  if (!kvtier::wire::TryAppendFrame(once, request_id, m).ok()) Die("a decoded message does not encode");
  if (once.size() != expected.size() || !std::equal(once.begin(), once.end(), expected.begin())) {
    Die("re-encoding differs from the decoded bytes");
  }
  auto again = kvtier::wire::DecodeFrame(once);
  if (!again.ok()) Die("a re-encoded frame does not decode");
  if (again->first.request_id != request_id || kvtier::wire::TypeOf(again->second) != kvtier::wire::TypeOf(m)) {
    Die("header changed across a round trip");
  }
  std::vector<uint8_t> twice;
  if (!kvtier::wire::TryAppendFrame(twice, request_id, again->second).ok()) Die("second encode failed");
  if (twice != once) Die("second re-encoding differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);

  // (1) A whole frame.
  auto frame = kvtier::wire::DecodeFrame(input);
  if (frame.ok()) CheckCanonical(input, frame->first.request_id, frame->second);

  // (2) A type selector byte and a payload.
  if (size >= 1 && size - 1 <= kvtier::wire::kMaxPayload) {
    const auto& types = KnownTypes();
    FrameHeader h;
    h.type = types[data[0] % types.size()];
    h.request_id = size;
    h.payload_length = static_cast<uint32_t>(size - 1);
    auto payload = kvtier::wire::DecodePayload(h, input.subspan(1));
    if (payload.ok()) {
      std::vector<uint8_t> expected(kvtier::wire::kHeaderBytes);
      kvtier::wire::EncodeHeader(
          h, std::span<uint8_t, kvtier::wire::kHeaderBytes>(expected.data(), kvtier::wire::kHeaderBytes));
      expected.insert(expected.end(), input.begin() + 1, input.end());
      CheckCanonical(expected, h.request_id, *payload);
    }
  }
  return 0;
}
