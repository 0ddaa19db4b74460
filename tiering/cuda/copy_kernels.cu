#include <string>

#include "copy_kernels.h"

namespace kvtier::tiering {
namespace {

constexpr int kThreads = 256;

// grid:  (batch.count) — CTA i copies batch.copies[i]
// block: (kThreads)
// batch: GatherCopyBatch in parameter space; __grid_constant__ keeps it there
//        instead of a per-thread local copy.
__global__ void GatherCopyKernel(const __grid_constant__ GatherCopyBatch batch) {
  const GatherCopy c = batch.copies[blockIdx.x];
  const auto* src = static_cast<const unsigned char*>(c.src);
  auto* dst = static_cast<unsigned char*>(c.dst);
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | c.bytes) & 15) == 0) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = threadIdx.x; i < c.bytes / 16; i += blockDim.x) d[i] = s[i];
    return;
  }
  for (uint64_t i = threadIdx.x; i < c.bytes; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

Status LaunchGatherCopy(const GatherCopyBatch& batch, cudaStream_t stream) {
  if (batch.count == 0 || batch.count > kGatherMaxCopies) {
    return InvalidArgument("gather copy: " + std::to_string(batch.count) + " copies, want 1.." +
                           std::to_string(kGatherMaxCopies));
  }
  if (stream == nullptr) return InvalidArgument("gather copy: needs an explicit stream, not the legacy default");
  for (uint32_t i = 0; i < batch.count; ++i) {
    const GatherCopy& c = batch.copies[i];
    if (c.src == nullptr || c.dst == nullptr || c.bytes == 0) {
      return InvalidArgument("gather copy: copy " + std::to_string(i) + " has a null pointer or no bytes");
    }
  }
  GatherCopyKernel<<<batch.count, kThreads, 0, stream>>>(batch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return Internal(std::string("gather copy launch: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  return Status::Ok();
}

Status LoadGatherKernel() {
  // Asking for the kernel's attributes loads its module (and fails if it cannot be loaded).
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, GatherCopyKernel);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Internal(std::string("loading the gather copy kernel: ") + cudaGetErrorName(err) + ": " +
                    cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace kvtier::tiering
