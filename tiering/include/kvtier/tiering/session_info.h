// An Engine's sessions as its callers see them (engine.h): one session's
// figures and chain, and the listing's pages and their bounds.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/index_layout.h"
#include "kvtier/tier.h"

namespace kvtier::tiering {

struct SessionInfo {
  std::string tenant;  // Its tenant's name.
  Namespace ns;        // Its tenant's namespace.
  std::string id;
  int priority = 0;
  bool ended = false;  // Its client ended it (Engine::EndSession).
  uint64_t last_use = 0;  // Engine clock ticks; larger is more recent.
  uint64_t idle_ms = 0;   // Milliseconds since the session was last used.
  uint32_t blocks = 0;
  PerTier<uint32_t> blocks_in;
  uint32_t moving = 0;
  uint64_t tokens = 0;
  ModelId model;                // Of its blocks (null: none, or no blocks).
  std::vector<BlockKey> chain;  // Filled by GetSession only.
  std::vector<Tier> tiers;      // Filled by GetSession only.
  // Blocks past the chain that pressure dropped while stores were below the
  // host tier (EngineOptions::on_spill), and their keys in chain order (filled
  // by GetSession only): the stores say where each is now. `blocks` and
  // `tokens` count the chain only.
  uint32_t blocks_below = 0;
  std::vector<BlockKey> below;
  // Same length as below: the local tier of a block another session keeps there, else nullopt.
  std::vector<std::optional<Tier>> below_local;
};

// Where a session listing resumes: after the session (ns, id), in listing
// order (ListSessions).
struct SessionCursor {
  Namespace ns;
  std::string id;
};

// The bounds of one page of a session listing. A page lists at least one
// session when any remains, whatever the bounds, so a caller that pages on
// always gets further.
struct SessionPageLimits {
  size_t sessions = 4096;            // Sessions listed, at most.
  uint64_t chain_blocks = 1u << 18;  // Chain blocks read to describe them, at most: what a page costs.
  // Bytes listed, at most, counting `row_bytes` plus the id and the tenant
  // name of each session: what a reply carrying the page costs.
  size_t bytes = SIZE_MAX;
  size_t row_bytes = 0;
};

struct SessionPage {
  std::vector<SessionInfo> sessions;  // In listing order; chains not filled.
  bool more = false;                  // Sessions remain after the last one listed.
};

// The longest time a priority may be set for (SetPriority's ttl).
inline constexpr std::chrono::hours kMaxPriorityTtl{24 * 30};

}  // namespace kvtier::tiering
