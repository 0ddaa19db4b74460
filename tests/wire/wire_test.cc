#include "kvtier/wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "wire_samples.h"

namespace kvtier::wire {
namespace {

using Bytes = std::vector<uint8_t>;

// A frame with a valid header of `type` around a hand-written payload.
Bytes RawFrame(MessageType type, const std::function<void(Writer&)>& payload, uint64_t request_id = 1) {
  Bytes body;
  Writer w(&body, "test");
  payload(w);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  Bytes frame(kHeaderBytes);
  FrameHeader h;
  h.type = type;
  h.request_id = request_id;
  h.payload_length = static_cast<uint32_t>(body.size());
  EncodeHeader(h, std::span<uint8_t, kHeaderBytes>(frame.data(), kHeaderBytes));
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

void SetLengthField(Bytes& frame) {
  StoreLE<uint32_t>(frame.data() + 16, static_cast<uint32_t>(frame.size() - kHeaderBytes));
}

// Decodes `frame` and expects a kProtocolError whose message contains `needle`.
void ExpectProtocolError(const Bytes& frame, const std::string& needle) {
  auto r = DecodeFrame(frame);
  ASSERT_FALSE(r.ok()) << "decoded a frame that should fail (" << needle << ")";
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "'" << r.status().message() << "' does not mention '" << needle << "'";
}

Result<FrameHeader> HeaderOf(const Bytes& frame) {
  return DecodeHeader(std::span<const uint8_t, kHeaderBytes>(frame.data(), kHeaderBytes));
}

TEST(WireTest, SamplesCoverEveryMessageType) {
  const auto samples = testing::SampleMessages();
  EXPECT_EQ(samples.size(), std::variant_size_v<Message>);
  std::set<uint16_t> types;
  for (const auto& m : samples) {
    const MessageType t = TypeOf(m);
    EXPECT_STRNE(MessageTypeName(t), "Unknown");
    EXPECT_TRUE(IsKnownMessageType(static_cast<uint16_t>(t)));
    types.insert(static_cast<uint16_t>(t));
  }
  EXPECT_EQ(types.size(), samples.size()) << "two samples share a type";
  int known = 0;
  for (uint32_t t = 0; t <= 0xffff; ++t) known += IsKnownMessageType(static_cast<uint16_t>(t)) ? 1 : 0;
  EXPECT_EQ(known, static_cast<int>(samples.size())) << "a MessageType value has no Message alternative";
}

TEST(WireTest, EveryMessageRoundTrips) {
  uint64_t id = 1000;
  for (const auto& m : testing::SampleMessages()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    const Bytes frame = EncodeFrame(++id, m);
    ASSERT_GE(frame.size(), kHeaderBytes);

    auto decoded = DecodeFrame(frame);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    const FrameHeader& h = decoded->first;
    EXPECT_EQ(h.version, kProtocolVersion);
    EXPECT_EQ(h.type, TypeOf(m));
    EXPECT_EQ(h.request_id, id);
    EXPECT_EQ(h.payload_length, frame.size() - kHeaderBytes);
    EXPECT_EQ(h.flags, 0u);
    EXPECT_TRUE(decoded->second == m);

    // The two-step path a socket reader takes.
    auto header = HeaderOf(frame);
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    auto payload = DecodePayload(*header, std::span<const uint8_t>(frame).subspan(kHeaderBytes));
    ASSERT_TRUE(payload.ok()) << payload.status().ToString();
    EXPECT_TRUE(*payload == m);

    // Deterministic and canonical.
    EXPECT_EQ(EncodeFrame(id, decoded->second), frame);
    Bytes again;
    ASSERT_TRUE(TryAppendFrame(again, id, m).ok());
    EXPECT_EQ(again, frame);
  }
}

TEST(WireTest, SampleFieldsSurviveInDetail) {
  const auto samples = testing::SampleMessages();
  for (const auto& m : samples) {
    if (!std::holds_alternative<Welcome>(m)) continue;
    auto r = DecodeFrame(EncodeFrame(5, m));
    ASSERT_TRUE(r.ok());
    const auto& w = std::get<Welcome>(r->second);
    EXPECT_EQ(w.profile.name, "llama-8b");
    EXPECT_EQ(w.profile.dtype, DType::kBF16);
    EXPECT_EQ(w.profile.BlockBytes(), std::get<Welcome>(m).profile.BlockBytes());
    EXPECT_EQ(w.ns.id.hi, 0x5555666677778888ULL);
    ASSERT_EQ(w.pools.size(), 2u);
    EXPECT_EQ(w.pools[0].ipc_handle.size(), 64u);
    EXPECT_EQ(w.pools[1].tier, Tier::kHost);
    EXPECT_EQ(w.pools[1].shm_name, "/kvtier.1.host");
  }
}

TEST(WireTest, HeaderIsLittleEndianByteForByte) {
  const Bytes frame = EncodeFrame(0x0102030405060708ULL, Ping{0x1122334455667788ULL});
  const Bytes expected = {
      0x4B, 0x56, 0x54, 0x31,                          // magic "KVT1"
      0x03, 0x00,                                      // version 3
      0x03, 0x00,                                      // type Ping
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // request id
      0x08, 0x00, 0x00, 0x00,                          // payload length
      0x00, 0x00, 0x00, 0x00,                          // flags
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // nonce
  };
  EXPECT_EQ(frame, expected);
  EXPECT_EQ(std::memcmp(frame.data(), "KVT1", 4), 0);
}

TEST(WireTest, PayloadIsLittleEndian) {
  const Bytes frame = EncodeFrame(1, ErrorResponse{StatusCode::kNotFound, "ab"});
  const Bytes payload(frame.begin() + kHeaderBytes, frame.end());
  EXPECT_EQ(payload, (Bytes{0x02, 0x00, 0x02, 0x00, 0x00, 0x00, 'a', 'b'}));
}

TEST(WireTest, AppendFrameConcatenates) {
  Bytes stream;
  AppendFrame(stream, 1, Ping{1});
  AppendFrame(stream, 2, AllocateRequest{3});
  AppendFrame(stream, 3, OkResponse{});
  size_t pos = 0;
  std::vector<MessageType> seen;
  while (pos < stream.size()) {
    auto h = DecodeHeader(std::span<const uint8_t, kHeaderBytes>(stream.data() + pos, kHeaderBytes));
    ASSERT_TRUE(h.ok());
    auto m = DecodePayload(*h, std::span<const uint8_t>(stream).subspan(pos + kHeaderBytes, h->payload_length));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    seen.push_back(TypeOf(*m));
    pos += kHeaderBytes + h->payload_length;
  }
  EXPECT_EQ(pos, stream.size());
  EXPECT_EQ(seen,
            (std::vector<MessageType>{MessageType::kPing, MessageType::kAllocateRequest, MessageType::kOkResponse}));
}

TEST(WireTest, EveryTruncationIsAnError) {
  for (const auto& m : testing::SampleMessages()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    const Bytes frame = EncodeFrame(9, m);
    ASSERT_FALSE(frame.empty());
    for (size_t n = 0; n < frame.size(); ++n) {
      Bytes cut(frame.begin(), frame.begin() + static_cast<std::ptrdiff_t>(n));
      auto r = DecodeFrame(cut);
      ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes decoded";
      EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
      // The same prefix with a header that agrees with it: the payload decoder
      // itself must notice the missing bytes. The one exception is a cut right
      // before an extension field: that is the message without the extension.
      if (n >= kHeaderBytes) {
        SetLengthField(cut);
        auto r2 = DecodeFrame(cut);
        const Message without = testing::WithoutExtensions(m);
        if (r2.ok() && !(without == m) && n == EncodeFrame(9, without).size()) {
          EXPECT_TRUE(r2->second == without);
          continue;
        }
        ASSERT_FALSE(r2.ok()) << "payload prefix of " << n - kHeaderBytes << " bytes decoded";
        EXPECT_EQ(r2.status().code(), StatusCode::kProtocolError);
      }
    }
  }
}

TEST(WireTest, HeaderErrors) {
  const Bytes good = EncodeFrame(1, Ping{2});
  ASSERT_TRUE(DecodeFrame(good).ok());

  Bytes bad = good;
  bad[0] = 'X';
  ExpectProtocolError(bad, "magic");

  bad = good;
  StoreLE<uint16_t>(bad.data() + 4, 2);  // Version 2 had no model identities: not spoken any more.
  auto r = DecodeFrame(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(r.status().message().find("peer speaks 2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("this side speaks 3"), std::string::npos) << r.status().message();

  for (uint16_t t : {0, 8, 15, 45, 0x7fff, 0xffff}) {
    bad = good;
    StoreLE<uint16_t>(bad.data() + 6, t);
    ExpectProtocolError(bad, "unknown message type " + std::to_string(t));
  }

  bad = good;
  StoreLE<uint32_t>(bad.data() + 20, 1);
  ExpectProtocolError(bad, "flags");
  bad = good;
  StoreLE<uint32_t>(bad.data() + 20, 0x80000000u);
  ExpectProtocolError(bad, "flags");

  ExpectProtocolError(Bytes{}, "shorter than");
  ExpectProtocolError(Bytes(good.begin(), good.begin() + 23), "shorter than");
}

TEST(WireTest, OversizedLengthRejectedFromTheHeaderAlone) {
  // Only the 24 header bytes exist: the check must not need the payload.
  for (uint32_t len : {0xffffffffu, 0x80000000u, kMaxPayload + 1}) {
    Bytes header(kHeaderBytes);
    FrameHeader h;
    h.type = MessageType::kConfigResponse;
    h.payload_length = len;
    EncodeHeader(h, std::span<uint8_t, kHeaderBytes>(header.data(), kHeaderBytes));
    auto r = HeaderOf(header);
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
    EXPECT_NE(r.status().message().find("exceeds"), std::string::npos) << r.status().message();
  }
  Bytes header(kHeaderBytes);
  FrameHeader h;
  h.payload_length = kMaxPayload;
  EncodeHeader(h, std::span<uint8_t, kHeaderBytes>(header.data(), kHeaderBytes));
  EXPECT_TRUE(HeaderOf(header).ok());
}

TEST(WireTest, FrameSizeMustMatchHeader) {
  Bytes frame = EncodeFrame(1, Ping{2});
  frame.push_back(0);
  ExpectProtocolError(frame, "header declares");

  const Bytes good = EncodeFrame(1, Ping{2});
  auto h = HeaderOf(good);
  ASSERT_TRUE(h.ok());
  auto r = DecodePayload(*h, std::span<const uint8_t>(good).subspan(kHeaderBytes, 7));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
}

TEST(WireTest, TrailingBytesAreAnError) {
  for (const auto& m : testing::SampleMessages()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    Bytes frame = EncodeFrame(1, m);
    frame.push_back(0);
    SetLengthField(frame);
    ExpectProtocolError(frame, "trailing");
  }
}

TEST(WireTest, ArrayCountsAreBoundedBeforeAllocating) {
  // u32 array: count far larger than the payload.
  ExpectProtocolError(RawFrame(MessageType::kAllocateResponse,
                               [](Writer& w) {
                                 w.U64("lease_id", 1);
                                 w.U32("count", 0xffffffffu);
                                 w.U32("slot", 1);
                               }),
                      "AllocateResponse.slots: count 4294967295 exceeds the bound");
  ExpectProtocolError(RawFrame(MessageType::kAllocateResponse,
                               [](Writer& w) {
                                 w.U64("lease_id", 1);
                                 w.U32("count", 1000);
                                 w.U32("slot", 1);
                               }),
                      "AllocateResponse.slots: count 1000 needs at least 4000 bytes, 4 remain");
  // Struct array: each key needs 16 bytes.
  ExpectProtocolError(RawFrame(MessageType::kAcquireRequest,
                               [](Writer& w) {
                                 w.String("session", "s");
                                 w.U8("flags", 0);
                                 w.U32("count", 2);
                                 w.U64("lo", 1);
                                 w.U64("hi", 2);
                                 w.U64("lo", 3);
                               }),
                      "AcquireRequest.keys: count 2 needs at least 32 bytes, 24 remain");
  // Nested array inside a struct array.
  ExpectProtocolError(RawFrame(MessageType::kListSessionsResponse,
                               [](Writer& w) { w.U32("count", static_cast<uint32_t>(kMaxArray) + 1); }),
                      "ListSessionsResponse.sessions: count 1048577 exceeds the bound 1048576");
  ExpectProtocolError(RawFrame(MessageType::kStatsResponse, [](Writer& w) { w.U32("count", 3); }),
                      "StatsResponse.values: count 3 needs at least 36 bytes, 0 remain");
}

TEST(WireTest, StringsAreBounded) {
  const std::string long_name(kMaxString + 1, 'x');
  ExpectProtocolError(
      RawFrame(MessageType::kPrefetchRequest, [&](Writer& w) { w.String("session", long_name, kMaxConfigBytes); }),
      "PrefetchRequest.session: length 4097 exceeds the bound 4096");
  ExpectProtocolError(RawFrame(MessageType::kPrefetchRequest,
                               [](Writer& w) {
                                 w.U32("len", 10);
                                 w.U32("partial", 0);
                               }),
                      "PrefetchRequest.session: length 10 exceeds the 4 remaining bytes");
  ExpectProtocolError(RawFrame(MessageType::kPrefetchRequest, [](Writer& w) { w.U32("len", 0xffffffffu); }),
                      "exceeds the bound");
  // The bound of ipc_handle is its own.
  Welcome w;
  w.pools.push_back(PoolDesc{Tier::kGpu, 1, 1, "", Bytes(kMaxIpcHandle + 1, 7)});
  Bytes out;
  const Status st = TryAppendFrame(out, 1, w);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ipc_handle"), std::string::npos) << st.message();
  EXPECT_TRUE(out.empty());
}

TEST(WireTest, ConfigYamlMayExceedTheStringBound) {
  ConfigResponse big{std::string(200 * 1024, 'y')};
  auto r = DecodeFrame(EncodeFrame(1, big));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->second == Message(big));

  ConfigResponse huge{std::string(kMaxConfigBytes + 1, 'y')};
  Bytes out;
  EXPECT_EQ(TryAppendFrame(out, 1, huge).code(), StatusCode::kInvalidArgument);
  ExpectProtocolError(
      RawFrame(MessageType::kConfigResponse, [&](Writer& w) { w.String("yaml", huge.yaml, kMaxConfigBytes + 1); }),
      "ConfigResponse.yaml: length 1048577 exceeds the bound 1048576");
}

TEST(WireTest, InvalidEnumValuesAreErrors) {
  auto welcome_prefix = [](Writer& w, uint8_t dtype) {
    w.U16("version", 1);
    w.U64("instance_id", 5);
    w.U32("client_id", 7);
    w.String("name", "p");
    w.U32("layers", 2);
    w.U32("kv_heads", 2);
    w.U32("head_dim", 64);
    w.U8("dtype", dtype);
    w.U32("block_tokens", 16);
    w.U64("ns.lo", 1);
    w.U64("ns.hi", 2);
    w.String("backend", "host");
  };
  ExpectProtocolError(RawFrame(MessageType::kWelcome, [&](Writer& w) { welcome_prefix(w, 3); }),
                      "Welcome.profile.dtype: value 3 is outside [0, 3)");
  ExpectProtocolError(RawFrame(MessageType::kWelcome,
                               [&](Writer& w) {
                                 welcome_prefix(w, 2);
                                 w.U32("count", 2);
                                 w.U8("tier", 1);
                                 w.U64("slot_bytes", 1);
                                 w.U32("slots", 1);
                                 w.String("shm_name", "/a");
                                 w.U32("ipc_handle", 0);
                                 w.U8("tier", 2);
                                 w.U64("slot_bytes", 1);
                                 w.U32("slots", 1);
                                 w.String("shm_name", "/b");
                                 w.U32("ipc_handle", 0);
                               }),
                      "Welcome.pools[1].tier: value 2 is outside [0, 2)");

  auto acquire_response = [](uint8_t stream, uint8_t tier) {
    return RawFrame(MessageType::kAcquireResponse, [=](Writer& w) {
      w.U64("lease_id", 1);
      w.U32("matched", 1);
      w.U32("promoted", 0);
      w.U64("seq", 4);
      w.U8("stream", stream);
      w.U32("count", 1);
      w.U8("tier", tier);
      w.U32("slot", 9);
    });
  };
  ASSERT_TRUE(DecodeFrame(acquire_response(1, 1)).ok());
  ExpectProtocolError(acquire_response(2, 0), "AcquireResponse.fence.stream: value 2 is outside [0, 2)");
  ExpectProtocolError(acquire_response(0, 0xff), "AcquireResponse.blocks[0].tier: value 255");

  auto error_response = [](uint16_t code) {
    return RawFrame(MessageType::kErrorResponse, [=](Writer& w) {
      w.U16("code", code);
      w.String("message", "m");
    });
  };
  ASSERT_TRUE(DecodeFrame(error_response(static_cast<uint16_t>(StatusCode::kInternal))).ok());
  ExpectProtocolError(error_response(0), "ErrorResponse.code: value 0 is outside [1, 13)");
  ExpectProtocolError(error_response(13), "ErrorResponse.code: value 13");
  ExpectProtocolError(error_response(0xffff), "ErrorResponse.code");

  ExpectProtocolError(RawFrame(MessageType::kEvictRequest,
                               [](Writer& w) {
                                 w.String("session", "");
                                 w.String("tenant", "t");
                                 w.U8("all", 2);
                               }),
                      "EvictRequest.all: value 2 is outside [0, 2)");
  ExpectProtocolError(RawFrame(MessageType::kAcquireRequest,
                               [](Writer& w) {
                                 w.String("session", "s");
                                 w.U8("flags", 0x81);
                                 w.U32("keys", 0);
                                 w.U32("tokens", 0);
                               }),
                      "AcquireRequest.flags: has unknown bits set");
  ExpectProtocolError(RawFrame(MessageType::kAcquireRequest,
                               [](Writer& w) {
                                 w.String("session", "s");
                                 w.U8("flags", kAcquirePromote | kAcquirePromoteAfterRead);
                                 w.U32("keys", 0);
                                 w.U32("tokens", 0);
                               }),
                      "AcquireRequest.flags: asks to promote both before and after reading");
  for (uint8_t promote : {kAcquirePromote, kAcquirePromoteAfterRead}) {
    ExpectProtocolError(RawFrame(MessageType::kAcquireRequest,
                                 [promote](Writer& w) {
                                   w.String("session", "");
                                   w.U8("flags", kAcquireLocate | promote);
                                   w.U32("keys", 0);
                                   w.U32("tokens", 0);
                                 }),
                        "AcquireRequest.flags: asks to promote what it leases nothing of (locate)");
  }
  ExpectProtocolError(RawFrame(MessageType::kSaveRequest,
                               [](Writer& w) {
                                 w.U64("lease_id", 1);
                                 w.String("session", "s");
                                 w.U64("parent.lo", 0);
                                 w.U64("parent.hi", 0);
                                 w.U32("start_block", 0);
                                 w.U8("flags", kSaveAdopt | 0x10);
                               }),
                      "SaveRequest.flags: has unknown bits set");
}

// SetPriorityRequest.ttl_ms is an extension: without it the frame is the
// original layout, byte for byte, so older clients and newer daemons agree.
TEST(WireTest, ExtensionFieldKeepsTheOlderLayoutAndOneEncoding) {
  const auto v1 = [](Writer& w) {
    w.String("session", "chat-9");
    w.I32("priority", 4);
  };
  const Bytes older = RawFrame(MessageType::kSetPriorityRequest, v1);
  EXPECT_EQ(EncodeFrame(1, SetPriorityRequest{"chat-9", 4, 0}), older);
  auto r = DecodeFrame(older);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<SetPriorityRequest>(r->second).ttl_ms, 0u);

  const Bytes with_ttl = EncodeFrame(1, SetPriorityRequest{"chat-9", 4, 30000});
  ASSERT_EQ(with_ttl.size(), older.size() + 8);
  EXPECT_TRUE(std::equal(older.begin() + kHeaderBytes, older.end(), with_ttl.begin() + kHeaderBytes));
  EXPECT_EQ(LoadLE<uint64_t>(with_ttl.data() + older.size()), 30000u);
  r = DecodeFrame(with_ttl);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<SetPriorityRequest>(r->second).ttl_ms, 30000u);

  // An encoded default would be a second encoding of the older message.
  ExpectProtocolError(RawFrame(MessageType::kSetPriorityRequest,
                               [&](Writer& w) {
                                 v1(w);
                                 w.U64("ttl_ms", 0);
                               }),
                      "SetPriorityRequest.ttl_ms: is encoded with its default 0");
  // A partial extension is short, never read past the payload.
  for (size_t extra = 1; extra < 8; ++extra) {
    Bytes cut = with_ttl;
    cut.resize(older.size() + extra);
    SetLengthField(cut);
    ExpectProtocolError(cut, "SetPriorityRequest.ttl_ms: needs 8 bytes, " + std::to_string(extra) + " remain");
  }
}

TEST(WireTest, CrossFieldRules) {
  ExpectProtocolError(RawFrame(MessageType::kHello,
                               [](Writer& w) {
                                 w.U16("min", 3);
                                 w.U16("max", 2);
                               }),
                      "Hello.min_version");
  ExpectProtocolError(RawFrame(MessageType::kHello,
                               [](Writer& w) {
                                 w.U16("min", 0);
                                 w.U16("max", 2);
                               }),
                      "Hello.min_version");
  SessionInfoResponse si;
  si.chain = {BlockKey{1, 2}};
  Bytes out;
  EXPECT_EQ(TryAppendFrame(out, 1, si).code(), StatusCode::kInvalidArgument);
  si.tiers = {1};
  si.chain.clear();
  EXPECT_EQ(TryAppendFrame(out, 1, si).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(TryAppendFrame(out, 1, Hello{2, 1, "c", 1, "", ""}).code(), StatusCode::kInvalidArgument);
}

TEST(WireTest, EncodeRejectsOutOfRangeValues) {
  Bytes out;
  Welcome w;
  w.profile.dtype = static_cast<DType>(9);
  EXPECT_EQ(TryAppendFrame(out, 1, w).code(), StatusCode::kInvalidArgument);
  AcquireResponse a;
  a.fence.stream = static_cast<CopyDirection>(2);
  EXPECT_EQ(TryAppendFrame(out, 1, a).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TryAppendFrame(out, 1, ErrorResponse{StatusCode::kOk, ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());

  // AppendFrame sends the reason instead of an undecodable frame.
  AppendFrame(out, 77, a);
  auto r = DecodeFrame(out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->first.request_id, 77u);
  ASSERT_TRUE(std::holds_alternative<ErrorResponse>(r->second));
  const Status st = ToStatus(std::get<ErrorResponse>(r->second));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("AcquireResponse.fence.stream"), std::string::npos) << st.message();
}

TEST(WireTest, OversizedPayloadIsRefusedWhenEncoding) {
  SessionInfoResponse si;  // 16 bytes per key plus one tier byte: over 16 MiB at kMaxArray.
  si.chain.resize(kMaxArray);
  si.tiers.resize(kMaxArray);
  Bytes out = {1, 2, 3};
  const Status st = TryAppendFrame(out, 1, si);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_EQ(out, (Bytes{1, 2, 3}));

  out.clear();
  AppendFrame(out, 4, si);
  auto r = DecodeFrame(out);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(std::holds_alternative<ErrorResponse>(r->second));
  EXPECT_EQ(std::get<ErrorResponse>(r->second).code, StatusCode::kResourceExhausted);
}

TEST(WireTest, LargestArraysRoundTrip) {
  CommitRequest c;
  c.session = "big";
  c.tokens.resize(kMaxArray);
  for (size_t i = 0; i < c.tokens.size(); ++i) c.tokens[i] = static_cast<TokenId>(i * 2654435761u);
  c.slots.resize(kMaxArray / 16, 5);
  const Bytes frame = EncodeFrame(1, c);
  EXPECT_EQ(frame.size(), kHeaderBytes + 8 + 4 + 3 + 16 + 4 + 4 + 4 * kMaxArray + 4 + 4 * (kMaxArray / 16));
  auto r = DecodeFrame(frame);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->second == Message(c));

  c.tokens.push_back(1);
  Bytes out;
  EXPECT_EQ(TryAppendFrame(out, 1, c).code(), StatusCode::kInvalidArgument);
}

TEST(WireTest, WriterModesAgree) {
  auto encode = [](Writer& w) {
    w.U8("a", 0xab);
    w.U16("b", 0x1234);
    w.I32("c", -2);
    w.F64("d", 1.5);
    w.String("e", "xyz");
    w.U32s("f", std::vector<uint32_t>{7, 8});
  };
  Writer counter(nullptr, "t");
  encode(counter);
  Bytes appended;
  Writer appender(&appended, "t");
  encode(appender);
  Bytes buffer(counter.size());
  Writer filler(std::span<uint8_t>(buffer), "t");
  encode(filler);
  ASSERT_TRUE(counter.ok() && appender.ok() && filler.ok());
  EXPECT_EQ(appended.size(), counter.size());
  EXPECT_EQ(filler.size(), counter.size());
  EXPECT_EQ(buffer, appended);
  EXPECT_EQ(Bytes(appended.begin(), appended.begin() + 7), (Bytes{0xab, 0x34, 0x12, 0xfe, 0xff, 0xff, 0xff}));

  Bytes small(counter.size() - 1);
  Writer overflow(std::span<uint8_t>(small), "t");
  encode(overflow);
  EXPECT_EQ(overflow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.status().message().find("output buffer"), std::string::npos);
}

TEST(WireTest, StatusConversion) {
  const Status s(StatusCode::kNotFound, "no session 'x'");
  const ErrorResponse e = FromStatus(s);
  EXPECT_EQ(e.code, StatusCode::kNotFound);
  const Status back = ToStatus(e);
  EXPECT_EQ(back.code(), StatusCode::kNotFound);
  EXPECT_EQ(back.message(), "no session 'x'");

  EXPECT_EQ(FromStatus(Status::Ok()).code, StatusCode::kInternal);
  EXPECT_FALSE(ToStatus(ErrorResponse{StatusCode::kOk, "?"}).ok());

  const ErrorResponse long_msg = FromStatus(Internal(std::string(3 * kMaxString, 'z')));
  EXPECT_EQ(long_msg.message.size(), kMaxString);
  EXPECT_TRUE(DecodeFrame(EncodeFrame(1, long_msg)).ok());

  const ErrorResponse odd = FromStatus(Status(static_cast<StatusCode>(999), "odd"));
  EXPECT_EQ(odd.code, StatusCode::kInternal);
  EXPECT_TRUE(DecodeFrame(EncodeFrame(1, odd)).ok());

  // Every code the wire accepts has a name, and the next one does not exist
  // yet: appending a StatusCode must extend the wire's accepted range too.
  for (uint16_t c = 1; c <= static_cast<uint16_t>(StatusCode::kInternal); ++c) {
    EXPECT_NE(StatusCodeName(static_cast<StatusCode>(c)), "unknown");
    const ErrorResponse er{static_cast<StatusCode>(c), "m"};
    EXPECT_TRUE(DecodeFrame(EncodeFrame(1, er)).ok()) << c;
  }
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(static_cast<uint16_t>(StatusCode::kInternal) + 1)), "unknown");
}

TEST(WireTest, MessageTypeNames) {
  EXPECT_STREQ(MessageTypeName(MessageType::kAcquireResponse), "AcquireResponse");
  EXPECT_STREQ(MessageTypeName(MessageType::kHello), "Hello");
  EXPECT_STREQ(MessageTypeName(static_cast<MessageType>(999)), "Unknown");
  EXPECT_EQ(TypeOf(Message(SessionInfoResponse{})), MessageType::kSessionInfoResponse);
}

TEST(WireTest, NamesComeFromTheMessageStructs) {
  for (const Message& m : testing::SampleMessages()) {
    std::visit(
        [](const auto& msg) {
          using M = std::decay_t<decltype(msg)>;
          EXPECT_STREQ(MessageTypeName(M::kType), M::kName);
        },
        m);
  }
}

// Welcome.backend is an enum in the struct and its name on the wire: a u32
// length and "host" or "cuda", the layout every version-1 peer speaks.
TEST(WireTest, BackendKindTravelsAsItsName) {
  EXPECT_STREQ(BackendKindName(BackendKind::kHost), "host");
  EXPECT_STREQ(BackendKindName(BackendKind::kCuda), "cuda");
  EXPECT_STREQ(BackendKindName(static_cast<BackendKind>(7)), "unknown");
  EXPECT_EQ(ParseBackendKind("cuda"), BackendKind::kCuda);
  EXPECT_EQ(ParseBackendKind("tpu"), std::nullopt);

  Welcome w;
  w.backend = BackendKind::kHost;
  Bytes frame = EncodeFrame(1, w);
  const std::string host("\x04\0\0\0host", 8);
  auto at = std::search(frame.begin(), frame.end(), host.begin(), host.end());
  ASSERT_NE(at, frame.end()) << "the backend is a length-prefixed string";
  auto r = DecodeFrame(frame);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<Welcome>(r->second).backend, BackendKind::kHost);

