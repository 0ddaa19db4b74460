// What the tests of the engine's parts (block_table, mover, session_table,
// reclaim) share beside engine_test_support.h: made-up blocks whose key,
// parent and tokens are functions of a number, and a client's view of an
// index entry.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "block_index.h"
#include "engine_test_support.h"

namespace kvtier::tiering {

// Block `n`'s key, its parent (block n - 1's key; none for block 0) and tokens.
inline BlockKey PartKey(uint64_t n) { return BlockKey{n + 1, n * 7 + 3}; }
inline BlockKey PartParent(uint64_t n) { return n == 0 ? BlockKey{} : PartKey(n - 1); }
inline std::vector<TokenId> PartTokens(uint64_t n) {
  std::vector<TokenId> t(kBt);
  for (uint32_t i = 0; i < kBt; ++i) t[i] = static_cast<TokenId>(n * 100 + i);
  return t;
}

// The index entry of `key`, as a client reads it, if the key is indexed.
inline std::optional<IndexSlot> IndexSlotOf(const BlockIndex& index, const BlockKey& key) {
  std::optional<IndexSlot> found;
  index.ForEach([&](const BlockKey& k, const IndexSlot& s) {
    if (k == key) found = s;
  });
  return found;
}

}  // namespace kvtier::tiering
