// HostBackend: the backend used wherever there is no GPU.
//
// Both tiers are sealed shared-memory segments (so other processes can map them
// from a descriptor the daemon passes), one copy thread plays the DMA engine,
// and fences are per-stream sequence numbers, published in a shared segment
// clients map read-only. Promotions (host->gpu) are served before
// demotions (gpu->host), as on a GPU with a high-priority copy stream.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

struct HostBackendOptions {
  // Prefix of every segment's label ("<prefix>.<pool>"), and of the name of a
  // persistent pool ("/<prefix>.<pool>"). Must be unique per instance.
  std::string name_prefix = "kvtier";
  bool populate = true;          // Fault pool pages in from creation on, on a thread (the pool is usable at once).
};

Result<std::unique_ptr<Backend>> CreateHostBackend(const HostBackendOptions& options);

}  // namespace kvtier::tiering
