// IndexView: the client-side, read-only reader of the shared block index.
// The index is written with the daemon's BlockIndex and read back through a
// second, read-only mapping of the segment, as a client would.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "block_index.h"
#include "kvtier/block_key.h"
#include "kvtier/index_layout.h"
#include "kvtier/shm_segment.h"
#include "support/test_names.h"

namespace kvtier {
namespace {

using tiering::BlockIndex;

constexpr uint32_t kBlockTokens = 4;
constexpr uint64_t kFingerprint = 0x1234abcd;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// A private, page-aligned copy of a segment that tests may corrupt.
std::unique_ptr<std::byte[], FreeDeleter> CopyOf(const ShmSegment& seg) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, seg.size()));
  std::memcpy(p, seg.data(), seg.size());
  return std::unique_ptr<std::byte[], FreeDeleter>(p);
}

class IndexViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto index = BlockIndex::Create("/" + testing::UniqueShmPrefix("index-view"), kBlockTokens, 32, kFingerprint);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    index_ = std::make_unique<BlockIndex>(std::move(index).value());
    auto seg = ShmSegment::MapPassed(index_->share_fd(), /*writable=*/false, sizeof(IndexHeader), "index");
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    mapping_ = std::move(seg).value();
    auto view = IndexView::Attach(mapping_.data(), mapping_.size());
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    view_ = *view;
  }

  // Publishes `key` for (parent, tokens) in record `record`, as the engine does.
  void Put(const BlockKey& key, const BlockKey& parent, const std::vector<TokenId>& tokens, uint32_t record,
           uint32_t ns_tag, Tier tier = Tier::kGpu) {
    index_->WriteRow(record, parent, tokens);
    index_->Insert(key, record, ns_tag, tier);
  }

  std::unique_ptr<BlockIndex> index_;
  ShmSegment mapping_;
  IndexView view_;
  const Namespace ns_ = Namespace::Make(kFingerprint, "tenant");
  const uint32_t tag_ = NamespaceTag(ns_);
};

TEST_F(IndexViewTest, HeaderDescribesTheSegment) {
  const IndexHeader& h = view_.header();
  EXPECT_EQ(h.magic, kIndexMagic);
  EXPECT_EQ(h.abi_version, kShmAbiVersion);
  EXPECT_EQ(h.profile_fingerprint, kFingerprint);
  EXPECT_EQ(h.block_tokens, kBlockTokens);
  EXPECT_EQ(h.max_records, 32u);
  EXPECT_EQ(h.table_slots, 64u);
  EXPECT_EQ(h.segment_bytes, mapping_.size());
  EXPECT_EQ(view_.block_tokens(), kBlockTokens);
  EXPECT_EQ(LoadRelaxed(h.entries), 0u);
  Put(BlockKey{1, 2}, BlockKey{}, {1, 2, 3, 4}, 0, tag_);
  EXPECT_EQ(LoadRelaxed(view_.header().entries), 1u);
}

TEST_F(IndexViewTest, GeometryIsAlignedAndSized) {
  for (uint32_t records : {1u, 31u, 32u, 33u, 1000u}) {
    const IndexGeometry g = IndexGeometry::For(16, records);
    EXPECT_GE(g.table_slots, 2 * records);
    EXPECT_GE(g.table_slots, 64u);
    EXPECT_EQ(g.table_slots & (g.table_slots - 1), 0u);
    EXPECT_EQ(g.tokens_offset() % 64, 0u);
    EXPECT_GE(g.tokens_offset(), g.table_offset() + g.table_slots * sizeof(IndexSlot));
    EXPECT_EQ(g.segment_bytes() % 4096, 0u);
    EXPECT_GE(g.segment_bytes(), g.tokens_offset() + size_t{records} * g.row_words() * sizeof(TokenId));
  }
}

