// The gather/scatter copy kernel: one launch moves a batch of small blocks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvtier/status.h"

namespace kvtier::tiering {

// The batch travels as the kernel's parameter (up to 32 KiB on sm_70+ since
// CUDA 12.1), sized to the batch (8, 64 or 1024 copies): nothing to allocate,
// stage or keep alive until the launch completes.
inline constexpr uint32_t kGatherMaxCopies = 1024;

struct GatherCopy {
  const void* src;  // Device-accessible: device memory or mapped pinned host memory.
  void* dst;        // Likewise; never overlapping any src or dst of the batch.
  uint64_t bytes;
};

// Host-side scratch a batch is gathered into before its launch.
struct GatherCopyBatch {
  uint32_t count;                       // 1..kGatherMaxCopies
  GatherCopy copies[kGatherMaxCopies];  // [count] used
};

// Queues the copies on `stream` (one CTA per copy, 16-byte accesses where src, dst
// and bytes are 16-byte aligned, four in flight per thread). kInvalidArgument for a bad batch; kInternal
// if the launch fails. Returns once queued, not once copied.
Status LaunchGatherCopy(const GatherCopyBatch& batch, cudaStream_t stream);

// Loads the kernel's module into the current context now (with lazy loading,
// CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2, it would load at the
// first launch, which may synchronize the context). kInternal if it cannot.
Status LoadGatherKernel();

}  // namespace kvtier::tiering
