// Fuzz target for the client's reader of the shared-memory block index
// (IndexView in proto/src/index_layout.cc).
//
// The input is the whole segment, as a client would map it: header, slot table
// and token rows, all possibly corrupt. IndexView::Attach must reject a bad
// header; on a segment it accepts, Find and LongestPrefix must stay inside the
// segment (the buffer has exactly the input's size, so AddressSanitizer sees any
// read past it) and may only report verified hits: a record inside the segment,
// a real tier, and a stored row equal to what was asked for. The lookups are
// built from the segment's own slots and rows, so that hits are reachable.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <vector>

#include "kvtier/index_layout.h"

namespace {

using kvtier::BlockKey;
using kvtier::IndexEntry;
using kvtier::IndexSlot;
using kvtier::IndexView;
using kvtier::Tier;
using kvtier::TokenId;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "index_fuzz: %s\n", what);
  std::abort();
}

// Slots looked at per input; keeps each run short on a large table.
constexpr uint32_t kMaxSlotsExamined = 256;

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : size(n), data(static_cast<std::byte*>(::operator new(n == 0 ? 1 : n, std::align_val_t{4096}))) {}
  ~AlignedBuffer() { ::operator delete(data, std::align_val_t{4096}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  size_t size;
  std::byte* data;
};

struct Row {
  BlockKey parent;
  std::vector<TokenId> tokens;
};

// The stored row of `record`, read straight from the buffer (the fuzzer's own
// view of the layout, independent of IndexView's).
Row ReadRow(const std::byte* base, const kvtier::IndexHeader& h, uint32_t record) {
  const size_t words = kvtier::kRowHeaderWords + h.block_tokens;
  std::vector<TokenId> w(words);
  std::memcpy(w.data(), base + h.tokens_offset + size_t{record} * words * sizeof(TokenId), words * sizeof(TokenId));
  Row r;
  r.parent.lo = w[0] | (uint64_t{w[1]} << 32);
  r.parent.hi = w[2] | (uint64_t{w[3]} << 32);
  r.tokens.assign(w.begin() + kvtier::kRowHeaderWords, w.end());
  return r;
}

void CheckHit(const std::byte* base, const kvtier::IndexHeader& h, const IndexEntry& e, const BlockKey& parent,
              std::span<const TokenId> tokens) {
  if (e.record >= h.max_records) Die("a hit names a record outside the segment");
  if (e.tier != Tier::kGpu && e.tier != Tier::kHost) Die("a hit names no real tier");
  const Row stored = ReadRow(base, h, e.record);
  if (stored.parent.lo != parent.lo || stored.parent.hi != parent.hi) Die("a hit with another parent");
  if (!std::equal(stored.tokens.begin(), stored.tokens.end(), tokens.begin(), tokens.end())) {
    Die("a hit with other tokens");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  AlignedBuffer seg(size);
  if (size != 0) std::memcpy(seg.data, data, size);

  auto attached = IndexView::Attach(seg.data, seg.size);
  if (!attached.ok()) {
    if (attached.status().message().empty()) Die("a rejection without a message");
    return 0;
  }
  const IndexView& view = *attached;
  // Attach accepted the header, so the header, table and rows lie inside the buffer.
  kvtier::IndexHeader h;
  std::memcpy(&h, seg.data, sizeof(h));
  if (view.block_tokens() != h.block_tokens) Die("block_tokens differs from the header");
  const uint32_t bt = h.block_tokens;

  std::vector<BlockKey> chain_keys;
  std::vector<TokenId> chain_tokens;
  BlockKey chain_parent{};
  uint32_t tag = 0;
  const uint32_t examined = std::min(h.table_slots, kMaxSlotsExamined);
  for (uint32_t i = 0; i < examined; ++i) {
    IndexSlot s;
    std::memcpy(&s, seg.data + h.table_offset + size_t{i} * sizeof(IndexSlot), sizeof(s));
    const BlockKey key{s.key_lo, s.key_hi};
    Row row;
    if (s.record < h.max_records) {
      row = ReadRow(seg.data, h, s.record);
    } else {
      // A record index outside the segment: ask with tokens made from the key.
      row.parent = BlockKey{s.key_hi, s.key_lo};
      row.tokens.assign(bt, static_cast<TokenId>(s.key_lo));
    }
    IndexEntry e;
    if (view.Find(key, row.parent, s.ns_tag, row.tokens, &e)) CheckHit(seg.data, h, e, row.parent, row.tokens);
    // Same key, another namespace tag and other tokens: whatever it answers must be verified.
    std::vector<TokenId> other = row.tokens;
    if (!other.empty()) other.back() ^= 1u;
    if (view.Find(key, row.parent, s.ns_tag, other, &e)) CheckHit(seg.data, h, e, row.parent, other);
    if (view.Find(key, row.parent, s.ns_tag ^ 1u, row.tokens, &e)) {
      CheckHit(seg.data, h, e, row.parent, row.tokens);
    }
    // A whole block is required.
    if (bt > 1 && view.Find(key, row.parent, s.ns_tag, std::span<const TokenId>(row.tokens).first(bt - 1), &e)) {
      Die("a hit for fewer tokens than a block");
    }
    (void)view.Find(key, row.parent, s.ns_tag, row.tokens, nullptr);

    if (s.record != kvtier::kNoRecord && chain_keys.size() < 64) {
      if (chain_keys.empty()) {
        chain_parent = row.parent;
        tag = s.ns_tag;
      }
      chain_keys.push_back(key);
      chain_tokens.insert(chain_tokens.end(), row.tokens.begin(), row.tokens.end());
    }
  }

  // The occupied slots as one chain: LongestPrefix must agree with block-by-block Finds.
  std::vector<Tier> tiers(chain_keys.size(), Tier::kGpu);
  const size_t n = view.LongestPrefix(chain_parent, chain_keys, tag, chain_tokens, tiers);
  if (n > chain_keys.size()) Die("LongestPrefix found more blocks than it was given");
  for (size_t i = 0; i < n; ++i) {
    if (tiers[i] != Tier::kGpu && tiers[i] != Tier::kHost) Die("LongestPrefix reports no real tier");
  }
  // Fewer tokens than keys, and no tokens at all.
  if (!chain_tokens.empty()) {
    (void)view.LongestPrefix(chain_parent, chain_keys, tag,
                             std::span<const TokenId>(chain_tokens).first(chain_tokens.size() - 1), tiers);
  }
  if (view.LongestPrefix(chain_parent, chain_keys, tag, {}, tiers) != 0 && bt > 0) {
    Die("LongestPrefix found blocks without tokens");
  }
  return 0;
}