TEST_F(IndexViewTest, FindReturnsVerifiedHitsWithTheirLocation) {
  const std::vector<TokenId> tokens = {10, 11, 12, 13};
  const BlockKey key = ChainKey(BlockKey{}, ns_, tokens);
  Put(key, BlockKey{}, tokens, 7, tag_, Tier::kHost);
  IndexEntry e;
  ASSERT_TRUE(view_.Find(key, BlockKey{}, tag_, tokens, &e));
  EXPECT_EQ(e.record, 7u);
  EXPECT_EQ(e.tier, Tier::kHost);
  EXPECT_FALSE(e.moving);
  EXPECT_TRUE(view_.Find(key, BlockKey{}, tag_, tokens, nullptr));

  ASSERT_TRUE(index_->SetLocation(key, Tier::kGpu, true));
  ASSERT_TRUE(view_.Find(key, BlockKey{}, tag_, tokens, &e));
  EXPECT_EQ(e.tier, Tier::kGpu);
  EXPECT_TRUE(e.moving);

  ASSERT_TRUE(index_->Erase(key));
  EXPECT_FALSE(view_.Find(key, BlockKey{}, tag_, tokens, &e));
  EXPECT_FALSE(index_->SetLocation(key, Tier::kGpu, false));
}

TEST_F(IndexViewTest, ForcedCollisionIsAMissNeverAWrongHit) {
  // One key, stored for (parent P, tokens T) in namespace tag_. A lookup of the same
  // key for anything else (as if its hash collided) must miss.
  const BlockKey key{0xdeadbeef, 0xfeedface};
  const BlockKey parent{5, 6};
  const std::vector<TokenId> tokens = {1, 2, 3, 4};
  Put(key, parent, tokens, 3, tag_);
  IndexEntry e;
  EXPECT_TRUE(view_.Find(key, parent, tag_, tokens, &e));

  const std::vector<TokenId> other_last = {1, 2, 3, 5};
  const std::vector<TokenId> other_first = {0, 2, 3, 4};
  EXPECT_FALSE(view_.Find(key, parent, tag_, other_last, &e));
  EXPECT_FALSE(view_.Find(key, parent, tag_, other_first, &e));
  EXPECT_FALSE(view_.Find(key, BlockKey{}, tag_, tokens, &e)) << "another parent (null)";
  EXPECT_FALSE(view_.Find(key, BlockKey{5, 7}, tag_, tokens, &e)) << "another parent (hi word)";
  EXPECT_FALSE(view_.Find(key, BlockKey{4, 6}, tag_, tokens, &e)) << "another parent (lo word)";
  EXPECT_FALSE(view_.Find(key, parent, tag_ + 1, tokens, &e)) << "another namespace";
  const std::vector<TokenId> short_tokens = {1, 2, 3};
  EXPECT_FALSE(view_.Find(key, parent, tag_, short_tokens, &e)) << "not a whole block";
}

TEST_F(IndexViewTest, CollidingKeyStoredWithOtherTokensIsAMiss) {
  // The real chain key of (null, T1) is published, but its row holds T2 (as when
  // T2 hashed to the same key first): a lookup for T1 must miss.
  const std::vector<TokenId> t1 = {7, 7, 7, 7};
  const std::vector<TokenId> t2 = {8, 8, 8, 8};
  const BlockKey key = ChainKey(BlockKey{}, ns_, t1);
  Put(key, BlockKey{}, t2, 0, tag_);
  EXPECT_FALSE(view_.Find(key, BlockKey{}, tag_, t1, nullptr));
  EXPECT_TRUE(view_.Find(key, BlockKey{}, tag_, t2, nullptr));
  const std::vector<BlockKey> keys = {key};
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, keys, tag_, t1), 0u);
}

