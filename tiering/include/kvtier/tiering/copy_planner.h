// CopyPlanner: turns one SubmitCopies batch into the submissions a GPU backend
// issues. Pure C++ (no CUDA), so it is tested everywhere.
//
// Small blocks go to one gather/scatter kernel launch per submission: a copy
// engine pays a fixed cost per memcpy that dwarfs a few KiB. Large blocks go to
// the copy engines (cudaMemcpyBatchAsync or one cudaMemcpyAsync each), which
// run at full PCIe speed without taking SMs from the model. Slots adjacent on
// both sides are coalesced into one copy first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

enum class CopyPath : uint8_t { kKernel, kMemcpy };

struct CopyPlannerOptions {
  size_t memcpy_min_block_bytes = size_t{64} << 10;  // slot_bytes >= this: copy engines; below: the kernel.
  size_t max_copies_per_submission = 1024;           // Cap per kernel launch / batched memcpy call.
  size_t kernel_max_copy_bytes = size_t{64} << 10;   // Kernel path: coalesced runs stop here (one CTA each).
  // Slots per separately pinned host chunk (0: one range). A run never crosses a
  // multiple of it: one memcpy must not span two cudaHostRegister ranges.
  uint32_t chunk_slots = 0;
};

// Byte offsets from the source and destination pool bases.
struct PlannedCopy {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;
  friend bool operator==(const PlannedCopy&, const PlannedCopy&) = default;
};

struct CopyPlan {
  CopyPath path = CopyPath::kMemcpy;
  std::vector<std::vector<PlannedCopy>> submissions;  // Each non-empty, at most max_copies_per_submission.
  size_t blocks = 0;                                  // Ops planned (before coalescing).
};

// What is known about cudaMemcpyBatchAsync on this machine.
struct BatchedMemcpySupport {
  bool toolkit = false;     // Built against a CUDA 13 runtime (the call's signature).
  bool driver = false;      // The driver exports cuMemcpyBatchAsync (12.8 or later).
  std::string probe_error;  // Empty: a probe batch each way at start copied the right bytes.
};
// Whether large-block copies go through cudaMemcpyBatchAsync (else one
// cudaMemcpyAsync per copy), and a sentence saying why, for the log.
struct BatchedMemcpyChoice {
  bool batched = false;
  std::string why;
};
BatchedMemcpyChoice ChooseBatchedMemcpy(const BatchedMemcpySupport& support);

// REQUIRES: slot_bytes > 0; max_copies_per_submission > 0. Ops may come in any
// order; the plan orders copies by source slot (a batch has no internal order).
CopyPlan PlanCopies(std::span<const CopyOp> ops, size_t slot_bytes, const CopyPlannerOptions& options);

}  // namespace kvtier::tiering
