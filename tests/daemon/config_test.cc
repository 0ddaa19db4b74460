// kvtierd's YAML configuration: the default file parses, and every mistake is
// reported with the key it concerns.
#include <gtest/gtest.h>

#include "config.h"

namespace kvtier::daemon {
namespace {

constexpr const char* kMinimal = R"(profiles:
  - name: p
    layers: 2
    kv_heads: 2
    head_dim: 64
    gpu_blocks: 10
    host_blocks: 20
)";

std::string ErrorOf(const std::string& yaml) {
  auto c = ParseConfig(yaml, "test.yaml");
  return c.ok() ? "" : c.status().message();
}

TEST(ConfigTest, TheShippedDefaultParses) {
  auto c = LoadConfigFile(KVTIER_DEFAULT_CONFIG);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->backend, "auto");
  ASSERT_EQ(c->profiles.size(), 1u);
  EXPECT_EQ(c->profiles[0].profile.BlockBytes(), 128u * 1024);
  EXPECT_EQ(c->profiles[0].gpu_blocks, 512u);   // 64 MiB of 128 KiB blocks.
  EXPECT_EQ(c->profiles[0].host_blocks, 4096u);  // 512 MiB.
}

TEST(ConfigTest, DefaultsFillWhatIsNotGiven) {
  auto c = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->instance, "kvtier");
  EXPECT_EQ(c->profiles[0].profile.block_tokens, 16u);
  EXPECT_EQ(c->profiles[0].profile.dtype, DType::kF16);
  EXPECT_DOUBLE_EQ(c->gpu_high_watermark, 0.90);
  EXPECT_EQ(c->max_frame_bytes, 16u << 20);
}

TEST(ConfigTest, TheDumpParsesBackToTheSameConfig) {
  auto c = ParseConfig(std::string(kMinimal) + "tiering:\n  gpu_low_watermark: 0.5\n", "test.yaml");
  ASSERT_TRUE(c.ok());
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << DumpConfig(*c);
  EXPECT_EQ(DumpConfig(*again), DumpConfig(*c));
  EXPECT_DOUBLE_EQ(again->gpu_low_watermark, 0.5);
}

TEST(ConfigTest, UnknownKeysAreErrorsNamingTheKey) {
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "sockett: /x\n").find("sockett: unknown key"), std::string::npos);
  const std::string nested = ErrorOf(std::string(kMinimal) + "tiering:\n  gpu_hgh_watermark: 0.5\n");
  EXPECT_NE(nested.find("tiering.gpu_hgh_watermark: unknown key"), std::string::npos) << nested;
  std::string p = kMinimal;
  p.replace(p.find("layers"), 6, "layerz");
  EXPECT_NE(ErrorOf(p).find("profiles[0].layerz"), std::string::npos) << ErrorOf(p);
}

TEST(ConfigTest, BadValuesNameTheKeyAndTheProblem) {
  std::string p = kMinimal;
  p.replace(p.find("head_dim: 64"), 12, "head_dim: lots");
  EXPECT_NE(ErrorOf(p).find("profiles[0].head_dim: expected a number"), std::string::npos) << ErrorOf(p);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "backend: gpu\n").find("backend: 'gpu' is not one of auto, host, cuda"),
            std::string::npos);
  const std::string wm = ErrorOf(std::string(kMinimal) + "tiering:\n  gpu_high_watermark: 1.5\n");
  EXPECT_NE(wm.find("tiering.gpu_high_watermark: must be in"), std::string::npos) << wm;
  const std::string order =
      ErrorOf(std::string(kMinimal) + "tiering:\n  gpu_high_watermark: 0.5\n  gpu_low_watermark: 0.6\n");
  EXPECT_NE(order.find("gpu_low_watermark: must not exceed"), std::string::npos) << order;
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "limits:\n  max_frame_bytes: 64MiB\n").find("limits.max_frame_bytes"),
            std::string::npos);
}

TEST(ConfigTest, ProfileMistakes) {
  EXPECT_NE(ErrorOf("backend: host\n").find("profiles: is required"), std::string::npos);
  std::string both = kMinimal;
  both.insert(both.find("    host_blocks"), "    gpu_bytes: 1MiB\n");
  EXPECT_NE(ErrorOf(both).find("not both"), std::string::npos) << ErrorOf(both);
  std::string none = kMinimal;
  none.erase(none.find("    gpu_blocks: 10\n"), 19);
  EXPECT_NE(ErrorOf(none).find("profiles[0].gpu_bytes: is required"), std::string::npos) << ErrorOf(none);
  std::string tiny = kMinimal;
  tiny.replace(tiny.find("gpu_blocks: 10"), 14, "gpu_bytes: 1KiB");
  EXPECT_NE(ErrorOf(tiny).find("holds no whole block"), std::string::npos) << ErrorOf(tiny);
  const std::string twice = std::string(kMinimal) + R"(  - name: p
    layers: 1
    kv_heads: 1
    head_dim: 8
    gpu_blocks: 1
    host_blocks: 1
)";
  EXPECT_NE(ErrorOf(twice).find("'p' appears twice"), std::string::npos) << ErrorOf(twice);
  std::string bad_name = kMinimal;
  bad_name.replace(bad_name.find("name: p"), 7, "name: a/b");
  EXPECT_NE(ErrorOf(bad_name).find("may hold only"), std::string::npos);
}

TEST(ConfigTest, SyntaxErrorsGiveALine) {
  const std::string e = ErrorOf("profiles: [\n  - {name: p\n");
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}

TEST(ConfigTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("2 GiB"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536u);
  EXPECT_EQ(*ParseByteSize("1GB"), 1000000000u);
  EXPECT_FALSE(ParseByteSize("lots").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
}

}  // namespace
}  // namespace kvtier::daemon
