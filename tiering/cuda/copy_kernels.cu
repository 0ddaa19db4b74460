#include <string>

#include "copy_kernels.h"

namespace kvtier::tiering {
namespace {

constexpr int kThreads = 256;
// 16-byte loads each thread keeps in flight: reads of mapped host memory cross
// PCIe, and one load at a time per thread leaves the link idle between them.
constexpr int kUnroll = 4;

// The batch as the kernel's parameter, sized to it: a launch ships
// 8 + 24 * Cap bytes, not the whole 24 KiB of the largest batch.
template <uint32_t Cap>
struct GatherParams {
  uint32_t count;
  GatherCopy copies[Cap];
};
static_assert(sizeof(GatherParams<kGatherMaxCopies>) <= 32764, "kernel parameter limit");
constexpr uint32_t kSmallBatch = 8;
constexpr uint32_t kMediumBatch = 64;

__device__ void CopyOne(const GatherCopy& c) {
  const auto* src = static_cast<const unsigned char*>(c.src);
  auto* dst = static_cast<unsigned char*>(c.dst);
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | c.bytes) & 15) == 0) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    const uint64_t n = c.bytes / 16;
    const uint64_t stride = blockDim.x;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * stride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d[i + u * stride] = v[u];
    }
    for (; i < n; i += stride) d[i] = s[i];
    return;
  }
  for (uint64_t i = threadIdx.x; i < c.bytes; i += blockDim.x) dst[i] = src[i];
}

// grid:  (params.count) — CTA i copies params.copies[i]
// block: (kThreads)
// params: in parameter space; __grid_constant__ keeps it there instead of a
//         per-thread local copy.
template <uint32_t Cap>
__global__ void GatherCopyKernel(const __grid_constant__ GatherParams<Cap> params) {
  CopyOne(params.copies[blockIdx.x]);
}

template <uint32_t Cap>
cudaError_t Launch(const GatherCopyBatch& batch, cudaStream_t stream) {
  GatherParams<Cap> params{};
  params.count = batch.count;
  for (uint32_t i = 0; i < batch.count; ++i) params.copies[i] = batch.copies[i];
  GatherCopyKernel<Cap><<<batch.count, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

template <uint32_t Cap>
cudaError_t Load() {
  // Asking for the kernel's attributes loads its module (and fails if it cannot be loaded).
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, GatherCopyKernel<Cap>);
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
  const cudaError_t err = batch.count <= kSmallBatch    ? Launch<kSmallBatch>(batch, stream)
                          : batch.count <= kMediumBatch ? Launch<kMediumBatch>(batch, stream)
                                                        : Launch<kGatherMaxCopies>(batch, stream);
  if (err != cudaSuccess) {
    return Internal(std::string("gather copy launch: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  return Status::Ok();
}

Status LoadGatherKernel() {
  for (const cudaError_t err : {Load<kSmallBatch>(), Load<kMediumBatch>(), Load<kGatherMaxCopies>()}) {
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Internal(std::string("loading the gather copy kernel: ") + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err));
    }
  }
  return Status::Ok();
}

}  // namespace kvtier::tiering
