// The CUDA backend's pools and error helpers (cuda_pools.h).
#include "cuda_pools.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace kvtier::tiering::cuda {

std::string CudaErrorText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, what + ": " + CudaErrorText(err));
}

GpuPool::~GpuPool() {
  cudaSetDevice(device_);
  cudaFree(base());
}

PoolHandle GpuPool::Export() const {
  PoolHandle h = BaseHandle(BackendKind::kCuda);
  h.ipc_handle = EncodeGpuPoolHandle(handle_);
  return h;
}

PinnedHostPool::~PinnedHostPool() {
  for (std::byte* chunk : chunks_) cudaHostUnregister(chunk);
}

Status PinnedHostPool::Pin(size_t chunk_bytes, const CudaBackendOptions& options, const std::string& name) {
  // Chunks end on page boundaries: two registrations must not share a page.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t step = page / std::gcd(slot_bytes(), page);  // Fewest slots filling whole pages.
  const size_t want = std::max(step, chunk_bytes / slot_bytes() / step * step);
  chunk_slots_ = static_cast<uint32_t>(std::min<size_t>(want, slots()));
  const size_t total = slot_bytes() * slots();
  for (uint32_t first = 0; first < slots(); first += chunk_slots_) {
    const size_t bytes = size_t{std::min(chunk_slots_, slots() - first)} * slot_bytes();
    std::byte* chunk = slot_data(first);
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaHostRegister(chunk, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                                      "pool '" + name + "': cudaHostRegister of " + std::to_string(bytes) +
                                          " bytes (is RLIMIT_MEMLOCK high enough?)"));
    chunks_.push_back(chunk);
    if (options.pin_progress) options.pin_progress(name, size_t{first} * slot_bytes() + bytes, total);
  }
  return Status::Ok();
}

PoolHandle PinnedHostPool::Export() const {
  PoolHandle h = BaseHandle(BackendKind::kCuda);
  h.shm_name = segment_.name();
  h.fd = segment_.share_fd();
  return h;
}

}  // namespace kvtier::tiering::cuda
