// BlockRecord: the bytes a store keeps for one block, and the checks a record
// must pass before anything uses it.
//
// Format (little-endian; version 1):
//   offset  size  field
//        0     8  magic "KVTBLK01"
//        8     4  format version (1)
//       12     4  token count n (the profile's block_tokens)
//       16     8  profile fingerprint (the KV geometry: layers, heads, dtype, block size)
//       24    16  key (lo, hi)
//       40    16  parent key (lo, hi; null for block 0)
//       56    16  key namespace (KeyNamespace(tenant, model): whose block it is)
//       72     8  payload bytes
//       80     8  XXH3-64 of the payload
//       88     8  XXH3-64 of bytes 0..87 and the token ids
//       96   4*n  token ids (uint32)
//   96+4*n     .  payload (the block's bytes as its pool slot holds them)
//
// VerifyBlockRecord checks the namespace against the asker's and recomputes the
// key in it, so a record of another tenant, model or profile fails as surely
// as a corrupt one. The checksums catch damage, not forgery: whoever may write
// to a store can write records every check passes, so a store is trusted as
// far as those who can write to it are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::stores {

inline constexpr uint64_t kRecordMagic = 0x31304b4c4254564bULL;  // "KVTBLK01"
inline constexpr uint32_t kRecordVersion = 1;
inline constexpr size_t kRecordHeaderBytes = 96;

// What a record says about its block.
struct BlockRecordHeader {
  uint64_t profile_fingerprint = 0;
  BlockKey key;
  BlockKey parent;
  Namespace key_ns;
};

// The record of one block: header, tokens and the payload bytes.
std::string EncodeBlockRecord(const BlockRecordHeader& header, std::span<const TokenId> tokens,
                              std::span<const std::byte> payload);

// The bytes a record of `tokens` tokens and `payload_bytes` payload takes.
constexpr size_t BlockRecordBytes(size_t tokens, size_t payload_bytes) {
  return kRecordHeaderBytes + tokens * sizeof(TokenId) + payload_bytes;
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
};

// Why a record was turned away: it is damaged (a short value, a bad magic or
// checksum), or it is another block's (another profile, tenant, model, prefix
// or tokens). Both are misses; they are counted apart.
enum class RecordFault : uint8_t { kNone, kCorrupt, kForeign };

struct RecordCheck {
  RecordFault fault = RecordFault::kNone;
  std::string reason;                  // Empty when fault is kNone.
  std::span<const std::byte> payload;  // Into the record's bytes; valid while they are.
  bool ok() const { return fault == RecordFault::kNone; }
};

// Checks `record` against `want`: format, both checksums, the fingerprint, the
// namespace, the key and parent, the tokens, the payload's size, and that the key recomputes
// from parent + want.key_ns + tokens (so it was chained in the asker's
// namespace). Only a record that passes every check has a payload.
RecordCheck VerifyBlockRecord(std::string_view record, const RecordExpectation& want);

}  // namespace kvtier::stores
