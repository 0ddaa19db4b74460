// Writes the seed corpus of the frame fuzz target: one valid frame of every
// message type and a set of malformed frames. Usage: kvtier-wire-corpus DIR.
// The seeds in tests/fuzz/corpus/frame were made with it; rerun it after a
// change to the wire format and check the files in.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kvtier/wire.h"
#include "wire_samples.h"

namespace {

using Bytes = std::vector<uint8_t>;
namespace wire = kvtier::wire;

bool Write(const std::filesystem::path& dir, const std::string& name, const Bytes& bytes) {
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

void SetLength(Bytes& f) {
  wire::StoreLE<uint32_t>(f.data() + 16, static_cast<uint32_t>(f.size() - wire::kHeaderBytes));
}

Bytes Frame(wire::MessageType type, const Bytes& payload) {
  Bytes f(wire::kHeaderBytes);
  wire::FrameHeader h;
  h.type = type;
  h.request_id = 1;
  h.payload_length = static_cast<uint32_t>(payload.size());
  wire::EncodeHeader(h, std::span<uint8_t, wire::kHeaderBytes>(f.data(), wire::kHeaderBytes));
  f.insert(f.end(), payload.begin(), payload.end());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir);
  bool ok = true;

  uint64_t id = 1;
  for (const auto& m : wire::testing::SampleMessages()) {
    ok &= Write(dir, std::string("valid_") + wire::MessageTypeName(wire::TypeOf(m)), wire::EncodeFrame(id++, m));
  }

  const Bytes ping = wire::EncodeFrame(7, wire::Ping{42});
  Bytes f = ping;
  f[0] ^= 0xff;
  ok &= Write(dir, "bad_magic", f);
  f = ping;
  wire::StoreLE<uint16_t>(f.data() + 4, wire::kProtocolVersion + 1);
  ok &= Write(dir, "bad_version", f);
  f = ping;
  wire::StoreLE<uint16_t>(f.data() + 6, 999);
  ok &= Write(dir, "bad_type", f);
  f = ping;
  wire::StoreLE<uint32_t>(f.data() + 20, 1);
  ok &= Write(dir, "bad_flags", f);
  f = Bytes(ping.begin(), ping.begin() + wire::kHeaderBytes);
  wire::StoreLE<uint32_t>(f.data() + 16, 0xffffffffu);
  ok &= Write(dir, "bad_length_4gib", f);
  f = ping;
  f.push_back(0);
  SetLength(f);
  ok &= Write(dir, "bad_trailing_byte", f);

  for (const auto& m : wire::testing::SampleMessages()) {
    if (!std::holds_alternative<wire::Welcome>(m)) continue;
    const Bytes welcome = wire::EncodeFrame(2, m);
    ok &= Write(dir, "bad_truncated_welcome", Bytes(welcome.begin(), welcome.begin() + 60));
  }
  // Byte-string extensions: encoded empty (a second encoding), and a Welcome's
  // fence events one byte short of whole handles.
  for (const auto& m : wire::testing::SampleMessages()) {
    const wire::Message without = wire::testing::WithoutExtensions(m);
    if (!std::holds_alternative<wire::Welcome>(m) && !std::holds_alternative<wire::CommitRequest>(m) &&
        !std::holds_alternative<wire::SaveRequest>(m) && !std::holds_alternative<wire::ReleaseRequest>(m) && !std::holds_alternative<wire::Hello>(m)) {
      continue;
    }
    const std::string name = wire::MessageTypeName(wire::TypeOf(m));
    Bytes empty = wire::EncodeFrame(3, without);
    const size_t older = empty.size();
    empty.insert(empty.end(), 4, 0);
    SetLength(empty);
    ok &= Write(dir, "bad_extension_empty_" + name, empty);
    Bytes ragged = wire::EncodeFrame(3, m);
    ragged.pop_back();
    wire::StoreLE<uint32_t>(ragged.data() + older, static_cast<uint32_t>(ragged.size() - older - 4));
    SetLength(ragged);
    ok &= Write(dir, "bad_extension_ragged_" + name, ragged);
  }

  // AllocateResponse whose slot count far exceeds the payload.
  Bytes payload(12, 0);
  wire::StoreLE<uint32_t>(payload.data() + 8, 0x40000000u);
  ok &= Write(dir, "bad_array_count", Frame(wire::MessageType::kAllocateResponse, payload));
  // PrefetchRequest whose session is longer than kMaxString.
  payload.assign(4 + wire::kMaxString + 1, 's');
  wire::StoreLE<uint32_t>(payload.data(), static_cast<uint32_t>(wire::kMaxString + 1));
  ok &= Write(dir, "bad_long_string", Frame(wire::MessageType::kPrefetchRequest, payload));
  // ErrorResponse with code 0 (ok) and with an unknown code.
  payload = {0, 0, 0, 0, 0, 0};
  ok &= Write(dir, "bad_error_code_ok", Frame(wire::MessageType::kErrorResponse, payload));
  payload = {0xff, 0x00, 0, 0, 0, 0};
  ok &= Write(dir, "bad_error_code_unknown", Frame(wire::MessageType::kErrorResponse, payload));
  // EvictRequest with all = 2.
  payload = {0, 0, 0, 0, 0, 0, 0, 0, 2};
  ok &= Write(dir, "bad_bool", Frame(wire::MessageType::kEvictRequest, payload));
  // SetPriorityRequest with its ttl_ms extension encoded as the default 0, and cut short.
  const Bytes no_ttl = wire::EncodeFrame(1, wire::SetPriorityRequest{"chat-1", 3, 0});
  f = no_ttl;
  f.insert(f.end(), 8, 0);
  SetLength(f);
  ok &= Write(dir, "bad_extension_default", f);
  f = no_ttl;
  f.insert(f.end(), {0x10, 0x27, 0});
  SetLength(f);
  ok &= Write(dir, "bad_extension_truncated", f);

  // ListSessionsRequest.page encoded empty, and holding a cursor tenant
  // without a cursor id; ListSessionsResponse.more set to 2.
  const Bytes unpaged = wire::EncodeFrame(1, wire::ListSessionsRequest{"t", std::nullopt});
  f = unpaged;
  f.insert(f.end(), 4, 0);
  SetLength(f);
  ok &= Write(dir, "bad_page_empty", f);
  f = unpaged;
  f.insert(f.end(), {13, 0, 0, 0, /*limit*/ 5, 0, 0, 0, /*after_tenant*/ 1, 0, 0, 0, 't', /*after_id*/ 0, 0, 0, 0});
  SetLength(f);
  ok &= Write(dir, "bad_page_tenant_without_id", f);
  f = wire::EncodeFrame(1, wire::ListSessionsResponse{{}, true});
  f[f.size() - 8] = 2;
  ok &= Write(dir, "bad_more_two", f);

  if (!ok) {
    std::fprintf(stderr, "failed to write the corpus to %s\n", argv[1]);
    return 1;
  }
  return 0;
}
