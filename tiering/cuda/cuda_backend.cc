// The CUDA backend's lifecycle: creation, Init, Describe, pools and health (cuda_backend_impl.h).
#include "kvtier/tiering/cuda_backend.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "copy_kernels.h"
#include "kvtier/tiering/copy_planner.h"
#include "cuda_backend_impl.h"
#include "cuda_pools.h"
#include "kvtier/gpu_pool_handle.h"
#include "kvtier/shm_names.h"
#include "kvtier/shm_segment.h"

namespace kvtier::tiering {
namespace cuda {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == wire::kIpcEventHandleBytes);
static_assert(sizeof(cudaUUID_t) == kGpuUuidBytes);
static_assert(kFenceEventRing <= wire::kMaxFenceEvents);

CudaBackendImpl::~CudaBackendImpl() {
  cudaSetDevice(options_.device);
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  // Every batch has completed: the threads finish their queues and stop.
  for (Completer& c : completers_) {
    {
      std::lock_guard lock(c.mu);
      c.stop = true;
    }
    c.cv.notify_all();
    if (c.thread.joinable()) c.thread.join();
    for (const BatchDone& b : c.queue) cudaEventDestroy(b.event);
    for (cudaEvent_t e : c.spare) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : fence_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (auto& [key, opened] : client_events_) cudaEventDestroy(opened.event);
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
}

Status CudaBackendImpl::Init() {
  KVTIER_RETURN_IF_ERROR(Usable(cudaSetDevice(options_.device), "cudaSetDevice"));
  KVTIER_RETURN_IF_ERROR(Usable(cudaGetDeviceProperties(&prop_, options_.device), "cudaGetDeviceProperties"));
  if (!prop_.unifiedAddressing) return Unavailable("cuda backend: device has no unified addressing");
  int host_ptr_ok = 0;
  KVTIER_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetAttribute(&host_ptr_ok, cudaDevAttrCanUseHostPointerForRegisteredMem, options_.device),
                 "cudaDeviceGetAttribute"));
  // The kernel reads pinned host memory through its host address; without that,
  // every block size goes to the copy engines.
  if (!host_ptr_ok) planner_.memcpy_min_block_bytes = 0;

  int least = 0;
  int greatest = 0;
  KVTIER_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities"));
  priority_[static_cast<int>(CopyDirection::kHostToGpu)] = greatest;
  priority_[static_cast<int>(CopyDirection::kGpuToHost)] = least;
  for (int s = 0; s < kCopyStreams; ++s) {
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithPriority(&streams_[s], cudaStreamNonBlocking, priority_[s]),
                                      "cudaStreamCreateWithPriority"));
  }
  for (int s = 0; s < kCopyStreams; ++s) completers_[s].thread = std::thread([this, s] { CompleteBatches(s); });
  // Loaded now, not at the first batch: under lazy module loading a first
  // launch may synchronize the context, which must not happen while copies
  // are queued on the streams.
  KVTIER_RETURN_IF_ERROR(LoadGatherKernel());
  for (size_t i = 0; i < kFenceEventRing; ++i) {
    KVTIER_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&fence_events_[i], cudaEventInterprocess | cudaEventDisableTiming),
                   "cudaEventCreateWithFlags(interprocess)"));
    cudaIpcEventHandle_t raw;
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaIpcGetEventHandle(&raw, fence_events_[i]), "cudaIpcGetEventHandle"));
    std::memcpy(fence_handles_[i].data(), &raw, sizeof(raw));
  }

  BatchedMemcpySupport support;
#if CUDART_VERSION >= 13000  // The call's 12.8 signature differs; older toolkits lack it.
  support.toolkit = true;
  // cudaMemcpyBatchAsync needs a 12.8 driver; ask the driver, not the toolkit.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  support.driver =
      cudaGetDriverEntryPointByVersion("cuMemcpyBatchAsync", &fn, 12080, cudaEnableDefault, &found) == cudaSuccess &&
      found == cudaDriverEntryPointSuccess && fn != nullptr;
  cudaGetLastError();  // A failed lookup is not an error of later calls.
  for (int s = 0; s < kCopyStreams; ++s) {
    // Hints name each side's memory; the host pool is pinned, not CUDA-allocated.
    cudaMemLocation device{};
    device.type = cudaMemLocationTypeDevice;
    device.id = options_.device;
    cudaMemLocation host{};
    host.type = cudaMemLocationTypeHost;
    const bool h2d = s == static_cast<int>(CopyDirection::kHostToGpu);
    batch_attrs_[s] = cudaMemcpyAttributes{};
    batch_attrs_[s].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    batch_attrs_[s].srcLocHint = h2d ? host : device;
    batch_attrs_[s].dstLocHint = h2d ? device : host;
  }
  if (support.driver) support.probe_error = ProbeBatchedMemcpy();
#endif
  const BatchedMemcpyChoice choice = ChooseBatchedMemcpy(support);
  batched_ = choice.batched;
  batch_why_ = choice.why;

  auto fences = ShmSegment::CreateSealed(shm_names::Fences(options_.name_prefix).substr(1), sizeof(FenceSegment),
                                         ShmSegment::Sharing::kReadOnly, /*populate=*/true);
  if (!fences.ok()) return fences.status();
  board_.emplace(std::move(fences).value());
  return Status::Ok();
}

