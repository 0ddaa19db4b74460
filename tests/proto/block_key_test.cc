// Block keys, namespaces and model profiles.
#include "kvtier/block_key.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvtier/model_identity.h"
#include "kvtier/model_profile.h"
#include "kvtier/status.h"

namespace kvtier {
namespace {

constexpr uint32_t kBlockTokens = 4;

std::vector<TokenId> Iota(size_t n, TokenId first = 1) {
  std::vector<TokenId> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<TokenId>(i);
  return v;
}

std::vector<BlockKey> Keys(const Namespace& ns, const std::vector<TokenId>& tokens, BlockKey parent = {}) {
  std::vector<BlockKey> keys(tokens.size() / kBlockTokens);
  EXPECT_EQ(ComputeKeys(ns, parent, tokens, kBlockTokens, keys), keys.size());
  return keys;
}

ModelProfile SmallProfile() { return ModelProfile{"small", 2, 3, 4, DType::kF16, 5}; }

const Namespace kNs = Namespace::Make(SmallProfile().Fingerprint(), "tenant-a");

TEST(BlockKeyTest, ChainMatchesChainKeyStepByStep) {
  const auto tokens = Iota(5 * kBlockTokens);
  const auto keys = Keys(kNs, tokens);
  ASSERT_EQ(keys.size(), 5u);
  BlockKey prev;
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey k = ChainKey(prev, kNs, std::span<const TokenId>(tokens).subspan(i * kBlockTokens, kBlockTokens));
    EXPECT_EQ(keys[i], k) << "block " << i;
    EXPECT_FALSE(k.IsNull());
    prev = k;
  }
}

TEST(BlockKeyTest, KeyOfBlockDependsOnEveryEarlierToken) {
  const auto base = Iota(4 * kBlockTokens);
  const auto base_keys = Keys(kNs, base);
  for (size_t t = 0; t < base.size(); ++t) {
    auto changed = base;
    changed[t] ^= 0x80000000u;
    const auto keys = Keys(kNs, changed);
    const size_t block = t / kBlockTokens;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i < block) {
        EXPECT_EQ(keys[i], base_keys[i]) << "token " << t << " must not change earlier block " << i;
      } else {
        EXPECT_NE(keys[i], base_keys[i]) << "token " << t << " must change block " << i;
      }
    }
  }
}

TEST(BlockKeyTest, SameBlockUnderAnotherPrefixGetsAnotherKey) {
  // Block 1 has the same tokens in both sequences, block 0 differs.
  std::vector<TokenId> a = {1, 2, 3, 4, 9, 9, 9, 9};
  std::vector<TokenId> b = {5, 6, 7, 8, 9, 9, 9, 9};
  EXPECT_NE(Keys(kNs, a)[1], Keys(kNs, b)[1]);
}

TEST(BlockKeyTest, NamespacesSeparateTenantsAndProfiles) {
  const auto tokens = Iota(3 * kBlockTokens);
  ModelProfile other_profile = SmallProfile();
  other_profile.layers = 3;
  const Namespace tenant_b = Namespace::Make(SmallProfile().Fingerprint(), "tenant-b");
  const Namespace profile_b = Namespace::Make(other_profile.Fingerprint(), "tenant-a");
  const Namespace again = Namespace::Make(SmallProfile().Fingerprint(), "tenant-a");
  EXPECT_EQ(again, kNs);
  EXPECT_NE(tenant_b, kNs);
  EXPECT_NE(profile_b, kNs);
  EXPECT_NE(Namespace::Make(SmallProfile().Fingerprint(), ""), kNs);

  const auto keys = Keys(kNs, tokens);
  const auto keys_tenant = Keys(tenant_b, tokens);
  const auto keys_profile = Keys(profile_b, tokens);
  EXPECT_EQ(Keys(again, tokens), keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_NE(keys[i], keys_tenant[i]);
    EXPECT_NE(keys[i], keys_profile[i]);
    EXPECT_NE(keys_tenant[i], keys_profile[i]);
  }
}

TEST(BlockKeyTest, PartialTailBlockIsNotKeyed) {
  const auto tokens = Iota(3 * kBlockTokens + kBlockTokens - 1);
  std::vector<BlockKey> out(10);
  EXPECT_EQ(ComputeKeys(kNs, BlockKey{}, tokens, kBlockTokens, out), 3u);
  for (size_t i = 3; i < out.size(); ++i) EXPECT_TRUE(out[i].IsNull()) << "slot " << i << " must stay untouched";
  // Fewer tokens than one block: nothing.
  EXPECT_EQ(ComputeKeys(kNs, BlockKey{}, std::span<const TokenId>(tokens).first(kBlockTokens - 1), kBlockTokens, out),
            0u);
  // Appending a partial block never changes the keys of the full ones.
  const auto full = Keys(kNs, std::vector<TokenId>(tokens.begin(), tokens.begin() + 3 * kBlockTokens));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], full[i]);
}