TEST_F(IndexViewTest, FindProbesPastOtherKeysInTheSameRun) {
  // Several keys with one home slot: each is found, and an absent one misses.
  const uint32_t home = 9;
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < 5; ++i) {
    keys.push_back(BlockKey{(uint64_t{i + 1} << 32) | home, i});
    Put(keys.back(), BlockKey{}, {i, i, i, i}, i, tag_);
  }
  for (uint32_t i = 0; i < 5; ++i) {
    IndexEntry e;
    ASSERT_TRUE(view_.Find(keys[i], BlockKey{}, tag_, std::vector<TokenId>{i, i, i, i}, &e)) << i;
    EXPECT_EQ(e.record, i);
  }
  EXPECT_FALSE(view_.Find(BlockKey{(uint64_t{99} << 32) | home, 0}, BlockKey{}, tag_, std::vector<TokenId>{0, 0, 0, 0},
                          nullptr));
}

TEST_F(IndexViewTest, LongestPrefix) {
  std::vector<TokenId> tokens(6 * kBlockTokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(1000 + i);
  std::vector<BlockKey> keys(6);
  ASSERT_EQ(ComputeKeys(ns_, BlockKey{}, tokens, kBlockTokens, keys), 6u);
  // Publish blocks 0..3 only; block 2 in the host tier.
  for (uint32_t i = 0; i < 4; ++i) {
    const std::vector<TokenId> block(tokens.begin() + i * kBlockTokens, tokens.begin() + (i + 1) * kBlockTokens);
    Put(keys[i], i == 0 ? BlockKey{} : keys[i - 1], block, i, tag_, i == 2 ? Tier::kHost : Tier::kGpu);
  }
  std::vector<Tier> tiers(6, Tier::kHost);
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, keys, tag_, tokens, tiers), 4u);
  EXPECT_EQ(tiers[0], Tier::kGpu);
  EXPECT_EQ(tiers[1], Tier::kGpu);
  EXPECT_EQ(tiers[2], Tier::kHost);
  EXPECT_EQ(tiers[3], Tier::kGpu);
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, keys, tag_, tokens), 4u) << "tiers are optional";

  // Fewer tokens than keys: stops where the tokens end.
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, keys, tag_, std::span<const TokenId>(tokens).first(2 * kBlockTokens + 1)),
            2u);
  // A token changed in block 1: only block 0 is verified.
  auto changed = tokens;
  changed[kBlockTokens + 2] += 1;
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, keys, tag_, changed), 1u);
  // Another namespace sees nothing; another parent for block 0 neither.
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, keys, tag_ ^ 1, tokens), 0u);
  EXPECT_EQ(view_.LongestPrefix(BlockKey{1, 1}, keys, tag_, tokens), 0u);
  // A suffix chained from a cached block's key.
  const std::span<const BlockKey> tail = std::span<const BlockKey>(keys).subspan(2);
  EXPECT_EQ(view_.LongestPrefix(keys[1], tail, tag_, std::span<const TokenId>(tokens).subspan(2 * kBlockTokens)), 2u);
  // Empty input.
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, {}, tag_, {}), 0u);
}

