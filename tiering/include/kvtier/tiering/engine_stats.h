// An Engine's figures (engine.h): its counters and gauges, a tenant's usage,
// and what a warm restart's save and adoption did.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kvtier/tier.h"

namespace kvtier::tiering {

// Blocks a tenant holds per tier (a block in flight counts in its
// destination), its sessions, and its GPU slots in write leases: its GPU quota
// counts blocks[kGpu] + leased.
struct TenantUsage {
  PerTier<uint32_t> blocks;
  uint32_t leased = 0;  // GPU slots in its write leases, not yet committed.
  uint32_t sessions = 0;
};

struct EngineStats {
  PerTier<uint32_t> slots;
  PerTier<uint32_t> used;
  uint32_t blocks = 0;
  uint32_t sessions = 0;
  uint32_t read_leases = 0;
  uint32_t write_leases = 0;
  uint32_t leased_slots = 0;     // GPU slots in write leases (part of used[kGpu]).
  uint64_t oldest_lease_ms = 0;  // Age of the oldest lease held; 0 when none is.
  uint32_t copies_in_flight = 0;
  uint64_t hit_blocks = 0;
  PerTier<uint64_t> hit_blocks_in;  // Of hit_blocks, where Acquire found each (a moving block: its source tier).
  uint64_t miss_blocks = 0;
  uint64_t prefix_walks = 0;  // Walks of a prefix through the index (Match, AcquireNeedsRoom, Acquire).
  uint64_t committed_blocks = 0;
  uint64_t duplicate_blocks = 0;
  uint64_t demoted_blocks = 0;   // Copies gpu->host completed.
  uint64_t promoted_blocks = 0;  // Copies host->gpu completed.
  uint64_t dropped_blocks = 0;   // Lost to pressure.
  uint64_t evicted_sessions = 0;
  uint64_t ended_sessions = 0;  // EndSession calls that found their session (kept or removed).
  uint64_t allocation_failures = 0;
  // Operations a tenant's fair share of the GPU tier limited while another
  // waited (EngineOptions::gpu_share_window): Allocates refused, Acquires whose
  // lease stopped before blocks past the share or that did not promote.
  uint64_t share_limited = 0;
  uint64_t expired_priorities = 0;  // Priorities set back to 0 when their TTL ran out.
  uint64_t expired_write_leases = 0;  // Revoked by the lease timeout.
  uint64_t expired_read_leases = 0;
  uint32_t gpu_work_pending = 0;           // Released leases and commits waiting for a client's GPU work.
  uint64_t expired_gpu_work = 0;           // Given back unfinished after the lease timeout.
  uint64_t unfinished_writes_dropped = 0;  // Blocks dropped: their writer went away (or failed) mid-write.
  uint64_t imported_blocks = 0;            // Placed in the host tier from a store (Acquire's FetchedBlocks).
  uint64_t spilled_blocks = 0;             // Offered to on_spill (landed or dropped).
  uint64_t after_read_promotions = 0;      // Host-tier blocks promoted once a PromoteOnRelease lease ended.
  uint64_t after_read_given_up = 0;        // Such blocks left in the host tier: no GPU room came in time.
  uint64_t warm_adopted_blocks = 0;  // Host blocks taken over from the previous run.
  uint64_t warm_dropped_blocks = 0;  // Blocks the previous run's manifest listed that failed a check.
  uint64_t warm_adopted_sessions = 0;
  uint64_t warm_snapshots = 0;       // Manifests written (SaveWarm).
};

// What AdoptWarm found and did.
struct WarmAdoptReport {
  bool found = false;       // A manifest segment existed.
  bool compatible = false;  // It decoded and matched this engine (format, profile, host pool geometry).
  bool clean = false;       // It was written at a clean shutdown, not by a periodic snapshot.
  std::string reason;       // Why a found manifest was rejected whole (then it was removed).
  uint32_t listed_blocks = 0;
  uint32_t adopted_blocks = 0;
  uint32_t dropped_blocks = 0;  // listed - adopted.
  uint32_t adopted_sessions = 0;
  uint32_t dropped_sessions = 0;
  std::chrono::microseconds took{0};
};

struct WarmSaveReport {
  uint32_t blocks = 0;
  uint32_t sessions = 0;
  uint32_t checksummed = 0;  // Payload checksums computed now (the rest were cached).
  uint64_t bytes = 0;
  std::chrono::microseconds took{0};
};

}  // namespace kvtier::tiering