TEST(BlockKeyTest, OutputSpanLimitsTheCount) {
  const auto tokens = Iota(6 * kBlockTokens);
  const auto all = Keys(kNs, tokens);
  std::vector<BlockKey> out(2);
  EXPECT_EQ(ComputeKeys(kNs, BlockKey{}, tokens, kBlockTokens, out), 2u);
  EXPECT_EQ(out[0], all[0]);
  EXPECT_EQ(out[1], all[1]);
  EXPECT_EQ(ComputeKeys(kNs, BlockKey{}, tokens, kBlockTokens, std::span<BlockKey>()), 0u);
}

TEST(BlockKeyTest, ZeroBlockTokensYieldsNoKeys) {
  const auto tokens = Iota(8);
  std::vector<BlockKey> out(4);
  EXPECT_EQ(ComputeKeys(kNs, BlockKey{}, tokens, 0, out), 0u);
}

TEST(BlockKeyTest, KeysFromAParentEqualTheSuffixOfTheFullChain) {
  const auto tokens = Iota(7 * kBlockTokens, 100);
  const auto full = Keys(kNs, tokens);
  for (size_t split = 1; split < full.size(); ++split) {
    const std::vector<TokenId> suffix(tokens.begin() + static_cast<std::ptrdiff_t>(split * kBlockTokens), tokens.end());
    const auto tail = Keys(kNs, suffix, full[split - 1]);
    ASSERT_EQ(tail.size(), full.size() - split);
    for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], full[split + i]) << "split " << split << " block " << i;
  }
}

TEST(BlockKeyTest, KeysAreDistinctAcrossManyPrefixes) {
  std::unordered_set<BlockKey, BlockKeyHash> seen;
  for (TokenId first = 0; first < 200; ++first) {
    for (const BlockKey& k : Keys(kNs, Iota(8 * kBlockTokens, first * 1000))) {
      EXPECT_TRUE(seen.insert(k).second) << k.ToHex();
    }
  }
  EXPECT_EQ(seen.size(), 200u * 8u);
}

TEST(BlockKeyTest, ToHexPrintsHighWordFirst) {
  EXPECT_EQ(BlockKey{}.ToHex(), std::string(32, '0'));
  EXPECT_EQ((BlockKey{0x0123456789abcdefULL, 0xfedcba9876543210ULL}.ToHex()), "fedcba98765432100123456789abcdef");
  EXPECT_EQ((BlockKey{1, 0}.ToHex()), "00000000000000000000000000000001");
  EXPECT_EQ((BlockKey{0, 1}.ToHex()), "00000000000000010000000000000000");
  EXPECT_EQ((BlockKey{~0ULL, ~0ULL}.ToHex()), std::string(32, 'f'));
}

TEST(BlockKeyTest, NullKeyAndEquality) {
  EXPECT_TRUE(BlockKey{}.IsNull());
  EXPECT_FALSE((BlockKey{0, 1}.IsNull()));
  EXPECT_FALSE((BlockKey{1, 0}.IsNull()));
  EXPECT_EQ((BlockKey{3, 4}), (BlockKey{3, 4}));
  EXPECT_NE((BlockKey{3, 4}), (BlockKey{4, 3}));
}

// --- ModelProfile -----------------------------------------------------------

TEST(ModelProfileTest, ByteLayout) {
  const ModelProfile p = SmallProfile();  // 2 layers, 3 heads, dim 4, fp16, 5 tokens.
  EXPECT_EQ(p.PlaneBytes(), 5u * 3u * 4u * 2u);
  EXPECT_EQ(p.BlockBytes(), 2u * 2u * 120u);
  EXPECT_EQ(p.PlaneOffset(0, 0), 0u);
  EXPECT_EQ(p.PlaneOffset(0, 1), 120u);
  EXPECT_EQ(p.PlaneOffset(1, 0), 240u);
  EXPECT_EQ(p.PlaneOffset(1, 1), 360u);
  EXPECT_EQ(p.PlaneOffset(1, 1) + p.PlaneBytes(), p.BlockBytes());

  ModelProfile f32 = p;
  f32.dtype = DType::kF32;
  EXPECT_EQ(f32.BlockBytes(), 2 * p.BlockBytes());
  ModelProfile llama{"llama-8b", 32, 8, 128, DType::kBF16, 16};
  EXPECT_EQ(llama.BlockBytes(), size_t{2} << 20);
  EXPECT_TRUE(llama.Validate().ok());
  EXPECT_NE(llama.Describe().find("llama-8b"), std::string::npos);
  EXPECT_NE(llama.Describe().find("bf16"), std::string::npos);
}

