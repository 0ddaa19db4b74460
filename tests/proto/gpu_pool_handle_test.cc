// GpuPoolHandle: the bytes a client gets to open a GPU pool.
#include "kvtier/gpu_pool_handle.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

GpuPoolHandle Sample() {
  GpuPoolHandle h;
  h.bytes = uint64_t{80} << 30;
  for (size_t i = 0; i < h.device_uuid.size(); ++i) h.device_uuid[i] = static_cast<uint8_t>(0xa0 + i);
  for (size_t i = 0; i < h.raw.size(); ++i) h.raw[i] = static_cast<uint8_t>(i * 37 + 1);
  return h;
}

TEST(GpuPoolHandleTest, RoundTripsWithItsDeviceUuid) {
  const GpuPoolHandle h = Sample();
  const std::vector<uint8_t> enc = EncodeGpuPoolHandle(h);
  ASSERT_EQ(enc.size(), 32u + kCudaIpcHandleBytes);
  auto back = DecodeGpuPoolHandle(enc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, h);
}

TEST(GpuPoolHandleTest, LayoutIsLittleEndianByteForByte) {
  const std::vector<uint8_t> enc = EncodeGpuPoolHandle(Sample());
  EXPECT_EQ(enc[0], kGpuPoolHandleVersion);
  EXPECT_EQ(enc[1], 0);                                          // kind
  EXPECT_EQ(enc[2] | enc[3], 0);                                 // reserved
  EXPECT_EQ(enc[4] | enc[5] << 8 | enc[6] << 16 | enc[7] << 24, 64);  // raw_bytes
  EXPECT_EQ(enc[12], 0x14);                                      // 80 GiB = 0x14_0000_0000
  EXPECT_EQ(enc[16], 0xa0);                                      // uuid
  EXPECT_EQ(enc[31], 0xaf);
  EXPECT_EQ(enc[32], 1);                                         // raw[0]
  EXPECT_EQ(enc.back(), static_cast<uint8_t>(63 * 37 + 1));
}

TEST(GpuPoolHandleTest, FormatsTheUuidAsNvidiaSmiDoes) {
  GpuUuid u{};
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<uint8_t>(i * 17);
  EXPECT_EQ(FormatGpuUuid(u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

TEST(GpuPoolHandleTest, EveryTruncationAndExtensionIsAnError) {
  const std::vector<uint8_t> good = EncodeGpuPoolHandle(Sample());
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = DecodeGpuPoolHandle(std::span<const uint8_t>(good.data(), n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolError) << n;
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_EQ(DecodeGpuPoolHandle(longer).status().code(), StatusCode::kProtocolError);
}

TEST(GpuPoolHandleTest, RejectsEachBadField) {
  const std::vector<uint8_t> good = EncodeGpuPoolHandle(Sample());
  const auto decode_with = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> b = good;
    b[at] = value;
    return DecodeGpuPoolHandle(b).status();
  };
  Status st = decode_with(0, 1);  // Version 1 had no uuid.
  EXPECT_EQ(st.code(), StatusCode::kProtocolError);
  EXPECT_NE(st.message().find("version 1"), std::string::npos) << st.ToString();
  EXPECT_EQ(decode_with(1, 7).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decode_with(3, 1).code(), StatusCode::kProtocolError);   // reserved
  EXPECT_EQ(decode_with(4, 65).code(), StatusCode::kProtocolError);  // raw_bytes disagrees with the size

  GpuPoolHandle zero_bytes = Sample();
  zero_bytes.bytes = 0;
  EXPECT_EQ(DecodeGpuPoolHandle(EncodeGpuPoolHandle(zero_bytes)).status().code(), StatusCode::kProtocolError);
  GpuPoolHandle zero_uuid = Sample();
  zero_uuid.device_uuid = {};
  st = DecodeGpuPoolHandle(EncodeGpuPoolHandle(zero_uuid)).status();
  EXPECT_EQ(st.code(), StatusCode::kProtocolError);
  EXPECT_NE(st.message().find("uuid"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace kvtier
