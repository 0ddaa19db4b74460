// Session: a client-named chain of blocks (one conversation). Engine-internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tiering {

struct Session {
  std::string id;
  std::vector<uint32_t> chain;  // Record ids, block 0 first. Each holds one reference.
  uint64_t last_use = 0;
  std::chrono::steady_clock::time_point used_at{};  // Wall time of last_use.
  int priority = 0;
  std::chrono::steady_clock::time_point priority_until{};  // When priority goes back to 0; epoch: never.
  uint32_t ns_tag = 0;

  // Owned by the eviction policy.
  Session* lru_prev = nullptr;
  Session* lru_next = nullptr;
  int lru_list = -1;
};

}  // namespace kvtier::tiering
