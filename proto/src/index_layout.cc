#include "kvtier/index_layout.h"

#include <bit>

namespace kvtier {
namespace {

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

IndexGeometry IndexGeometry::For(uint32_t block_tokens, uint32_t max_records) {
  IndexGeometry g;
  g.block_tokens = block_tokens;
  g.max_records = max_records;
  g.table_slots = static_cast<uint32_t>(std::bit_ceil(std::max<uint64_t>(2ull * max_records, 64)));
  return g;
}

size_t IndexGeometry::tokens_offset() const {
  return AlignUp(table_offset() + size_t{table_slots} * sizeof(IndexSlot), 64);
}

size_t IndexGeometry::segment_bytes() const {
  return AlignUp(tokens_offset() + size_t{max_records} * row_words() * sizeof(TokenId), 4096);
}

Result<IndexView> IndexView::Attach(const std::byte* base, size_t bytes) {
  if (bytes < kIndexHeaderBytes) return Corrupt("index segment smaller than its header");
  const auto* h = reinterpret_cast<const IndexHeader*>(base);
  if (h->magic != kIndexMagic) return Corrupt("index segment has a bad magic number");
  if (h->abi_version != kShmAbiVersion) {
    return Status(StatusCode::kVersionMismatch, "index ABI version " + std::to_string(h->abi_version) +
                                                    ", this build reads " + std::to_string(kShmAbiVersion));
  }
  if (h->block_tokens == 0 || h->block_tokens > 1024 || h->table_slots == 0 ||
      !std::has_single_bit(h->table_slots) || h->segment_bytes > bytes) {
    return Corrupt("index header geometry is invalid");
  }
  const IndexGeometry g = IndexGeometry::For(h->block_tokens, h->max_records);
  if (g.table_slots != h->table_slots || h->table_offset != g.table_offset() ||
      h->tokens_offset != g.tokens_offset() || g.segment_bytes() > bytes) {
    return Corrupt("index header offsets do not match its geometry");
  }
  IndexView v;
  v.header_ = h;
  v.table_ = reinterpret_cast<const IndexSlot*>(base + h->table_offset);
  v.tokens_ = reinterpret_cast<const TokenId*>(base + h->tokens_offset);
  v.mask_ = h->table_slots - 1;
  v.block_tokens_ = h->block_tokens;
  v.max_records_ = h->max_records;
  return v;
}

bool IndexView::Find(const BlockKey& key, const BlockKey& parent, uint32_t ns_tag,
                     std::span<const TokenId> tokens, IndexEntry* out) const {
  if (tokens.size() != block_tokens_) return false;
  uint32_t pos = static_cast<uint32_t>(key.lo) & mask_;
  for (uint32_t probes = 0; probes <= mask_; ++probes, pos = (pos + 1) & mask_) {
    const IndexSlot& s = table_[pos];
    bool next_slot = false;
    for (int attempt = 0; attempt < 64 && !next_slot; ++attempt) {
      const uint32_t s1 = std::atomic_ref<uint32_t>(const_cast<uint32_t&>(s.seq)).load(std::memory_order_acquire);
      if (s1 & 1u) continue;  // Writer inside; retry.
      const uint32_t record = LoadRelaxed(s.record);
      if (record == kNoRecord) {
        std::atomic_thread_fence(std::memory_order_acquire);
        if (LoadRelaxed(s.seq) == s1) return false;  // Empty slot ends the probe run.
        continue;
      }
      const bool key_match = LoadRelaxed(s.key_lo) == key.lo && LoadRelaxed(s.key_hi) == key.hi;
      if (!key_match) {
        std::atomic_thread_fence(std::memory_order_acquire);
        if (LoadRelaxed(s.seq) == s1) next_slot = true;  // Stable and another key.
        continue;
      }
      // A record outside the segment or a tier that does not exist is a corrupt
      // entry: a miss, and its row is never read.
      const uint8_t tier = LoadRelaxed(s.tier);
      bool same = record < max_records_ && tier < kTierCount && LoadRelaxed(s.ns_tag) == ns_tag;
      if (same) {
        const TokenId* row = tokens_ + size_t{record} * (kRowHeaderWords + block_tokens_);
        const uint64_t plo = LoadRelaxed(row[0]) | (uint64_t{LoadRelaxed(row[1])} << 32);
        const uint64_t phi = LoadRelaxed(row[2]) | (uint64_t{LoadRelaxed(row[3])} << 32);
        same = plo == parent.lo && phi == parent.hi;
        row += kRowHeaderWords;
        for (uint32_t t = 0; same && t < block_tokens_; ++t) same = LoadRelaxed(row[t]) == tokens[t];
      }
      const uint8_t moving = LoadRelaxed(s.moving);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (LoadRelaxed(s.seq) != s1) continue;  // Torn: read again.
      if (!same) return false;  // Key matched but tokens, tenant or the entry itself did not: a miss, never a wrong hit.
      if (out != nullptr) *out = IndexEntry{record, static_cast<Tier>(tier), moving != 0};
      return true;
    }
    if (!next_slot) return false;  // The writer kept the slot busy: report a miss.
  }
  return false;
}

size_t IndexView::LongestPrefix(const BlockKey& parent, std::span<const BlockKey> keys, uint32_t ns_tag,
                                std::span<const TokenId> tokens, std::span<Tier> tiers) const {
  // Start the memory loads of every home slot first so the misses overlap.
  for (const BlockKey& k : keys) __builtin_prefetch(&table_[static_cast<uint32_t>(k.lo) & mask_]);
  size_t i = 0;
  for (; i < keys.size(); ++i) {
    if (tokens.size() < (i + 1) * block_tokens_) break;
    IndexEntry e;
    const BlockKey& p = i == 0 ? parent : keys[i - 1];
    if (!Find(keys[i], p, ns_tag, tokens.subspan(i * block_tokens_, block_tokens_), &e)) break;
    if (i < tiers.size()) tiers[i] = e.tier;
  }
  return i;
}

}  // namespace kvtier
