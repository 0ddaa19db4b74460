// The record format every store keeps, and the checks a fetched record must pass.
#include "kvtier/stores/block_record.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "kvtier/stores/block_store.h"

namespace kvtier::stores {
namespace {

constexpr uint64_t kFingerprint = 0x1234abcd5678ef00ULL;

struct Block {
  Namespace ns = Namespace::Make(kFingerprint, "tenant-a");
  BlockKey parent{7, 9};
  std::vector<TokenId> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::byte> payload;
  BlockKey key;

  Block() {
    payload.resize(1000);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 31 + 7);
    key = ChainKey(parent, ns, tokens);
  }
  std::string Encode() const { return EncodeBlockRecord({kFingerprint, key, parent, ns}, tokens, payload); }
  RecordExpectation Want() const { return {kFingerprint, ns, key, parent, tokens, payload.size()}; }
};

TEST(BlockRecordTest, ARecordRoundTripsAndItsPayloadIsTheBytesWritten) {
  const Block b;
  const std::string rec = b.Encode();
  EXPECT_EQ(rec.size(), BlockRecordBytes(b.tokens.size(), b.payload.size()));
  const RecordCheck check = VerifyBlockRecord(rec, b.Want());
  ASSERT_TRUE(check.ok()) << check.reason;
  ASSERT_EQ(check.payload.size(), b.payload.size());
  EXPECT_TRUE(std::equal(check.payload.begin(), check.payload.end(), b.payload.begin()));
}

TEST(BlockRecordTest, EveryFlippedByteIsCaught) {
  const Block b;
  const std::string rec = b.Encode();
  for (size_t i = 0; i < rec.size(); ++i) {
    std::string bad = rec;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_FALSE(VerifyBlockRecord(bad, b.Want()).ok()) << "byte " << i;
  }
}

TEST(BlockRecordTest, TruncatedAndExtendedRecordsAreCorrupt) {
  const Block b;
  const std::string rec = b.Encode();
  for (size_t n : {size_t{0}, size_t{10}, kRecordHeaderBytes, rec.size() - 1}) {
    const RecordCheck c = VerifyBlockRecord(std::string_view(rec).substr(0, n), b.Want());
    EXPECT_EQ(c.fault, RecordFault::kCorrupt) << n << ": " << c.reason;
  }
  EXPECT_EQ(VerifyBlockRecord(rec + "x", b.Want()).fault, RecordFault::kCorrupt);
}

TEST(BlockRecordTest, AnotherTenantsRecordUnderTheSameKeyIsForeign) {
  // A record another tenant wrote (well formed, its own checksums right) and
  // served under the asked key is turned away: it names another namespace,
  // and its key does not recompute in the asker's.
  const Block mine;
  Block theirs;
  theirs.ns = Namespace::Make(kFingerprint, "tenant-b");
  theirs.key = mine.key;  // Claims the asker's key.
  const RecordCheck c = VerifyBlockRecord(theirs.Encode(), mine.Want());
  EXPECT_EQ(c.fault, RecordFault::kForeign) << c.reason;
  // Relabelled with the asker's namespace as well, the key does not recompute.
  Block relabelled = theirs;
  relabelled.key = ChainKey(theirs.parent, theirs.ns, theirs.tokens);
  relabelled.ns = mine.ns;
  EXPECT_EQ(VerifyBlockRecord(relabelled.Encode(), mine.Want()).fault, RecordFault::kForeign);
}

TEST(BlockRecordTest, OtherProfilesParentsTokensAndSizesAreForeign) {
  const Block b;
  const std::string rec = b.Encode();
  RecordExpectation w = b.Want();
  w.profile_fingerprint ^= 1;
  EXPECT_EQ(VerifyBlockRecord(rec, w).fault, RecordFault::kForeign);
  w = b.Want();
  w.parent = BlockKey{};
  EXPECT_EQ(VerifyBlockRecord(rec, w).fault, RecordFault::kForeign);
  std::vector<TokenId> other = b.tokens;
  other[3] = 99;
  w = b.Want();
  w.tokens = other;
  EXPECT_EQ(VerifyBlockRecord(rec, w).fault, RecordFault::kForeign);
  w = b.Want();
  w.payload_bytes = 999;
  EXPECT_EQ(VerifyBlockRecord(rec, w).fault, RecordFault::kForeign);
}

TEST(BlockRecordTest, StoreKeysNameProfileAndKey) {
  const std::string k = StoreKey("kvtier:", 0xabcULL, BlockKey{1, 2});
  EXPECT_EQ(k,
            "kvtier:0000000000000abc:0000000000000002"
            "0000000000000001");
  EXPECT_NE(StoreKey("", 1, BlockKey{1, 2}), StoreKey("", 2, BlockKey{1, 2}));
}

}  // namespace
}  // namespace kvtier::stores
