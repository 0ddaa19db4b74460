// GpuAttachment: kvtierd's GPU pool and events, opened through CUDA IPC.
#include "gpu_attachment.h"

#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

namespace kvtier::client_internal {

Result<std::unique_ptr<GpuAttachment>> GpuAttachment::Open(const GpuPoolHandle& pool,
                                                           std::span<const wire::IpcEventHandle> fence_events) {
  auto driver = CudaDriver::Default();
  if (!driver.ok()) {
    return Status(driver.status().code(), "kvtierd runs the cuda backend, so this client must open its GPU pool: " +
                                              driver.status().message());
  }
  std::unique_ptr<GpuAttachment> gpu(new GpuAttachment());
  const CudaDriver& d = **driver;
  auto dev = d.DeviceByUuid(pool.device_uuid);
  if (!dev.ok()) return dev.status();
  KVTIER_RETURN_IF_ERROR(d.Check(d.cuDevicePrimaryCtxRetain(&gpu->ctx_, *dev), "cuDevicePrimaryCtxRetain"));
  gpu->driver_ = *driver;  // From here on, the destructor undoes what was done.
  gpu->device_ = *dev;
  ScopedContext scope(d, gpu->ctx_);
  if (!scope.ok()) return Internal("cannot make the primary context of " + FormatGpuUuid(pool.device_uuid) + " current");
  CUipcMemHandle mem{};
  std::memcpy(mem.reserved, pool.raw.data(), sizeof(mem.reserved));
  KVTIER_RETURN_IF_ERROR(d.Check(d.cuIpcOpenMemHandle(&gpu->base_, mem, kCuIpcMemLazyEnablePeerAccess),
                                 "opening kvtierd's GPU pool (cuIpcOpenMemHandle on " +
                                     FormatGpuUuid(pool.device_uuid) + ")"));
  for (const wire::IpcEventHandle& h : fence_events) {
    CUipcEventHandle raw{};
    std::memcpy(raw.reserved, h.data(), sizeof(raw.reserved));
    CUevent e = nullptr;
    const Status opened =
        d.Check(d.cuIpcOpenEventHandle(&e, raw), "opening a promotion fence event (cuIpcOpenEventHandle)");
    if (!opened.ok()) {
      // Interprocess events need a shared /dev/shm and the same user and
      // namespaces as kvtierd; without them the fences are still good on the
      // CPU, so the connection goes on with CPU waits instead of failing.
      for (CUevent opened_event : gpu->fence_events_) d.cuEventDestroy(opened_event);
      gpu->fence_events_.clear();
      const std::string line =
          "libkvtier: warning: " + opened.message() + "; Lease::WaitOnStream waits for promotions on the CPU instead\n";
      (void)!::write(STDERR_FILENO, line.data(), line.size());
      break;
    }
    gpu->fence_events_.push_back(e);
  }
  return gpu;
}

GpuAttachment::~GpuAttachment() {
  if (!driver_ || ctx_ == nullptr) return;
  {
    ScopedContext scope(*driver_, ctx_);
    for (auto& w : writer_events_) driver_->cuEventDestroy(w->event);
    for (CUevent e : fence_events_) driver_->cuEventDestroy(e);
    if (base_ != 0) driver_->cuIpcCloseMemHandle(base_);
  }
  driver_->cuDevicePrimaryCtxRelease(device_);
}

std::byte* GpuAttachment::base() const { return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(base_)); }

bool GpuAttachment::HasFenceEvent(const Fence& fence) const {
  return !fence_events_.empty() && fence.stream == CopyDirection::kHostToGpu;
}

Status GpuAttachment::StreamWait(const Fence& fence, CUstream stream) const {
  // The batch of fence seq recorded this event before the fence reached us; if
  // the slot was recorded again since, the wait covers a later batch too.
  ScopedContext scope(*driver_, ctx_);
  const CUevent event = fence_events_[fence.seq % fence_events_.size()];
  return driver_->Check(driver_->cuStreamWaitEvent(stream, event, 0),
                        "cuStreamWaitEvent on promotion fence " + std::to_string(fence.seq));
}

Result<std::shared_ptr<const WriterEvent>> GpuAttachment::TakeWriterEvent(std::shared_ptr<const void> owner) const {
  WriterEvent* w = nullptr;
  {
    std::lock_guard lock(mu_);
    // Only an event whose last record completed: kvtierd may still poll it.
    ScopedContext scope(*driver_, ctx_);
    for (size_t i = free_writer_events_.size(); i > 0; --i) {
      if (driver_->cuEventQuery(free_writer_events_[i - 1]->event) == kCudaSuccess) {
        w = free_writer_events_[i - 1];
        free_writer_events_.erase(free_writer_events_.begin() + static_cast<std::ptrdiff_t>(i - 1));
        break;
      }
    }
  }
  if (w == nullptr) {
    auto made = std::make_unique<WriterEvent>();
    const CudaDriver& d = *driver_;
    ScopedContext scope(d, ctx_);
    KVTIER_RETURN_IF_ERROR(d.Check(d.cuEventCreate(&made->event, kCuEventInterprocess | kCuEventDisableTiming),
                                   "cuEventCreate(interprocess) for a writer event"));
    CUipcEventHandle h{};
    const Status st = d.Check(d.cuIpcGetEventHandle(&h, made->event), "cuIpcGetEventHandle");
    if (!st.ok()) {
      d.cuEventDestroy(made->event);
      return st;
    }
    std::memcpy(made->handle.data(), h.reserved, made->handle.size());
    w = made.get();
    std::lock_guard lock(mu_);
    writer_events_.push_back(std::move(made));
  }
  // The deleter keeps the owner (and so this GpuAttachment) alive.
  return std::shared_ptr<const WriterEvent>(w, [this, owner = std::move(owner)](const WriterEvent* e) {
    std::lock_guard lock(mu_);
    free_writer_events_.push_back(const_cast<WriterEvent*>(e));
  });
}

Status GpuAttachment::SynchronizeContext() const {
  ScopedContext scope(*driver_, ctx_);
  return driver_->Check(driver_->cuCtxSynchronize(), "cuCtxSynchronize before a release or commit without an event");
}

Status GpuAttachment::RecordWriterEvent(const WriterEvent& event, CUstream stream) const {
  ScopedContext scope(*driver_, ctx_);
  return driver_->Check(driver_->cuEventRecord(event.event, stream), "cuEventRecord of the writer event");
}

}  // namespace kvtier::client_internal
