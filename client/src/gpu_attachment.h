// GpuAttachment: the GPU side of a connection to a cuda-backend kvtierd — its
// GPU pool opened through CUDA IPC, its promotion fence events, and this
// process's interprocess writer events — all in the primary context of the
// device that holds the pool.
//
// Opened once per connection (each IPC open costs milliseconds, so never on the
// request path) and closed when the last lease of that connection goes.
// Thread-safe: the writer-event pool has its own mutex; everything else is
// fixed at Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "cuda_driver.h"
#include "kvtier/fence_layout.h"
#include "kvtier/gpu_pool_handle.h"
#include "kvtier/status.h"
#include "kvtier/wire.h"

namespace kvtier::client_internal {

// An interprocess event a worker records after its GPU work on leased blocks
// or slots (a writer event at commit, an event at release). Pooled: one is
// handed out again only once its last record completed, since kvtierd polls
// the latest record of an event and must never see a later, shorter work in
// place of the one it waits for.
struct WriterEvent {
  CUevent event = nullptr;
  wire::IpcEventHandle handle{};  // What a Commit sends.
};

class GpuAttachment {
 public:
  // Loads the driver, retains the primary context of the device whose UUID
  // `pool` names, opens the pool and every event of `fence_events`. The error
  // says that kvtierd runs the cuda backend when the driver cannot be loaded.
  static Result<std::unique_ptr<GpuAttachment>> Open(const GpuPoolHandle& pool,
                                                     std::span<const wire::IpcEventHandle> fence_events);
  ~GpuAttachment();
  GpuAttachment(const GpuAttachment&) = delete;
  GpuAttachment& operator=(const GpuAttachment&) = delete;

  // The GPU pool's first byte, as a device address of this process.
  std::byte* base() const;

  // Makes work queued on `stream` wait for the promotion batch of `fence`.
  // REQUIRES: HasFenceEvent(fence).
  Status StreamWait(const Fence& fence, CUstream stream) const;
  // Whether a GPU-side wait exists for `fence` (promotions only, and only
  // when kvtierd announced fence events).
  bool HasFenceEvent(const Fence& fence) const;

  // A pooled interprocess writer event, handed back to the pool when the
  // returned pointer and its copies are gone. The pointer keeps `owner` (the
  // object that owns this GpuAttachment) alive.
  Result<std::shared_ptr<const WriterEvent>> TakeWriterEvent(std::shared_ptr<const void> owner) const;
  // Records `event` on `stream`.
  Status RecordWriterEvent(const WriterEvent& event, CUstream stream) const;
  // Waits for every piece of work of this process in the primary context:
  // what a release or commit without an event costs, so that kvtierd never
  // reuses a slot or moves a block this process's GPU still uses.
  Status SynchronizeContext() const;

 private:
  GpuAttachment() = default;

  std::shared_ptr<const CudaDriver> driver_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;  // Retained primary context.
  CUdeviceptr base_ = 0;     // The GPU pool, mapped.
  std::vector<CUevent> fence_events_;
  mutable std::mutex mu_;
  mutable std::vector<WriterEvent*> free_writer_events_;             // GUARDED_BY(mu_)
  mutable std::vector<std::unique_ptr<WriterEvent>> writer_events_;  // GUARDED_BY(mu_); all ever made
};

}  // namespace kvtier::client_internal