  std::copy_n("tpu!", 4, at + 4);
  ExpectProtocolError(frame, "Welcome.backend: names no backend kind");

  Bytes out;
  w.backend = static_cast<BackendKind>(7);
  EXPECT_EQ(TryAppendFrame(out, 1, w).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

// Random damage to valid frames: decoding must never crash, and whatever does
// decode must re-encode to the very same bytes.
TEST(WireTest, RandomMutationsDecodeOrFailCleanly) {
  const auto samples = testing::SampleMessages();
  std::vector<Bytes> frames;
  for (const auto& m : samples) frames.push_back(EncodeFrame(3, m));

  std::mt19937_64 rng(20240611);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const uint32_t interesting[] = {0,           1,          2,         3,    0x7f,     0x80,           0xff,
                                  0x100,       0xffff,     4096,      4097, 1u << 20, (1u << 20) + 1, 0x7fffffff,
                                  0x80000000u, 0xfffffffe, 0xffffffff};
  int decoded = 0;
  int failed = 0;
  constexpr int kIterations = 20000;
  for (int iter = 0; iter < kIterations; ++iter) {
    Bytes f = frames[pick(frames.size())];
    const int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits; ++e) {
      const size_t lo = kHeaderBytes;  // Mostly damage the payload; sometimes the header.
      const size_t from = (pick(8) == 0 || f.size() <= lo) ? 0 : lo;
      const size_t span = f.size() - from;
      switch (pick(6)) {
        case 0:
          if (span > 0) f[from + pick(span)] ^= static_cast<uint8_t>(1u << pick(8));
          break;
        case 1:
          if (span > 0) f[from + pick(span)] = static_cast<uint8_t>(rng());
          break;
        case 2:
          if (span >= 4) {
            StoreLE<uint32_t>(f.data() + from + pick(span - 3), interesting[pick(std::size(interesting))]);
          }
          break;
        case 3: {
          const size_t at = from + (span ? pick(span + 1) : 0);
          const size_t n = 1 + pick(8);
          Bytes ins(n);
          for (auto& b : ins) b = static_cast<uint8_t>(rng());
          f.insert(f.begin() + static_cast<std::ptrdiff_t>(at), ins.begin(), ins.end());
          break;
        }
        case 4:
          if (span > 0) {
            const size_t at = from + pick(span);
            const size_t n = 1 + pick(std::min<size_t>(8, f.size() - at));
            f.erase(f.begin() + static_cast<std::ptrdiff_t>(at), f.begin() + static_cast<std::ptrdiff_t>(at + n));
          }
          break;
        case 5:
          f.resize(pick(f.size() + 1));
          break;
      }
    }
    if (f.size() >= kHeaderBytes && pick(4) != 0) SetLengthField(f);  // Reach the payload decoder.

    auto r = DecodeFrame(f);
    if (r.ok()) {
      ++decoded;
      ASSERT_EQ(EncodeFrame(r->first.request_id, r->second), f) << "iteration " << iter;
    } else {
      ++failed;
      const StatusCode c = r.status().code();
      ASSERT_TRUE(c == StatusCode::kProtocolError || c == StatusCode::kVersionMismatch) << r.status().ToString();
      ASSERT_FALSE(r.status().message().empty());
    }
  }
  EXPECT_GT(decoded, kIterations / 50);
  EXPECT_GT(failed, kIterations / 4);
  std::printf("mutations: %d decoded, %d rejected\n", decoded, failed);
}

// The checked-in fuzz seeds: every valid_* file is a current, canonical frame of
// the type it names (rerun kvtier-wire-corpus after a format change), and every
// bad_* file is rejected.
TEST(WireTest, CheckedInCorpusIsCurrent) {
  const std::filesystem::path dir(KVTIER_FRAME_CORPUS_DIR);
  std::set<std::string> valid_types;
  int bad = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::ifstream in(entry.path(), std::ios::binary);
    const Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto r = DecodeFrame(bytes);
    if (name.rfind("valid_", 0) == 0) {
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
      EXPECT_EQ(name, std::string("valid_") + MessageTypeName(TypeOf(r->second)));
      EXPECT_EQ(EncodeFrame(r->first.request_id, r->second), bytes) << name;
      valid_types.insert(name);
    } else if (name.rfind("bad_", 0) == 0) {
      EXPECT_FALSE(r.ok()) << name << " decodes";
      ++bad;
    }
  }
  EXPECT_EQ(valid_types.size(), std::variant_size_v<Message>);
  EXPECT_GE(bad, 10);
}

// Welcome.fence_events and CommitRequest.writer_event are byte-string
// extensions: absent on the host backend (the older layout, byte for byte),
// a u32 length and the handles on cuda; an empty or ragged one is an error.
TEST(WireTest, EventHandleExtensionsKeepTheOlderLayout) {
  for (const auto& m : testing::SampleMessages()) {
    const Message without = testing::WithoutExtensions(m);
    if (!std::holds_alternative<Welcome>(m) && !std::holds_alternative<CommitRequest>(m) &&
        !std::holds_alternative<SaveRequest>(m)) {
      continue;
    }
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    const Bytes older = EncodeFrame(3, without);
    const Bytes with = EncodeFrame(3, m);
    ASSERT_GT(with.size(), older.size() + 4);
    EXPECT_TRUE(std::equal(older.begin() + kHeaderBytes, older.end(), with.begin() + kHeaderBytes));
    const uint32_t len = LoadLE<uint32_t>(with.data() + older.size());
    EXPECT_EQ(len, with.size() - older.size() - 4);
    EXPECT_EQ(len % kIpcEventHandleBytes, 0u);
    auto r = DecodeFrame(older);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->second == without);
    r = DecodeFrame(with);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->second == m);

