// Attachment: kvtierd's segments as this process maps them for one connection —
// the pools, the block index and the fence segment that come with a Welcome,
// each checked against what the Welcome announced before anything reads it.
//
// Immutable once made and shared (shared_ptr<const Attachment>) by the
// connection that made it and every lease made on that connection, so the
// memory a lease points into stays mapped until the lease goes, whatever
// reconnects happen meanwhile. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "gpu_attachment.h"
#include "kvtier/fence_layout.h"
#include "kvtier/index_layout.h"
#include "kvtier/shm_segment.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "kvtier/wire.h"

namespace kvtier::client_internal {

struct Attachment {
  // Validates `welcome` (backend, pools, profile) and maps the segments it
  // describes from `fds`, the descriptors that came with it (wire.h: the pools
  // without an IPC handle in tier order, the index, the fences; the caller
  // keeps and closes them). The GPU pool of the host backend is mapped
  // writable, everything else read-only. On the cuda backend the GPU pool is
  // opened first, so a worker without a usable driver learns that before
  // anything else. kFailedPrecondition for a backend this client does not
  // know, kProtocolError / kCorrupt for a Welcome or a segment that does not
  // match it. Without `open_gpu` the GPU tier is left unmapped (its descriptor
  // is taken and left to the caller to close; no driver is loaded).
  static Result<std::shared_ptr<const Attachment>> Map(wire::Welcome welcome, std::span<const int> fds,
                                                       bool open_gpu = true);

  // The pool of `tier` as the Welcome describes it.
  const wire::PoolDesc& pool(Tier tier) const { return welcome.pools[TierIndex(tier)]; }
  // Slot `slot` of `tier`'s pool in this process (a device address for the GPU
  // pool on the cuda backend; null for the GPU tier when it was not opened).
  // REQUIRES: slot < pool(tier).slots.
  std::byte* SlotData(Tier tier, uint32_t slot) const;
  // The GPU tier was mapped (Map's open_gpu).
  bool gpu_open = false;
  // The last completed sequence number of copy stream `stream`.
  uint64_t Completed(CopyDirection stream) const;
  // Waits on the CPU until `fence` (of this connection) has completed;
  // kTimeout after `timeout`.
  Status WaitCompleted(const Fence& fence, std::chrono::milliseconds timeout) const;

  wire::Welcome welcome;  // Pools in tier order, one per tier (checked).
  ShmSegment index_segment;
  PerTier<ShmSegment> pools;  // The GPU tier's stays empty on the cuda backend.
  ShmSegment fence_segment;
  IndexView index;
  const FenceSegment* fences = nullptr;
  std::unique_ptr<GpuAttachment> gpu;  // Cuda backend only.
};

}  // namespace kvtier::client_internal
