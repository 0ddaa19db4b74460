// The record format every store keeps, and the checks a fetched record must pass.
#include "kvtier/stores/block_record.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
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
  std::string Encode(const RecordKey& k, bool sign = true) const {
    return EncodeBlockRecord({kFingerprint, key, parent, ns}, tokens, payload, k, sign);
  }
  RecordExpectation Want() const { return {kFingerprint, ns, key, parent, tokens, payload.size()}; }
  RecordExpectation Want(const RecordKey& k) const {
    RecordExpectation w = Want();
    w.record_key = &k;
    return w;
  }
};

RecordKey KeyOf(char fill) { return RecordKey::FromSecret(std::string(32, fill)).value(); }

// Overwrites a signed record's key id (what a forger copies from the victim's records).
void SetKeyId(std::string& rec, uint64_t id) {
  std::memcpy(rec.data() + rec.size() - kRecordTrailerBytes, &id, sizeof id);
}

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

// --- Signed records (stores.record_key_file) ---

TEST(BlockRecordTest, ASignedRecordRoundTripsUnderItsKey) {
  const Block b;
  const RecordKey key = KeyOf('k');
  const std::string rec = b.Encode(key);
  EXPECT_EQ(rec.size(), BlockRecordBytes(b.tokens.size(), b.payload.size(), /*signed_record=*/true));
  const RecordCheck check = VerifyBlockRecord(rec, b.Want(key));
  ASSERT_TRUE(check.ok()) << check.reason;
  ASSERT_EQ(check.payload.size(), b.payload.size());
  EXPECT_TRUE(std::equal(check.payload.begin(), check.payload.end(), b.payload.begin()));
  // Signed later (as the store chain's I/O thread does), it is the same record.
  std::string later = b.Encode(key, /*sign=*/false);
  EXPECT_NE(later, rec);
  ASSERT_TRUE(SignBlockRecord(key, &later));
  EXPECT_EQ(later, rec);
  // A reader without a key reads it as it reads unsigned ones.
  EXPECT_TRUE(VerifyBlockRecord(rec, b.Want()).ok());
}

TEST(BlockRecordTest, ARecordForgedWithoutTheKeyIsRefusedAsForged) {
  // The forger knows everything in the victim's records (namespace, key,
  // parent, tokens, key id) and writes its own payload in a well-formed
  // record, both checksums right: only the MAC is out of its reach.
  const RecordKey key = KeyOf('k');
  Block forged;
  for (auto& byte : forged.payload) byte = std::byte{0x66};
  // Signed under a key of its own, relabelled with the victim's key id.
  std::string rec = forged.Encode(KeyOf('f'));
  SetKeyId(rec, key.id());
  RecordCheck c = VerifyBlockRecord(rec, forged.Want(key));
  EXPECT_EQ(c.fault, RecordFault::kForged) << c.reason;
  EXPECT_TRUE(c.payload.empty());
  // No MAC at all (left zero).
  rec = forged.Encode(KeyOf('f'), /*sign=*/false);
  SetKeyId(rec, key.id());
  EXPECT_EQ(VerifyBlockRecord(rec, forged.Want(key)).fault, RecordFault::kForged);
  // An unsigned (version 1) record.
  c = VerifyBlockRecord(forged.Encode(), forged.Want(key));
  EXPECT_EQ(c.fault, RecordFault::kForged) << c.reason;
}

TEST(BlockRecordTest, ARecordSignedUnderAnotherKeyIsRefused) {
  const Block b;
  const RecordKey ours = KeyOf('k'), theirs = KeyOf('t');
  EXPECT_NE(ours.id(), theirs.id());
  const RecordCheck c = VerifyBlockRecord(b.Encode(theirs), b.Want(ours));
  EXPECT_EQ(c.fault, RecordFault::kForeign) << "another deployment's key, told by its key id: " << c.reason;
  EXPECT_NE(c.reason.find(theirs.IdHex()), std::string::npos) << c.reason;
}

TEST(BlockRecordTest, AnUnsignedRecordIsReadWithoutAKeyAndRefusedWithOne) {
  // Version 1: what kvtierd wrote before records were signed, and writes without a key.
  const Block b;
  const std::string v1 = b.Encode();
  uint32_t version = 0;
  std::memcpy(&version, v1.data() + 8, sizeof version);
  EXPECT_EQ(version, kUnsignedRecordVersion);
  EXPECT_TRUE(VerifyBlockRecord(v1, b.Want()).ok()) << "an upgrade without a key loses nothing";
  const RecordKey key = KeyOf('k');
  EXPECT_EQ(VerifyBlockRecord(v1, b.Want(key)).fault, RecordFault::kForged);
}

TEST(BlockRecordTest, EveryFlippedByteOfASignedRecordIsRefused) {
  // Header, tokens, payload, key id or MAC: each byte changed is caught; what
  // the checksums cannot tell from damage in the MAC is forged.
  const Block b;
  const RecordKey key = KeyOf('k');
  const std::string rec = b.Encode(key);
  for (size_t i = 0; i < rec.size(); ++i) {
    std::string bad = rec;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    const RecordCheck c = VerifyBlockRecord(bad, b.Want(key));
    EXPECT_FALSE(c.ok()) << "byte " << i;
    if (i >= rec.size() - kRecordMacBytes) {
      EXPECT_EQ(c.fault, RecordFault::kForged) << "MAC byte " << i;
    }
  }
}

TEST(BlockRecordTest, AKeyIsAtLeast32Bytes) {
  EXPECT_FALSE(RecordKey::FromSecret(std::string(31, 'x')).ok());
  EXPECT_FALSE(RecordKey::FromSecret("").ok());
  EXPECT_TRUE(RecordKey::FromSecret(std::string(32, 'x')).ok());
  EXPECT_EQ(KeyOf('a').id(), KeyOf('a').id());
  EXPECT_EQ(KeyOf('a').IdHex().size(), 16u);
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
