// The block index as it lies in shared memory, and a lock-free reader for it.
//
// Segment layout (offsets from the segment start, all 64-byte aligned):
//   [0, 4096)                      IndexHeader
//   [table_offset, +32*slots)      IndexSlot[table_slots], open addressing, linear probing
//   [tokens_offset, ...)           TokenId[max_records][4 + block_tokens]: each record's
//                                  parent key (4 words, lo then hi) then its tokens
//
// Single writer (the daemon's engine thread); any number of read-only mappers.
// Each slot carries a sequence number (seqlock): odd while the writer changes it.
// A reader copies the slot and the record's token row, then re-checks the sequence;
// the writer bumps a slot's sequence before its record's token row can be reused,
// so an unchanged sequence proves the copy is consistent. Deletion shifts entries
// backwards, so a reader racing a deletion can miss an entry: probes are advisory
// (they pin nothing) and such a miss is harmless.
//
// Nothing here holds a pointer; everything is trivially copyable and fixed-size.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

inline constexpr uint64_t kIndexMagic = 0x5844494b56544b31ULL;  // "1KTVKIDX"
inline constexpr uint32_t kShmAbiVersion = 1;
inline constexpr uint32_t kNoRecord = 0xffffffffu;

// IndexHeader::flags: stores below the host tier may hold blocks this index
// lacks, so a probe's miss is no reason to skip asking the daemon (Acquire).
inline constexpr uint32_t kIndexFlagStoresBelow = 1u << 0;

struct IndexHeader {
  uint64_t magic;
  uint32_t abi_version;
  uint32_t header_bytes;
  uint64_t segment_bytes;
  uint64_t profile_fingerprint;
  uint64_t instance_id;     // Random per daemon start; a client compares it after a reconnect.
  uint32_t block_tokens;
  uint32_t table_slots;     // Power of two.
  uint32_t max_records;
  uint32_t flags;  // kIndexFlag*; set by the daemon before the first client maps it.
  uint64_t table_offset;
  uint64_t tokens_offset;
  uint64_t entries;         // Written by the daemon (relaxed); informational.
};
static_assert(std::is_trivially_copyable_v<IndexHeader> && std::is_standard_layout_v<IndexHeader>);

struct alignas(32) IndexSlot {
  uint32_t seq;       // Seqlock sequence; even when stable.
  uint32_t record;    // kNoRecord when the slot is empty.
  uint64_t key_lo;
  uint64_t key_hi;
  uint32_t ns_tag;    // Low 32 bits of the namespace id.
  uint8_t tier;       // Tier where the block's bytes are readable now.
  uint8_t moving;     // 1 while a copy to the other tier is in flight.
  uint16_t reserved;
};
static_assert(sizeof(IndexSlot) == 32);
static_assert(std::is_trivially_copyable_v<IndexSlot> && std::is_standard_layout_v<IndexSlot>);

inline constexpr size_t kIndexHeaderBytes = 4096;
inline constexpr uint32_t kRowHeaderWords = 4;  // The parent key, as 4 uint32 words.

struct IndexGeometry {
  uint32_t block_tokens = 16;
  uint32_t max_records = 0;
  uint32_t table_slots = 0;  // Power of two >= 2 * max_records.

  static IndexGeometry For(uint32_t block_tokens, uint32_t max_records);
  size_t table_offset() const { return kIndexHeaderBytes; }
  uint32_t row_words() const { return kRowHeaderWords + block_tokens; }
  size_t tokens_offset() const;
  size_t segment_bytes() const;
};

inline uint32_t HomeSlot(const BlockKey& key, uint32_t table_slots) {
  return static_cast<uint32_t>(key.lo) & (table_slots - 1);
}

// Relaxed atomic access to plain shared-memory fields.
template <typename T>
inline T LoadRelaxed(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_relaxed);
}
template <typename T>
inline void StoreRelaxed(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_relaxed);
}

// A consistent copy of one present entry.
struct IndexEntry {
  uint32_t record = kNoRecord;
  Tier tier = Tier::kGpu;
  bool moving = false;
};

// Read-only view of a mapped index segment, for clients (probe) and tests.
// Thread-safe: holds no mutable state.
class IndexView {
 public:
  // Validates magic, ABI version, and that every region fits `bytes`.
  static Result<IndexView> Attach(const std::byte* base, size_t bytes);

  const IndexHeader& header() const { return *header_; }
  uint32_t block_tokens() const { return block_tokens_; }

  // Looks `key` up and, when present, compares its stored parent key, tokens
  // (block_tokens of them) and namespace tag. Returns true on a verified hit only:
  // a hash collision is a miss, never another prefix's entry.
  bool Find(const BlockKey& key, const BlockKey& parent, uint32_t ns_tag, std::span<const TokenId> tokens,
            IndexEntry* out) const;

  // Longest cached prefix of `keys`, chained from `parent` (block i's tokens at
  // tokens[i*block_tokens]): number of leading blocks found and verified. Fills
  // `tiers` (if non-empty) per hit.
  size_t LongestPrefix(const BlockKey& parent, std::span<const BlockKey> keys, uint32_t ns_tag,
                       std::span<const TokenId> tokens, std::span<Tier> tiers = {}) const;

 private:
  const IndexHeader* header_ = nullptr;
  const IndexSlot* table_ = nullptr;
  const TokenId* tokens_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t block_tokens_ = 0;
  uint32_t max_records_ = 0;
};

inline uint32_t NamespaceTag(const Namespace& ns) { return static_cast<uint32_t>(ns.id.lo); }

}  // namespace kvtier