// Found by kvtier-fuzz-index (tests/fuzz/corpus/index/found_bad_tier): a slot
// whose tier byte names no tier was reported as a hit in that "tier". A corrupt
// slot (bad tier, record index outside the segment) is a miss, and the record's
// row is not read.
TEST_F(IndexViewTest, CorruptSlotIsAMissNeverAHit) {
  const std::vector<TokenId> tokens = {21, 22, 23, 24};
  const BlockKey key = ChainKey(BlockKey{}, ns_, tokens);
  Put(key, BlockKey{}, tokens, 5, tag_, Tier::kHost);
  auto copy = CopyOf(mapping_);
  auto view = IndexView::Attach(copy.get(), mapping_.size());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_TRUE(view->Find(key, BlockKey{}, tag_, tokens, nullptr));
  auto* table = reinterpret_cast<IndexSlot*>(copy.get() + view->header().table_offset);
  IndexSlot& slot = table[HomeSlot(key, view->header().table_slots)];
  ASSERT_EQ(slot.record, 5u);

  for (uint8_t bad_tier : {uint8_t{2}, uint8_t{7}, uint8_t{255}}) {
    slot.tier = bad_tier;
    IndexEntry e;
    EXPECT_FALSE(view->Find(key, BlockKey{}, tag_, tokens, &e)) << "tier " << int{bad_tier};
    std::vector<Tier> tiers(1);
    EXPECT_EQ(view->LongestPrefix(BlockKey{}, std::span<const BlockKey>(&key, 1), tag_, tokens, tiers), 0u);
  }
  slot.tier = static_cast<uint8_t>(Tier::kHost);
  ASSERT_TRUE(view->Find(key, BlockKey{}, tag_, tokens, nullptr));

  // max_records is 32: records 32 and up lie outside the rows.
  for (uint32_t bad_record : {32u, 33u, 0x7fffffffu, 0xfffffffeu}) {
    slot.record = bad_record;
    EXPECT_FALSE(view->Find(key, BlockKey{}, tag_, tokens, nullptr)) << "record " << bad_record;
  }
}

// --- Attach validation ---------------------------------------------------------

class AttachTest : public IndexViewTest {
 protected:
  Status AttachCorrupted(void (*corrupt)(IndexHeader&), size_t bytes = 0) {
    auto copy = CopyOf(mapping_);
    corrupt(*reinterpret_cast<IndexHeader*>(copy.get()));
    auto v = IndexView::Attach(copy.get(), bytes == 0 ? mapping_.size() : bytes);
    return v.ok() ? Status::Ok() : v.status();
  }
};

TEST_F(AttachTest, AcceptsAnUntouchedCopy) {
  EXPECT_TRUE(AttachCorrupted([](IndexHeader&) {}).ok());
}

TEST_F(AttachTest, RejectsTooSmallRegions) {
  EXPECT_EQ(IndexView::Attach(mapping_.data(), kIndexHeaderBytes - 1).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(IndexView::Attach(mapping_.data(), mapping_.size() - 1).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(IndexView::Attach(mapping_.data(), kIndexHeaderBytes).status().code(), StatusCode::kCorrupt);
}

TEST_F(AttachTest, RejectsBadMagic) {
  const Status st = AttachCorrupted([](IndexHeader& h) { h.magic ^= 1; });
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("magic"), std::string::npos);
}

TEST_F(AttachTest, RejectsOtherAbiVersion) {
  const Status st = AttachCorrupted([](IndexHeader& h) { h.abi_version = kShmAbiVersion + 1; });
  EXPECT_EQ(st.code(), StatusCode::kVersionMismatch);
}

TEST_F(AttachTest, RejectsBadGeometry) {
  using Corruptor = void (*)(IndexHeader&);
  const Corruptor cases[] = {
      [](IndexHeader& h) { h.block_tokens = 0; },
      [](IndexHeader& h) { h.block_tokens = 1025; },
      [](IndexHeader& h) { h.block_tokens = 1024; },  // Rows no longer fit the mapping.
      [](IndexHeader& h) { h.table_slots = 0; },
      [](IndexHeader& h) { h.table_slots = 96; },   // Not a power of two.
      [](IndexHeader& h) { h.table_slots = 128; },  // A power of two, but not this geometry's.
      [](IndexHeader& h) { h.max_records = 64; },   // Needs a bigger table.
      [](IndexHeader& h) { h.max_records = 0xffffffffu; },
      [](IndexHeader& h) { h.table_offset += 64; },
      [](IndexHeader& h) { h.tokens_offset -= 64; },
      [](IndexHeader& h) { h.segment_bytes += 4096; },  // Claims more than is mapped.
  };
  int i = 0;
  for (Corruptor c : cases) {
    EXPECT_EQ(AttachCorrupted(c).code(), StatusCode::kCorrupt) << "case " << i;
    ++i;
  }
}

}  // namespace
}  // namespace kvtier