    // Encoded empty: a second encoding of the older message.
    Bytes empty = older;
    empty.insert(empty.end(), 4, 0);
    SetLengthField(empty);
    ExpectProtocolError(empty, "omit it instead");
    // One byte short of whole handles.
    Bytes ragged(with.begin(), with.end() - 1);
    StoreLE<uint32_t>(ragged.data() + older.size(), len - 1);
    SetLengthField(ragged);
    ExpectProtocolError(ragged, "64-byte");
  }
}

TEST(WireTest, TooManyFenceEventsAreRefusedBothWays) {
  Welcome w = std::get<Welcome>(testing::SampleMessages()[1]);
  w.fence_events.resize(kMaxFenceEvents + 1);
  std::vector<uint8_t> out;
  EXPECT_EQ(TryAppendFrame(out, 1, w).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
  w.fence_events.resize(kMaxFenceEvents);
  EXPECT_TRUE(TryAppendFrame(out, 1, w).ok());
}

// ListSessionsRequest.page is a byte-string extension holding the page's own
// fields: without it the request is the older one, byte for byte.
TEST(WireTest, ListSessionsPagingKeepsTheOlderLayout) {
  const Bytes older = RawFrame(MessageType::kListSessionsRequest, [](Writer& w) { w.String("tenant_filter", "t"); });
  EXPECT_EQ(EncodeFrame(1, ListSessionsRequest{"t", std::nullopt}), older);
  auto r = DecodeFrame(older);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(std::get<ListSessionsRequest>(r->second).page.has_value());

  const ListSessionsRequest paged{"t", ListSessionsPage{7, "t", "chat-3"}};
  const Bytes with = EncodeFrame(1, paged);
  ASSERT_EQ(with.size(), older.size() + 4 + 4 + (4 + 1) + (4 + 6));
  EXPECT_TRUE(std::equal(older.begin() + kHeaderBytes, older.end(), with.begin() + kHeaderBytes));
  EXPECT_EQ(LoadLE<uint32_t>(with.data() + older.size()), with.size() - older.size() - 4);
  EXPECT_EQ(LoadLE<uint32_t>(with.data() + older.size() + 4), 7u) << "the limit comes first";
  r = DecodeFrame(with);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<ListSessionsRequest>(r->second) == paged);
  // The first page: no cursor at all.
  const ListSessionsRequest first{"", ListSessionsPage{0, "", ""}};
  r = DecodeFrame(EncodeFrame(2, first));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<ListSessionsRequest>(r->second) == first);

  // Encoded empty: a second encoding of the older request.
  Bytes empty = older;
  empty.insert(empty.end(), 4, 0);
  SetLengthField(empty);
  ExpectProtocolError(empty, "omit it instead");
  // The page's own fields are checked too: cut short, trailing bytes, a tenant without an id.
  auto page_frame = [](const std::function<void(Writer&)>& fields) {
    return RawFrame(MessageType::kListSessionsRequest, [&](Writer& w) {
      w.String("tenant_filter", "");
      Bytes inner;
      Writer iw(&inner, "page");
      fields(iw);
      w.Bytes("page", inner, 1 << 16);
    });
  };
  ExpectProtocolError(page_frame([](Writer& w) { w.U32("limit", 1); }), "ListSessionsRequest.page: page.after_tenant");
  ExpectProtocolError(page_frame([](Writer& w) {
                        w.U32("limit", 1);
                        w.String("", "");
                        w.String("", "x");
                        w.U8("", 0);
                      }),
                      "trailing bytes");
  ExpectProtocolError(page_frame([](Writer& w) {
                        w.U32("limit", 1);
                        w.String("", "t");
                        w.String("", "");
                      }),
                      "after_tenant: is set without an after_id");
  std::vector<uint8_t> out;
  EXPECT_EQ(TryAppendFrame(out, 1, ListSessionsRequest{"", ListSessionsPage{1, "t", ""}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

// ListSessionsResponse.more is a u64 extension that is 1 when present.
TEST(WireTest, ListSessionsMoreIsAnExtensionThatIsOneWhenPresent) {
  const ListSessionsResponse last{{}, false}, more{{}, true};
  const Bytes older = EncodeFrame(1, last);
  EXPECT_EQ(older.size(), kHeaderBytes + 4) << "the older layout: the array alone";
  const Bytes with = EncodeFrame(1, more);
  ASSERT_EQ(with.size(), older.size() + 8);
  EXPECT_EQ(LoadLE<uint64_t>(with.data() + older.size()), 1u);
  auto r = DecodeFrame(with);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<ListSessionsResponse>(r->second).more);
  Bytes two = with;
  StoreLE<uint64_t>(two.data() + older.size(), 2);
  ExpectProtocolError(two, "ListSessionsResponse.more: must be 1");
  Bytes zero = with;
  StoreLE<uint64_t>(zero.data() + older.size(), 0);
  ExpectProtocolError(zero, "omit it instead");
}

// SessionInfoResponse names the stores in an extension: without stores it is
// the older layout byte for byte; a malformed list is a protocol error.
TEST(WireTest, SessionInfoStoreNamesAreAnExtension) {
  SessionInfoResponse none;
  none.chain = {BlockKey{1, 2}};
  none.tiers = {16};
  const Bytes older = EncodeFrame(1, none);
  SessionInfoResponse named = none;
  named.stores = {"disk", "redis0", "redis1"};
  const Bytes with = EncodeFrame(1, named);
  ASSERT_EQ(with.size(), older.size() + 4 + std::string("disk,redis0,redis1").size());
  EXPECT_TRUE(std::equal(older.begin() + kHeaderBytes, older.end(), with.begin() + kHeaderBytes))
      << "the older payload, then the extension";
  auto r = DecodeFrame(with);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<SessionInfoResponse>(r->second).stores, named.stores);
  auto o = DecodeFrame(older);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(std::get<SessionInfoResponse>(o->second).stores.empty());
  Bytes out;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{""}, {"a,b"}, {std::string(65, 'x')}, std::vector<std::string>(17, "disk")}) {
    SessionInfoResponse m = none;
    m.stores = bad;
    EXPECT_EQ(TryAppendFrame(out, 1, m).code(), StatusCode::kInvalidArgument) << ::testing::PrintToString(bad);
  }
  Bytes comma = with;
  comma[comma.size() - 1] = ',';  // "disk,redis0,redis," : an empty name.
  ExpectProtocolError(comma, "SessionInfoResponse.stores");
}

// What the daemon sizes its replies with.
TEST(WireTest, PayloadSizeAndEncodedSizeMatchTheEncoding) {
  for (const auto& m : testing::SampleMessages()) {
    SCOPED_TRACE(MessageTypeName(TypeOf(m)));
    auto n = PayloadSize(m);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n + kHeaderBytes, EncodeFrame(1, m).size());
    if (const auto* l = std::get_if<ListSessionsResponse>(&m)) {
      size_t rows = 0;
      for (const SessionSummary& s : l->sessions) rows += EncodedSize(s);
      EXPECT_EQ(*n, 4 + rows + (l->more ? 8 : 0));
    }
  }
  ListSessionsRequest bad;
  bad.tenant_filter.assign(kMaxString + 1, 'x');
  EXPECT_EQ(PayloadSize(bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::wire
