// The CUDA backend's pools (cuda_backend.h) and its CUDA error helpers: the GPU
// tier, one cudaMalloc exported over CUDA IPC; the host tier, a shared-memory
// segment pinned in place. Internal to kvtier::cuda_backend.
//
// Thread-safety: a pool is pinned once, on the creating thread, before it is
// shared; after that it is only read until destroyed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/gpu_pool_handle.h"
#include "kvtier/shm_segment.h"
#include "kvtier/status.h"
#include "kvtier/tiering/backend.h"
#include "kvtier/tiering/cuda_backend.h"

namespace kvtier::tiering::cuda {

// "cudaErrorX: text".
std::string CudaErrorText(cudaError_t err);

// Ok for cudaSuccess; else kResourceExhausted for an allocation failure,
// kInternal otherwise, with `what` and the error's text.
Status CudaStatus(cudaError_t err, const std::string& what);

class GpuPool final : public Pool {
 public:
  GpuPool(const PoolSpec& spec, int device, std::byte* base, const GpuPoolHandle& handle)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, base), device_(device), handle_(handle) {}
  ~GpuPool() override;

  PoolHandle Export() const override;

 private:
  int device_;
  GpuPoolHandle handle_;
};

// A shared-memory segment pinned in chunks of `chunk_slots` slots.
class PinnedHostPool final : public Pool {
 public:
  PinnedHostPool(const PoolSpec& spec, ShmSegment segment)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, segment.data()), segment_(std::move(segment)) {}
  ~PinnedHostPool() override;

  Status Pin(size_t chunk_bytes, const CudaBackendOptions& options, const std::string& name);

  uint32_t chunk_slots() const { return chunk_slots_; }

  PoolHandle Export() const override;

 private:
  ShmSegment segment_;
  uint32_t chunk_slots_ = 0;
  std::vector<std::byte*> chunks_;  // Registered ranges, unregistered on destruction.
};

}  // namespace kvtier::tiering::cuda
