// BlockRecord: the bytes a store keeps for one block, and the checks a record
// must pass before anything uses it.
//
// Format (little-endian; version 2, signed; version 1 is the same without the trailer):
//   offset  size  field
//        0     8  magic "KVTBLK01"
//        8     4  format version (2 signed, 1 unsigned)
//       12     4  token count n (the profile's block_tokens)
//       16     8  profile fingerprint (the KV geometry: layers, heads, dtype, block size)
//       24    16  key (lo, hi)
//       40    16  parent key (lo, hi; null for block 0)
//       56    16  key namespace (KeyNamespace(tenant, model): whose block it is)
//       72     8  payload bytes
//       80     8  XXH3-64 of the payload
//       88     8  XXH3-64 of bytes 0..87 and the token ids
//       96   4*n  token ids (uint32)
//   96+4*n     p  payload (the block's bytes as its pool slot holds them)
//   version 2 only, at t = 96+4*n+p:
//        t     8  key id (RecordKey::id(): which secret signed it)
//      t+8    32  HMAC-SHA-256 under the record key of bytes 0..t+7 (all of the above)
//
// VerifyBlockRecord checks the namespace against the asker's and recomputes the
// key in it, so a record of another tenant, model or profile fails as surely
// as a corrupt one. The checksums catch damage, not forgery: the MAC catches
// forgery. With a record key (stores.record_key_file) only a version-2 record
// whose MAC verifies under it is served, so a writer to the store without the
// key cannot make one; without a key, records of both versions are read
// (their MAC unchecked: a store is then trusted as far as those who can write
// to it are) and version 1 is written, which older builds read too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::stores {

inline constexpr uint64_t kRecordMagic = 0x31304b4c4254564bULL;  // "KVTBLK01"
inline constexpr uint32_t kRecordVersion = 2;          // Signed: the newest this build writes.
inline constexpr uint32_t kUnsignedRecordVersion = 1;  // What it writes without a key; still read without one.
inline constexpr size_t kRecordHeaderBytes = 96;
inline constexpr size_t kRecordMacBytes = 32;
inline constexpr size_t kRecordTrailerBytes = 8 + kRecordMacBytes;  // Version 2's key id and MAC.

// The secret records are signed with: HMAC-SHA-256 (OpenSSL) under the bytes
// of stores.record_key_file. Copies share one secret, wiped when the last goes.
// Thread-safe: Mac may be called from several threads at once.
class RecordKey {
 public:
  static constexpr size_t kMinBytes = 32;
  static constexpr size_t kMaxBytes = 4096;
  // The key of `secret` (every byte of it); kInvalidArgument when it is
  // shorter than kMinBytes or longer than kMaxBytes.
  static Result<RecordKey> FromSecret(std::string_view secret);

  // The first 8 bytes of SHA-256("kvtier record key id" || secret): names the
  // key in records and logs without telling anything of the secret.
  uint64_t id() const { return id_; }
  std::string IdHex() const;
  // HMAC-SHA-256 of `bytes` into out[0..31].
  void Mac(std::string_view bytes, unsigned char* out) const;

 private:
  struct Secret;
  std::shared_ptr<const Secret> secret_;
  uint64_t id_ = 0;
};

// What a record says about its block.
struct BlockRecordHeader {
  uint64_t profile_fingerprint = 0;
  BlockKey key;
  BlockKey parent;
  Namespace key_ns;
};

// The unsigned (version 1) record of one block: header, tokens and the payload bytes.
std::string EncodeBlockRecord(const BlockRecordHeader& header, std::span<const TokenId> tokens,
                              std::span<const std::byte> payload);
// The signed (version 2) record of one block under `key`. With !sign_now its
// MAC is left zero for SignBlockRecord to fill (the store chain encodes on the
// engine thread and signs, hundreds of microseconds a block, on its I/O thread).
std::string EncodeBlockRecord(const BlockRecordHeader& header, std::span<const TokenId> tokens,
                              std::span<const std::byte> payload, const RecordKey& key, bool sign_now = true);
// Writes the MAC of a version-2 record EncodeBlockRecord made under `key`.
// False (nothing written) for a record too short or of another version.
bool SignBlockRecord(const RecordKey& key, std::string* record);

// The bytes a record of `tokens` tokens and `payload_bytes` payload takes
// (`signed_record`: version 2, with its key id and MAC).
constexpr size_t BlockRecordBytes(size_t tokens, size_t payload_bytes, bool signed_record = false) {
  return kRecordHeaderBytes + tokens * sizeof(TokenId) + payload_bytes + (signed_record ? kRecordTrailerBytes : 0);
}

// The header and token ids of a record EncodeBlockRecord made (what a store
// was given to keep), read without any check beyond its length: never use it
// on bytes a store returned (VerifyBlockRecord is for those). False when the
// record is too short for its header and tokens.
bool ReadOwnBlockRecord(std::string_view record, BlockRecordHeader* header, std::vector<TokenId>* tokens);

// What the asker knows of the block it wants.
struct RecordExpectation {
  uint64_t profile_fingerprint = 0;
  Namespace key_ns;  // The asking tenant's key namespace (KeyNamespace(tenant, model)).
  BlockKey key;
  BlockKey parent;
  std::span<const TokenId> tokens;
  size_t payload_bytes = 0;
  // The key records must be signed with (stores.record_key_file); nullptr:
  // none is configured, and records of either version are read unchecked by MAC.
  const RecordKey* record_key = nullptr;
};

// Why a record was turned away: it is damaged (a short value, a bad magic or
// checksum), it is another block's (another profile, tenant, model, prefix
// or tokens, or signed under another key), or it is forged (a key is
// configured and the record is unsigned or its MAC does not verify). All are
// misses; they are counted apart.
enum class RecordFault : uint8_t { kNone, kCorrupt, kForeign, kForged };

struct RecordCheck {
  RecordFault fault = RecordFault::kNone;
  std::string reason;                  // Empty when fault is kNone.
  std::span<const std::byte> payload;  // Into the record's bytes; valid while they are.
  bool ok() const { return fault == RecordFault::kNone; }
};

// Checks `record` against `want`: format, both checksums, the fingerprint, the
// namespace, the key and parent, the tokens, the payload's size, and that the key recomputes
// from parent + want.key_ns + tokens (so it was chained in the asker's
// namespace); with want.record_key, that it is signed (version 2) under that
// key (its key id, then its MAC, compared in constant time). Only a record
// that passes every check has a payload.
RecordCheck VerifyBlockRecord(std::string_view record, const RecordExpectation& want);

}  // namespace kvtier::stores