std::string CudaBackendImpl::Describe() const {
  return "cuda (device " + std::to_string(options_.device) + ": " + prop_.name + ", sm_" + std::to_string(prop_.major) +
         std::to_string(prop_.minor) + ", promotions at stream priority " +
         std::to_string(priority_[static_cast<int>(CopyDirection::kHostToGpu)]) + ", " + batch_why_ +
         (planner_.memcpy_min_block_bytes == 0
              ? " for every block size (no device access to host addresses)"
              : " for blocks >= " + std::to_string(planner_.memcpy_min_block_bytes >> 10) +
                    " KiB, gather kernel below") +
         ", sealed segments " + options_.name_prefix + ".*)";
}

Result<std::unique_ptr<Pool>> CudaBackendImpl::CreatePool(const PoolSpec& spec) {
  if (spec.slot_bytes == 0 || spec.slots == 0) {
    return InvalidArgument("pool '" + spec.name + "' needs slot_bytes > 0 and slots > 0");
  }
  KVTIER_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice"));
  const size_t bytes = spec.slot_bytes * spec.slots;
  if (spec.tier == Tier::kGpu) {
    void* base = nullptr;
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&base, bytes),
                                      "pool '" + spec.name + "': cudaMalloc of " + std::to_string(bytes) + " bytes"));
    GpuPoolHandle handle;
    handle.bytes = bytes;
    std::memcpy(handle.device_uuid.data(), &prop_.uuid, kGpuUuidBytes);
    cudaIpcMemHandle_t raw;
    const cudaError_t err = cudaIpcGetMemHandle(&raw, base);
    if (err != cudaSuccess) {
      cudaFree(base);
      return CudaStatus(err, "pool '" + spec.name + "': cudaIpcGetMemHandle");
    }
    std::memcpy(handle.raw.data(), &raw, sizeof(raw));
    return std::unique_ptr<Pool>(new GpuPool(spec, options_.device, static_cast<std::byte*>(base), handle));
  }
  // Clients only read the host tier.
  auto seg = ShmSegment::CreateSealed(shm_names::Segment(options_.name_prefix, spec.name).substr(1), bytes,
                                      ShmSegment::Sharing::kReadOnly, options_.populate);
  if (!seg.ok()) return seg.status();
  auto pool = std::make_unique<PinnedHostPool>(spec, std::move(seg).value());
  KVTIER_RETURN_IF_ERROR(pool->Pin(options_.pin_chunk_bytes, options_, spec.name));
  return std::unique_ptr<Pool>(std::move(pool));
}

Status CudaBackendImpl::Health() {
  // On its own streams a query fails only when the context does: a sticky
  // error (an illegal address, an uncorrectable ECC error, a lost device)
  // that every later call reports too.
  for (int s = 0; s < kCopyStreams; ++s) {
    const cudaError_t err = cudaStreamQuery(streams_[s]);
    if (err == cudaSuccess) continue;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      continue;
    }
    return Internal(std::string("cuda backend: the CUDA context failed (") + CudaErrorText(err) + " on the " +
                    (s == static_cast<int>(CopyDirection::kHostToGpu) ? "promotion" : "demotion") +
                    " stream); copies in flight will never complete");
  }
  return Status::Ok();
}

Status CudaBackendImpl::Usable(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  return Unavailable("cuda backend: " + what + ": " + CudaErrorText(err));
}

#if CUDART_VERSION >= 13000
std::string CudaBackendImpl::ProbeBatchedMemcpy() {
  constexpr size_t kBytes = 4096;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t host_bytes = std::max(page, 4 * kBytes);
  void* host = nullptr;
  if (posix_memalign(&host, page, host_bytes) != 0) return "no memory for the probe";
  auto* bytes = static_cast<uint8_t*>(host);
  for (size_t i = 0; i < 2 * kBytes; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memset(bytes + 2 * kBytes, 0, 2 * kBytes);
  void* device = nullptr;
  std::string error;
  bool registered = false;
  auto step = [&](cudaError_t err, const char* what) {
    if (err != cudaSuccess && error.empty()) error = std::string(what) + ": " + CudaErrorText(err);
    return error.empty();
  };
  if (step(cudaHostRegister(host, host_bytes, cudaHostRegisterPortable), "cudaHostRegister")) registered = true;
  if (error.empty()) step(cudaMalloc(&device, 2 * kBytes), "cudaMalloc");
  auto batch = [&](CopyDirection dir, void* dst, const void* src) {
    const int s = static_cast<int>(dir);
    void* dsts[2] = {static_cast<uint8_t*>(dst) + kBytes, dst};  // Crossed, as pool slots are.
    const void* srcs[2] = {src, static_cast<const uint8_t*>(src) + kBytes};
    size_t sizes[2] = {kBytes, kBytes};
    size_t attr_index = 0;
    if (step(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &batch_attrs_[s], &attr_index, 1, streams_[s]),
             "cudaMemcpyBatchAsync")) {
      step(cudaStreamSynchronize(streams_[s]), "cudaStreamSynchronize");
    }
  };
  if (error.empty()) batch(CopyDirection::kHostToGpu, device, bytes);
  if (error.empty()) batch(CopyDirection::kGpuToHost, bytes + 2 * kBytes, device);
  // Crossed twice: the bytes come back where they started.
  if (error.empty() && std::memcmp(bytes, bytes + 2 * kBytes, 2 * kBytes) != 0) {
    error = "the bytes copied back differ from those sent";
  }
  cudaGetLastError();
  if (device != nullptr) cudaFree(device);
  if (registered) cudaHostUnregister(host);
  std::free(host);
  return error;
}
#endif

}  // namespace cuda

Result<std::unique_ptr<CudaBackend>> CreateCudaBackend(const CudaBackendOptions& options) {
  auto backend = std::make_unique<cuda::CudaBackendImpl>(options);
  KVTIER_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<CudaBackend>(std::move(backend));
}

}  // namespace kvtier::tiering
