// BlockIndex: the writer side of the shared-memory block index (see index_layout.h).
//
// Open addressing with linear probing over a power-of-two table at most half
// full; deletion shifts entries back (no tombstones), so lookups stay O(1) under
// any churn. Every slot change is bracketed by the slot's seqlock so readers in
// other processes never see a torn entry. Single writer: not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "kvtier/block_key.h"
#include "kvtier/index_layout.h"
#include "kvtier/shm_segment.h"

namespace kvtier::tiering {

class BlockIndex {
 public:
  // Creates a sealed segment labelled `label` (a leading '/' is dropped) for up
  // to `max_records` records of `block_tokens`. Clients map it read-only from
  // share_fd(); only this object writes it.
  static Result<BlockIndex> Create(const std::string& label, uint32_t block_tokens, uint32_t max_records,
                                   uint64_t profile_fingerprint);

  BlockIndex(BlockIndex&&) noexcept = default;
  BlockIndex& operator=(BlockIndex&&) noexcept = default;

  const std::string& segment_name() const { return segment_.name(); }
  int share_fd() const { return segment_.share_fd(); }
  uint32_t size() const { return size_; }
  uint32_t block_tokens() const { return geometry_.block_tokens; }

  // Record id stored under `key`, or kNoRecord.
  uint32_t Find(const BlockKey& key) const;
  // Find for many keys: records[i] for keys[i], i < min(keys.size(), records.size()).
  // The table loads are started up front so that the misses overlap.
  void FindBatch(std::span<const BlockKey> keys, std::span<uint32_t> records) const;
  // For a prefix match: records[i] for the leading keys present, stopping at the
  // first miss (an entry whose namespace tag is not `ns_tag` counts as absent, so
  // the caller needs no per-record tag check); returns how many were found. Each
  // hit's row is prefetched as soon as it is found, for the caller's RowMatches.
  size_t FindPrefix(std::span<const BlockKey> keys, uint32_t ns_tag, std::span<uint32_t> records) const;
  // Sets IndexHeader::flags (kIndexFlag*). Before clients map the index.
  void SetFlags(uint32_t flags);
  // Starts loading the home slot of `key` into cache.
  void Prefetch(const BlockKey& key) const { __builtin_prefetch(&table_[HomeSlot(key, geometry_.table_slots)]); }

  // REQUIRES: `key` absent, record < max_records, the record's row written first.
  void Insert(const BlockKey& key, uint32_t record, uint32_t ns_tag, Tier tier);
  // Returns false if `key` is absent.
  bool Erase(const BlockKey& key);
  // Updates where a present block is readable. Returns false if absent.
  bool SetLocation(const BlockKey& key, Tier tier, bool moving);

  // The record's row: parent key and tokens. Writable only while the record is
  // not in the table (before Insert, after Erase).
  TokenId* row(uint32_t record) const { return rows_ + size_t{record} * geometry_.row_words(); }
  const TokenId* tokens(uint32_t record) const { return row(record) + kRowHeaderWords; }
  BlockKey parent(uint32_t record) const;
  void WriteRow(uint32_t record, const BlockKey& parent, std::span<const TokenId> tokens);
  // Stored parent and tokens equal the given ones. Inline, and a constant-size
  // compare for 16-token blocks: it runs once per block of every match.
  bool RowMatches(uint32_t record, const BlockKey& parent, std::span<const TokenId> tokens) const {
    const TokenId* r = row(record);
    uint64_t stored[2];  // The row header: parent.lo then parent.hi, little-endian words.
    std::memcpy(stored, r, sizeof(stored));
    if (stored[0] != parent.lo || stored[1] != parent.hi) return false;
    if (tokens.size() == 16) return std::memcmp(r + kRowHeaderWords, tokens.data(), 16 * sizeof(TokenId)) == 0;
    return std::memcmp(r + kRowHeaderWords, tokens.data(), tokens.size_bytes()) == 0;
  }

  // Visits every entry (tests and invariant checks).
  template <typename F>
  void ForEach(F&& f) const {
    for (uint32_t i = 0; i < geometry_.table_slots; ++i) {
      if (table_[i].record != kNoRecord) f(BlockKey{table_[i].key_lo, table_[i].key_hi}, table_[i]);
    }
  }

 private:
  BlockIndex() = default;
  uint32_t FindPos(const BlockKey& key) const;  // kNoRecord if absent.

  void BeginWrite(IndexSlot& s);
  void EndWrite(IndexSlot& s);
  void MoveSlot(uint32_t from, uint32_t to);

  ShmSegment segment_;
  IndexGeometry geometry_;
  IndexHeader* header_ = nullptr;
  IndexSlot* table_ = nullptr;
  TokenId* rows_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t size_ = 0;
};

}  // namespace kvtier::tiering
