// The CUDA backend's copies: submission through the gather kernel or the copy
// engines, completion events and the completion threads (cuda_backend_impl.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "copy_kernels.h"
#include "kvtier/tiering/copy_planner.h"
#include "cuda_backend_impl.h"
#include "cuda_pools.h"

namespace kvtier::tiering::cuda {

Result<Fence> CudaBackendImpl::SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst,
                                            std::span<const CopyOp> ops) {
  if (src.slot_bytes() != dst.slot_bytes()) return InvalidArgument("copy between pools of different slot sizes");
  const Tier want_src = dir == CopyDirection::kGpuToHost ? Tier::kGpu : Tier::kHost;
  if (src.tier() != want_src || dst.tier() == want_src)
    return InvalidArgument("copy direction does not match the pools' tiers");
  for (const CopyOp& op : ops) {
    if (op.src_slot >= src.slots() || op.dst_slot >= dst.slots()) return InvalidArgument("copy op slot out of range");
  }
  const auto* host = dynamic_cast<const PinnedHostPool*>(dir == CopyDirection::kGpuToHost ? &dst : &src);
  if (host == nullptr) return InvalidArgument("copy with a host pool not created by this cuda backend");
  KVTIER_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice"));

  CopyPlannerOptions po = planner_;
  po.chunk_slots = host->chunk_slots();
  const CopyPlan plan = PlanCopies(ops, src.slot_bytes(), po);
  const int s = static_cast<int>(dir);
  const Clock::time_point now = Clock::now();
  uint64_t seq = 0;
  {
    std::lock_guard lock(mu_);
    seq = submitted_[s] + 1;  // Only this (the submitting) thread advances it.
  }
  for (const std::vector<PlannedCopy>& sub : plan.submissions) {
    const Status queued = plan.path == CopyPath::kKernel ? Gather(sub, src, dst, s) : Memcpy(sub, src, dst, s);
    if (!queued.ok()) {
      // The engine frees this batch's slots on an error: the submissions
      // already queued must have finished with them first.
      const cudaError_t drained = cudaStreamSynchronize(streams_[s]);
      if (drained != cudaSuccess) {
        return Status(queued.code(), queued.message() + "; and the stream did not drain (" + CudaErrorText(drained) +
                                         "): the CUDA context may be unusable");
      }
      return queued;
    }
  }
  if (dir == CopyDirection::kHostToGpu) {
    // Recorded before the fence is handed out: a client waiting on this slot
    // waits for this batch, or for a later one if the slot was recorded again.
    KVTIER_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(fence_events_[seq % kFenceEventRing], streams_[s]), "cudaEventRecord"));
  }
  auto done_event = CompletionEvent(s);
  if (!done_event.ok()) return done_event.status();
  if (const cudaError_t err = cudaEventRecord(*done_event, streams_[s]); err != cudaSuccess) {
    std::lock_guard lock(completers_[s].mu);
    completers_[s].spare.push_back(*done_event);
    return CudaStatus(err, "cudaEventRecord (batch completion)");
  }
  {
    std::lock_guard lock(mu_);
    submitted_[s] = seq;
  }
  board_->Submitted(s, seq);
  {
    std::lock_guard lock(completers_[s].mu);
    completers_[s].queue.push_back(BatchDone{*done_event, seq, ops.size(), ops.size() * src.slot_bytes(), now});
  }
  completers_[s].cv.notify_one();
  return Fence{seq, dir};
}

Status CudaBackendImpl::Gather(const std::vector<PlannedCopy>& sub, const Pool& src, const Pool& dst, int s) {
  gather_.count = static_cast<uint32_t>(sub.size());
  for (size_t i = 0; i < sub.size(); ++i) {
    gather_.copies[i] = GatherCopy{src.base() + sub[i].src_offset, dst.base() + sub[i].dst_offset, sub[i].bytes};
  }
  return LaunchGatherCopy(gather_, streams_[s]);
}

Status CudaBackendImpl::Memcpy(const std::vector<PlannedCopy>& sub, const Pool& src, const Pool& dst, int s) {
#if CUDART_VERSION >= 13000
  if (batched_) {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    for (const PlannedCopy& c : sub) {
      dsts_.push_back(dst.base() + c.dst_offset);
      srcs_.push_back(src.base() + c.src_offset);
      sizes_.push_back(c.bytes);
    }
    size_t attr_index = 0;
    const cudaError_t err = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), sub.size(),
                                                 &batch_attrs_[s], &attr_index, 1, streams_[s]);
    if (err == cudaSuccess) return Status::Ok();
    // Refused (nothing was queued): per-copy memcpy from now on. A failed
    // context fails the per-copy calls too, and Health reports it.
    cudaGetLastError();
    batched_ = false;
    batch_why_ = "per-copy cudaMemcpyAsync: cudaMemcpyBatchAsync refused a batch of " + std::to_string(sub.size()) +
                 " copies while serving (" + CudaErrorText(err) + ")";
    if (options_.warn) options_.warn("cuda backend: " + batch_why_);
  }
#endif
  for (const PlannedCopy& c : sub) {
    KVTIER_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(dst.base() + c.dst_offset, src.base() + c.src_offset, c.bytes, cudaMemcpyDefault, streams_[s]),
        "cudaMemcpyAsync"));
  }
  return Status::Ok();
}

Result<cudaEvent_t> CudaBackendImpl::CompletionEvent(int s) {
  {
    std::lock_guard lock(completers_[s].mu);
    if (!completers_[s].spare.empty()) {
      const cudaEvent_t e = completers_[s].spare.back();
      completers_[s].spare.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  KVTIER_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, cudaEventBlockingSync | cudaEventDisableTiming),
                                    "cudaEventCreateWithFlags (batch completion)"));
  return e;
}

void CudaBackendImpl::CompleteBatches(int s) {
  Completer& c = completers_[s];
  cudaSetDevice(options_.device);
  std::unique_lock lock(c.mu);
  for (;;) {
    c.cv.wait(lock, [&] { return c.stop || !c.queue.empty(); });
    if (c.queue.empty()) return;  // Stopping, and nothing left.
    const BatchDone done = c.queue.front();
    lock.unlock();
    const cudaError_t err = cudaEventSynchronize(done.event);
    if (err != cudaSuccess) {
      // The context failed: no batch completes any more (Health says so and
      // kvtierd exits). Wait for the destructor.
      lock.lock();
      c.cv.wait(lock, [&] { return c.stop; });
      return;
    }
    Complete(s, done);
    lock.lock();
    c.queue.pop_front();
    c.spare.push_back(done.event);
  }
}

void CudaBackendImpl::Complete(int stream, const BatchDone& done) {
  const Clock::time_point now = Clock::now();
  Clock::time_point start;
  {
    std::lock_guard lock(mu_);
    // Busy time starts when the batch could start: at submission, or when the
    // stream's previous batch finished, whichever is later.
    start = std::max(done.submitted, last_done_[stream]);
    last_done_[stream] = now;
  }
  board_->Completed(stream, done.seq, done.blocks, done.bytes, std::chrono::duration<double>(now - start).count());
}

}  // namespace kvtier::tiering::cuda
