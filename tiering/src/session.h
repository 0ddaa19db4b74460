// Session: a client-named chain of blocks (one conversation) of one tenant. Engine-internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tiering/policy.h"

namespace kvtier::tiering {

struct TenantAccount;

struct Session {
  TenantAccount* tenant = nullptr;  // Never null; outlives the session.
  std::string id;                   // Unique within its tenant.
  std::vector<uint32_t> chain;      // Record ids, block 0 first. Each holds one reference.
  // The keys that continue the chain (block chain.size() first) of blocks
  // pressure dropped from it while stores were below the host tier
  // (EngineOptions::on_spill), so that the session can say where they went.
  // Holds no reference; where each block is now is the stores' to say. A
  // session whose chain is empty lives on while this is not.
  std::vector<BlockKey> below;
  ModelId below_model;  // The model those keys were chained in.
  uint64_t last_use = 0;
  std::chrono::steady_clock::time_point used_at{};  // Wall time of last_use.
  int priority = 0;
  std::chrono::steady_clock::time_point priority_until{};
  // Its client ended it (Engine::EndSession): the chain stays cached at its
  // place in the eviction order, but the session is the first its tenant gives
  // up for a new one at max_sessions_per_tenant. Naming it again (an Acquire,
  // a Commit, a Prefetch) takes it back.
  bool ended = false;  // When priority goes back to 0; epoch: never.
  SessionHandle handle = 0;  // How the eviction policy knows it (SessionTable assigns it).
};

}  // namespace kvtier::tiering
