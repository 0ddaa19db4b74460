// Deterministic block payloads for tests: the bytes a block must hold are a
// function of its key, so any process can write or verify them independently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvtier/block_key.h"

namespace kvtier::testing {

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

inline void FillPayload(const BlockKey& key, std::byte* dst, size_t bytes) {
  uint64_t s = key.lo ^ Mix64(key.hi);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    s = Mix64(s + i);
    std::memcpy(dst + i, &s, 8);
  }
}

inline bool PayloadIntact(const BlockKey& key, const std::byte* src, size_t bytes) {
  uint64_t s = key.lo ^ Mix64(key.hi);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    s = Mix64(s + i);
    if (std::memcmp(src + i, &s, 8) != 0) return false;
  }
  return true;
}

}  // namespace kvtier::testing