TEST(ModelProfileTest, FingerprintCoversGeometryButNotName) {
  const ModelProfile p = SmallProfile();
  ModelProfile renamed = p;
  renamed.name = "another label";
  EXPECT_EQ(renamed.Fingerprint(), p.Fingerprint());
  std::set<uint64_t> prints = {p.Fingerprint()};
  for (int field = 0; field < 5; ++field) {
    ModelProfile q = p;
    switch (field) {
      case 0:
        q.layers += 1;
        break;
      case 1:
        q.kv_heads += 1;
        break;
      case 2:
        q.head_dim += 1;
        break;
      case 3:
        q.dtype = DType::kBF16;
        break;
      case 4:
        q.block_tokens += 1;
        break;
    }
    EXPECT_TRUE(prints.insert(q.Fingerprint()).second) << "field " << field;
  }
}

TEST(ModelProfileTest, ValidateRejectsEachBadField) {
  EXPECT_TRUE(SmallProfile().Validate().ok());
  struct Case {
    const char* what;
    void (*mutate)(ModelProfile&);
  };
  const Case cases[] = {
      {"layers", [](ModelProfile& p) { p.layers = 0; }},
      {"layers", [](ModelProfile& p) { p.layers = 4097; }},
      {"kv_heads", [](ModelProfile& p) { p.kv_heads = 0; }},
      {"kv_heads", [](ModelProfile& p) { p.kv_heads = 5000; }},
      {"head_dim", [](ModelProfile& p) { p.head_dim = 0; }},
      {"head_dim", [](ModelProfile& p) { p.head_dim = 4097; }},
      {"dtype", [](ModelProfile& p) { p.dtype = static_cast<DType>(9); }},
      {"block_tokens", [](ModelProfile& p) { p.block_tokens = 0; }},
      {"block_tokens", [](ModelProfile& p) { p.block_tokens = kMaxBlockTokens + 1; }},
      {"block size",
       [](ModelProfile& p) {
         p.layers = 64;  // 64 layers x 2 planes x 5 tokens x 1024 x 1024 x 2 bytes > 1 GiB.
         p.kv_heads = 1024;
         p.head_dim = 1024;
       }},
  };
  for (const Case& c : cases) {
    ModelProfile p = SmallProfile();
    c.mutate(p);
    const Status st = p.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.what), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("small"), std::string::npos) << "names the profile: " << st.ToString();
  }
  ModelProfile edge = SmallProfile();
  edge.block_tokens = kMaxBlockTokens;
  EXPECT_TRUE(edge.Validate().ok());
}

TEST(ModelProfileTest, DTypes) {
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  for (DType d : {DType::kF16, DType::kBF16, DType::kF32}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  const std::pair<const char*, DType> aliases[] = {{"float16", DType::kF16},
                                                   {"half", DType::kF16},
                                                   {"bfloat16", DType::kBF16},
                                                   {"float32", DType::kF32},
                                                   {"float", DType::kF32}};
  for (const auto& [name, d] : aliases) {
    auto parsed = ParseDType(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, d) << name;
  }
  for (const char* bad : {"", "fp8", "FP16", "int8", "fp16 "}) {
    auto parsed = ParseDType(bad);
    EXPECT_FALSE(parsed.ok()) << "'" << bad << "'";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_NE(ParseDType("fp8").status().message().find("fp8"), std::string::npos);
}

// --- Status -------------------------------------------------------------------

TEST(StatusTest, CodesAndStrings) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "ok");
  const Status st = ResourceExhausted("gpu tier full");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.ToString(), "resource_exhausted: gpu tier full");
  EXPECT_EQ(Status(StatusCode::kTimeout, "").ToString(), "timeout");
  EXPECT_EQ(StatusCodeName(StatusCode::kVersionMismatch), "version_mismatch");
  EXPECT_EQ(StatusCodeName(StatusCode::kInternal), "internal");
  // Wire values are stable.
  EXPECT_EQ(static_cast<int>(StatusCode::kInvalidArgument), 1);
  EXPECT_EQ(static_cast<int>(StatusCode::kTimeout), 10);
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), 12);
}

TEST(StatusTest, ResultCarriesValueOrStatus) {
  Result<int> good = 7;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  Result<int> bad = NotFound("nope");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  auto f = [](bool fail) -> Status {
    KVTIER_RETURN_IF_ERROR(fail ? Corrupt("x") : Status::Ok());
    return InvalidArgument("reached the end");
  };
  EXPECT_EQ(f(true).code(), StatusCode::kCorrupt);
  EXPECT_EQ(f(false).code(), StatusCode::kInvalidArgument);
}

