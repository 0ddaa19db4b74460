// CopyPlanner: one SubmitCopies batch as the submissions a GPU backend issues (copy_planner.h).
#include "kvtier/tiering/copy_planner.h"

#include <algorithm>
#include <cstdint>

namespace kvtier::tiering {

BatchedMemcpyChoice ChooseBatchedMemcpy(const BatchedMemcpySupport& s) {
  if (!s.toolkit) return {false, "per-copy cudaMemcpyAsync: built against a CUDA runtime older than 13"};
  if (!s.driver) {
    return {false, "per-copy cudaMemcpyAsync: the driver has no cuMemcpyBatchAsync (it needs 12.8 or later)"};
  }
  if (!s.probe_error.empty()) {
    return {false,
            "per-copy cudaMemcpyAsync: a probe batch of cudaMemcpyBatchAsync at start failed (" + s.probe_error + ")"};
  }
  return {true, "cudaMemcpyBatchAsync (a probe batch each way copied correctly at start)"};
}

CopyPlan PlanCopies(std::span<const CopyOp> ops, size_t slot_bytes, const CopyPlannerOptions& options) {
  CopyPlan plan;
  plan.path = slot_bytes >= options.memcpy_min_block_bytes ? CopyPath::kMemcpy : CopyPath::kKernel;
  plan.blocks = ops.size();

  std::vector<CopyOp> sorted(ops.begin(), ops.end());
  std::sort(sorted.begin(), sorted.end(), [](const CopyOp& a, const CopyOp& b) {
    return a.src_slot != b.src_slot ? a.src_slot < b.src_slot : a.dst_slot < b.dst_slot;
  });
  const size_t max_run_slots =
      plan.path == CopyPath::kKernel ? std::max<size_t>(1, options.kernel_max_copy_bytes / slot_bytes) : SIZE_MAX;
  const auto chunk_start = [&](uint32_t slot) { return options.chunk_slots != 0 && slot % options.chunk_slots == 0; };

  std::vector<PlannedCopy> copies;
  size_t i = 0;
  while (i < sorted.size()) {
    size_t run = 1;
    while (i + run < sorted.size() && run < max_run_slots) {
      const CopyOp& next = sorted[i + run];
      if (next.src_slot != sorted[i].src_slot + run || next.dst_slot != sorted[i].dst_slot + run) break;
      if (chunk_start(next.src_slot) || chunk_start(next.dst_slot)) break;
      ++run;
    }
    copies.push_back(
        {uint64_t{sorted[i].src_slot} * slot_bytes, uint64_t{sorted[i].dst_slot} * slot_bytes, run * slot_bytes});
    i += run;
  }

  for (size_t at = 0; at < copies.size(); at += options.max_copies_per_submission) {
    const size_t end = std::min(copies.size(), at + options.max_copies_per_submission);
    plan.submissions.emplace_back(copies.begin() + at, copies.begin() + end);
  }
  return plan;
}

}  // namespace kvtier::tiering
