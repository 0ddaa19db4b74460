// Shared by the chaos worker and the chaos/soak drivers: the daemon
// configuration they run against, the token streams the workers cache, and the
// session names that let a driver regenerate any session's tokens.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "payload.h"

namespace kvtier::chaos {

// Small pools and a small session table, so that demotion, drops under
// pressure and session eviction all happen while the workers run.
inline constexpr const char* kChaosDaemonConfig = R"(backend: host
log_level: info
profiles:
  - name: chaos
    layers: 2
    kv_heads: 2
    head_dim: 32
    dtype: fp16
    block_tokens: 16
    gpu_blocks: 64
    host_blocks: 160
tiering:
  tick_ms: 5
limits:
  max_sessions: 40
  max_leases_per_client: 64
)";

// Conversations per worker and the longest one in blocks.
inline constexpr uint32_t kConversations = 6;
inline constexpr uint32_t kMaxBlocks = 14;
inline constexpr uint32_t kSharedBlocks = 1;  // A "system prompt" block every conversation starts with.

// The full token stream of conversation `conv` of worker `worker` in a run with
// `seed`: every turn caches a prefix of it. The first kSharedBlocks blocks are the
// same for every conversation of the run, so sessions share blocks.
inline std::vector<TokenId> ConversationTokens(uint64_t seed, uint32_t worker, uint32_t conv, uint32_t block_tokens) {
  std::vector<TokenId> t(size_t{kMaxBlocks} * block_tokens);
  std::mt19937_64 shared(testing::Mix64(seed));
  std::mt19937_64 own(testing::Mix64(seed ^ (uint64_t{worker} << 32) ^ (uint64_t{conv} + 1)));
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<TokenId>((i < size_t{kSharedBlocks} * block_tokens ? shared() : own()) % 32000);
  }
  return t;
}

inline std::string SessionName(uint32_t worker, uint32_t conv) {
  return "chaos-w" + std::to_string(worker) + "-c" + std::to_string(conv);
}

struct SessionOwner {
  uint32_t worker = 0;
  uint32_t conv = 0;
};

inline std::optional<SessionOwner> ParseSessionName(const std::string& name) {
  SessionOwner o;
  int used = 0;
  if (std::sscanf(name.c_str(), "chaos-w%u-c%u%n", &o.worker, &o.conv, &used) != 2 ||
      used != static_cast<int>(name.size())) {
    return std::nullopt;
  }
  return o;
}

}  // namespace kvtier::chaos
