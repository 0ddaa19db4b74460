// HostBackend: the backend used wherever there is no GPU.
//
// Both tiers are POSIX shared-memory segments (so other processes can map them),
// one copy thread plays the DMA engine, and fences are per-stream sequence
// numbers in a shared segment. Promotions (host->gpu) are served before
// demotions (gpu->host), as on a GPU with a high-priority copy stream.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

struct HostBackendOptions {
  // Prefix of every segment name: "/<prefix>.<pool>". Must be unique per instance.
  std::string name_prefix = "kvtier";
  bool populate = true;          // Pre-fault pool pages at creation.
  bool replace_stale = true;     // Replace segments left by a crashed instance.
  mode_t segment_mode = 0600;    // Every segment's mode and group (-1: the creator's), umask-independent.
  gid_t segment_group = static_cast<gid_t>(-1);
};

Result<std::unique_ptr<Backend>> CreateHostBackend(const HostBackendOptions& options);

}  // namespace kvtier::tiering
