// SessionSummary: one session as kvtierd reports it, in its replies
// (wire::ListSessionsResponse, wire::SessionInfoResponse) and through
// libkvtier's API (Client::ListSessions, GetSession): one definition for both.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier {

struct SessionSummary {
  std::string id;
  std::string tenant;
  int32_t priority = 0;
  uint64_t last_use_ms_ago = 0;
  uint32_t blocks = 0;
  uint32_t gpu_blocks = 0;
  uint32_t host_blocks = 0;
  uint32_t moving = 0;  // Blocks with a copy in flight.
  uint64_t tokens = 0;
  ModelId model;  // The identity its blocks were keyed with (null: none).
  friend bool operator==(const SessionSummary&, const SessionSummary&) = default;
};

}  // namespace kvtier
