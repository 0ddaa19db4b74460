// Session: a client-named chain of blocks (one conversation) of one tenant. Engine-internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tiering {

struct TenantAccount;

struct Session {
  TenantAccount* tenant = nullptr;  // Never null; outlives the session.
  std::string id;                   // Unique within its tenant.
  std::vector<uint32_t> chain;      // Record ids, block 0 first. Each holds one reference.
  uint64_t last_use = 0;
  std::chrono::steady_clock::time_point used_at{};  // Wall time of last_use.
  int priority = 0;
  std::chrono::steady_clock::time_point priority_until{};  // When priority goes back to 0; epoch: never.

  // Owned by the eviction policy.
  Session* lru_prev = nullptr;
  Session* lru_next = nullptr;
  int lru_list = -1;
};

}  // namespace kvtier::tiering
