// BlockIndex: the writer side of the shared-memory block index (block_index.h).
#include "block_index.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <random>

namespace kvtier::tiering {

Result<BlockIndex> BlockIndex::Create(const std::string& label, uint32_t block_tokens, uint32_t max_records,
                                      uint64_t profile_fingerprint) {
  if (max_records == 0 || max_records > (1u << 30)) return InvalidArgument("index capacity must be in [1, 2^30]");
  const std::string bare = !label.empty() && label[0] == '/' ? label.substr(1) : label;
  if (bare.empty()) return InvalidArgument("the index segment needs a label");
  const IndexGeometry g = IndexGeometry::For(block_tokens, max_records);
  auto seg = ShmSegment::CreateSealed(bare, g.segment_bytes(), ShmSegment::Sharing::kReadOnly, /*populate=*/false);
  if (!seg.ok()) return seg.status();
  BlockIndex index;
  index.segment_ = std::move(seg).value();
  index.geometry_ = g;
  std::byte* base = index.segment_.data();
  // Huge pages where the kernel offers them for shared memory (shmem_enabled
  // "advise" or "always"): a lookup's random probes then miss the TLB far less.
  // Elsewhere this is a no-op and 4 KiB pages it is.
  (void)::madvise(base, g.segment_bytes(), MADV_HUGEPAGE);
  index.header_ = reinterpret_cast<IndexHeader*>(base);
  index.table_ = reinterpret_cast<IndexSlot*>(base + g.table_offset());
  index.rows_ = reinterpret_cast<TokenId*>(base + g.tokens_offset());
  index.mask_ = g.table_slots - 1;
  for (uint32_t i = 0; i < g.table_slots; ++i) {
    index.table_[i] = IndexSlot{0, kNoRecord, 0, 0, 0, 0, 0, 0};
  }
  IndexHeader h{};
  h.magic = kIndexMagic;
  h.abi_version = kShmAbiVersion;
  h.header_bytes = kIndexHeaderBytes;
  h.segment_bytes = g.segment_bytes();
  h.profile_fingerprint = profile_fingerprint;
  h.instance_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  h.block_tokens = block_tokens;
  h.table_slots = g.table_slots;
  h.max_records = max_records;
  h.table_offset = g.table_offset();
  h.tokens_offset = g.tokens_offset();
  *index.header_ = h;
  return index;
}

// Probes are bounded by the table's size, and an entry whose record lies
// outside the rows is no entry: nothing this process reads from the segment can
// make it loop or index out of bounds (only it writes the segment, and still).
uint32_t BlockIndex::FindPos(const BlockKey& key) const {
  uint32_t pos = HomeSlot(key, geometry_.table_slots);
  for (uint32_t probes = 0; probes < geometry_.table_slots; ++probes, pos = (pos + 1) & mask_) {
    const IndexSlot& s = table_[pos];
    if (s.record == kNoRecord) return kNoRecord;
    if (s.key_lo == key.lo && s.key_hi == key.hi) return s.record < geometry_.max_records ? pos : kNoRecord;
  }
  return kNoRecord;
}

uint32_t BlockIndex::Find(const BlockKey& key) const {
  const uint32_t pos = FindPos(key);
  return pos == kNoRecord ? kNoRecord : table_[pos].record;
}

void BlockIndex::FindBatch(std::span<const BlockKey> keys, std::span<uint32_t> records) const {
  constexpr size_t kAhead = 16;
  const size_t n = keys.size() < records.size() ? keys.size() : records.size();
  for (size_t i = 0; i < n && i < kAhead; ++i) Prefetch(keys[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) Prefetch(keys[i + kAhead]);
    const uint32_t pos = FindPos(keys[i]);
    records[i] = pos != kNoRecord ? table_[pos].record : kNoRecord;
  }
}

size_t BlockIndex::FindPrefix(std::span<const BlockKey> keys, uint32_t ns_tag, std::span<uint32_t> records) const {
  constexpr size_t kAhead = 16;
  const size_t n = keys.size() < records.size() ? keys.size() : records.size();
  const size_t row_bytes = geometry_.row_words() * sizeof(TokenId);
  for (size_t i = 0; i < n && i < kAhead; ++i) Prefetch(keys[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) Prefetch(keys[i + kAhead]);
    const uint32_t pos = FindPos(keys[i]);
    if (pos == kNoRecord || table_[pos].ns_tag != ns_tag) return i;
    records[i] = table_[pos].record;
    // Its row is read next (a row may straddle two lines).
    const char* r = reinterpret_cast<const char*>(row(records[i]));
    __builtin_prefetch(r);
    __builtin_prefetch(r + row_bytes - 1);
  }
  return n;
}

void BlockIndex::BeginWrite(IndexSlot& s) {
  std::atomic_ref<uint32_t>(s.seq).store(s.seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

void BlockIndex::EndWrite(IndexSlot& s) {
  std::atomic_ref<uint32_t>(s.seq).store(s.seq + 1, std::memory_order_release);
}

void BlockIndex::Insert(const BlockKey& key, uint32_t record, uint32_t ns_tag, Tier tier) {
  uint32_t pos = HomeSlot(key, geometry_.table_slots);
  // The table is at most half full (the engine holds at most max_records), so
  // an empty slot is always found: the bound only keeps a broken table finite.
  for (uint32_t probes = 0; table_[pos].record != kNoRecord; ++probes, pos = (pos + 1) & mask_) {
    if (probes == geometry_.table_slots) std::abort();
  }
  IndexSlot& s = table_[pos];
  BeginWrite(s);
  StoreRelaxed(s.key_lo, key.lo);
  StoreRelaxed(s.key_hi, key.hi);
  StoreRelaxed(s.ns_tag, ns_tag);
  StoreRelaxed(s.tier, static_cast<uint8_t>(tier));
  StoreRelaxed(s.moving, uint8_t{0});
  StoreRelaxed(s.record, record);
  EndWrite(s);
  ++size_;
  StoreRelaxed(header_->entries, uint64_t{size_});
}

void BlockIndex::MoveSlot(uint32_t from, uint32_t to) {
  IndexSlot& d = table_[to];
  const IndexSlot& s = table_[from];
  BeginWrite(d);
  StoreRelaxed(d.key_lo, s.key_lo);
  StoreRelaxed(d.key_hi, s.key_hi);
  StoreRelaxed(d.ns_tag, s.ns_tag);
  StoreRelaxed(d.tier, s.tier);
  StoreRelaxed(d.moving, s.moving);
  StoreRelaxed(d.record, s.record);
  EndWrite(d);
}

bool BlockIndex::Erase(const BlockKey& key) {
  uint32_t hole = FindPos(key);
  if (hole == kNoRecord) return false;
  // Backward-shift deletion: pull later members of the probe run into the hole.
  uint32_t pos = (hole + 1) & mask_;
  for (uint32_t probes = 0; probes < geometry_.table_slots && table_[pos].record != kNoRecord; ++probes) {
    const uint32_t home = HomeSlot(BlockKey{table_[pos].key_lo, table_[pos].key_hi}, geometry_.table_slots);
    // The entry at `pos` may move to `hole` iff its home is not in (hole, pos] cyclically.
    const bool movable = hole <= pos ? (home <= hole || home > pos) : (home <= hole && home > pos);
    if (movable) {
      MoveSlot(pos, hole);
      hole = pos;
    }
    pos = (pos + 1) & mask_;
  }
  IndexSlot& h = table_[hole];
  BeginWrite(h);
  StoreRelaxed(h.record, kNoRecord);
  StoreRelaxed(h.key_lo, uint64_t{0});
  StoreRelaxed(h.key_hi, uint64_t{0});
  EndWrite(h);
  --size_;
  StoreRelaxed(header_->entries, uint64_t{size_});
  return true;
}

bool BlockIndex::SetLocation(const BlockKey& key, Tier tier, bool moving) {
  const uint32_t pos = FindPos(key);
  if (pos == kNoRecord) return false;
  IndexSlot& s = table_[pos];
  BeginWrite(s);
  StoreRelaxed(s.tier, static_cast<uint8_t>(tier));
  StoreRelaxed(s.moving, static_cast<uint8_t>(moving ? 1 : 0));
  EndWrite(s);
  return true;
}

BlockKey BlockIndex::parent(uint32_t record) const {
  const TokenId* r = row(record);
  return BlockKey{r[0] | (uint64_t{r[1]} << 32), r[2] | (uint64_t{r[3]} << 32)};
}

void BlockIndex::WriteRow(uint32_t record, const BlockKey& parent_key, std::span<const TokenId> toks) {
  TokenId* r = row(record);
  const TokenId words[kRowHeaderWords] = {static_cast<TokenId>(parent_key.lo), static_cast<TokenId>(parent_key.lo >> 32),
                                          static_cast<TokenId>(parent_key.hi), static_cast<TokenId>(parent_key.hi >> 32)};
  for (uint32_t i = 0; i < kRowHeaderWords; ++i) StoreRelaxed(r[i], words[i]);
  for (size_t i = 0; i < toks.size(); ++i) StoreRelaxed(r[kRowHeaderWords + i], toks[i]);
}

void BlockIndex::SetFlags(uint32_t flags) { header_->flags = flags; }

}  // namespace kvtier::tiering