// A model identity salts the key namespace: equal tokens under two models (or
// a model and none) never share a key; the tenant's own namespace is kept
// when no identity is given.
TEST(BlockKeyTest, ModelIdentitiesSeparateKeys) {
  const Namespace tenant = Namespace::Make(7, "t");
  const ModelId a{BlockKey{1, 2}}, b{BlockKey{1, 3}};
  EXPECT_EQ(KeyNamespace(tenant, ModelId{}), tenant);
  EXPECT_NE(KeyNamespace(tenant, a), tenant);
  EXPECT_NE(KeyNamespace(tenant, a), KeyNamespace(tenant, b));
  EXPECT_EQ(KeyNamespace(tenant, a), KeyNamespace(tenant, a));
  EXPECT_NE(KeyNamespace(Namespace::Make(7, "u"), a), KeyNamespace(tenant, a));
  const std::vector<TokenId> tokens(16, 5);
  EXPECT_NE(ChainKey({}, KeyNamespace(tenant, a), tokens), ChainKey({}, KeyNamespace(tenant, b), tokens));
}

TEST(BlockKeyTest, ModelIdHexRoundTripsAndRejectsAnythingElse) {
  const ModelId id{BlockKey{0x0123456789abcdefULL, 0xfedcba9876543210ULL}};
  EXPECT_EQ(id.ToHex(), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(ModelId::FromHex(id.ToHex()), id);
  EXPECT_EQ(ModelId::FromHex("FEDCBA98765432100123456789ABCDEF"), id);
  EXPECT_EQ(ModelId{}.ToHex(), "");
  for (const char* bad : {"", "fedcba9876543210", "fedcba98765432100123456789abcdeg",
                          "fedcba98765432100123456789abcdef0", " edcba98765432100123456789abcdef"}) {
    EXPECT_FALSE(ModelId::FromHex(bad).has_value()) << bad;
  }
}

// The identity is a function of names, dtypes, shapes, bytes and tokenizer:
// change any of them and it changes; tensors must come in name order.
TEST(ModelIdentityTest, DependsOnEveryPartAndWantsNameOrder) {
  const std::vector<float> w1 = {1, 2, 3, 4}, w2 = {1, 2, 3, 5};
  const std::vector<int64_t> shape = {2, 2}, flat = {4};
  auto bytes = [](const std::vector<float>& v) { return std::as_bytes(std::span<const float>(v)); };
  auto id = [&](const std::string& name, const std::string& dtype, const std::vector<int64_t>& s,
                const std::vector<float>& w, const std::string& tokenizer, const std::string& config = "cfg") {
    ModelIdentity m;
    EXPECT_TRUE(m.AddTensor("a.weight", "F32", shape, bytes(w1)).ok());
    EXPECT_TRUE(m.AddTensor(name, dtype, s, bytes(w)).ok());
    EXPECT_TRUE(m.AddConfig(config).ok());
    EXPECT_TRUE(m.AddTokenizer(tokenizer).ok());
    auto r = m.Finish();
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : ModelId{};
  };
  const ModelId base = id("b.weight", "F32", shape, w1, "tok");
  EXPECT_FALSE(base.IsNull());
  EXPECT_EQ(id("b.weight", "F32", shape, w1, "tok"), base) << "deterministic";
  EXPECT_NE(id("c.weight", "F32", shape, w1, "tok"), base);
  EXPECT_NE(id("b.weight", "BF16", shape, w1, "tok"), base);
  EXPECT_NE(id("b.weight", "F32", flat, w1, "tok"), base);
  EXPECT_NE(id("b.weight", "F32", shape, w2, "tok"), base);
  EXPECT_NE(id("b.weight", "F32", shape, w1, "tok2"), base);
  EXPECT_NE(id("b.weight", "F32", shape, w1, "tok", "cfg2"), base);

  ModelIdentity unordered;
  ASSERT_TRUE(unordered.AddTensor("b", "F32", flat, bytes(w1)).ok());
  EXPECT_EQ(unordered.AddTensor("a", "F32", flat, bytes(w1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unordered.AddTensor("b", "F32", flat, bytes(w1)).code(), StatusCode::kInvalidArgument) << "twice";
  EXPECT_EQ(unordered.Finish().status().code(), StatusCode::kFailedPrecondition) << "no tokenizer yet";
  EXPECT_EQ(unordered.AddTokenizer("tok").code(), StatusCode::kFailedPrecondition) << "the config comes first";
  ASSERT_TRUE(unordered.AddConfig("cfg").ok());
  ASSERT_TRUE(unordered.AddTokenizer("tok").ok());
  EXPECT_EQ(unordered.AddTensor("c", "F32", flat, bytes(w1)).code(), StatusCode::kInvalidArgument) << "after it";
}

}  // namespace
}  // namespace kvtier
