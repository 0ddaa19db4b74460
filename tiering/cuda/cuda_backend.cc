// The CUDA backend: device and pinned host pools, copy streams and GPU fences (cuda_backend.h).
#include "kvtier/tiering/cuda_backend.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "copy_kernels.h"
#include "copy_planner.h"
#include "fence_board.h"
#include "kvtier/gpu_pool_handle.h"
#include "kvtier/shm_names.h"
#include "kvtier/shm_segment.h"

namespace kvtier::tiering {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == wire::kIpcEventHandleBytes);
static_assert(sizeof(cudaUUID_t) == kGpuUuidBytes);
static_assert(kFenceEventRing <= wire::kMaxFenceEvents);

// Events one client may have open in unfinished work (libkvtier reuses a few).
constexpr size_t kMaxClientEvents = 1024;

using Clock = std::chrono::steady_clock;

std::string CudaErrorText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, what + ": " + CudaErrorText(err));
}

class GpuPool final : public Pool {
 public:
  GpuPool(const PoolSpec& spec, int device, std::byte* base, const GpuPoolHandle& handle)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, base), device_(device), handle_(handle) {}
  ~GpuPool() override {
    cudaSetDevice(device_);
    cudaFree(base());
  }

  PoolHandle Export() const override {
    PoolHandle h;
    h.backend = BackendKind::kCuda;
    h.tier = tier();
    h.slot_bytes = slot_bytes();
    h.slots = slots();
    h.ipc_handle = EncodeGpuPoolHandle(handle_);
    return h;
  }

 private:
  int device_;
  GpuPoolHandle handle_;
};

// A shared-memory segment pinned in chunks of `chunk_slots` slots.
class PinnedHostPool final : public Pool {
 public:
  PinnedHostPool(const PoolSpec& spec, ShmSegment segment)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, segment.data()), segment_(std::move(segment)) {}
  ~PinnedHostPool() override {
    for (std::byte* chunk : chunks_) cudaHostUnregister(chunk);
  }

  Status Pin(size_t chunk_bytes, const CudaBackendOptions& options, const std::string& name) {
    // Chunks end on page boundaries: two registrations must not share a page.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t step = page / std::gcd(slot_bytes(), page);  // Fewest slots filling whole pages.
    const size_t want = std::max(step, chunk_bytes / slot_bytes() / step * step);
    chunk_slots_ = static_cast<uint32_t>(std::min<size_t>(want, slots()));
    const size_t total = slot_bytes() * slots();
    for (uint32_t first = 0; first < slots(); first += chunk_slots_) {
      const size_t bytes = size_t{std::min(chunk_slots_, slots() - first)} * slot_bytes();
      std::byte* chunk = slot_data(first);
      KVTIER_RETURN_IF_ERROR(
          CudaStatus(cudaHostRegister(chunk, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                     "pool '" + name + "': cudaHostRegister of " + std::to_string(bytes) +
                         " bytes (is RLIMIT_MEMLOCK high enough?)"));
      chunks_.push_back(chunk);
      if (options.pin_progress) options.pin_progress(name, size_t{first} * slot_bytes() + bytes, total);
    }
    return Status::Ok();
  }

  uint32_t chunk_slots() const { return chunk_slots_; }

  PoolHandle Export() const override {
    PoolHandle h;
    h.backend = BackendKind::kCuda;
    h.tier = tier();
    h.slot_bytes = slot_bytes();
    h.slots = slots();
    h.shm_name = segment_.name();
    h.fd = segment_.share_fd();
    return h;
  }

 private:
  ShmSegment segment_;
  uint32_t chunk_slots_ = 0;
  std::vector<std::byte*> chunks_;  // Registered ranges, unregistered on destruction.
};

// A batch submitted on a stream, and the event recorded after its copies.
struct BatchDone {
  cudaEvent_t event;
  uint64_t seq;
  uint64_t blocks;
  uint64_t bytes;
  Clock::time_point submitted;
};

// Completes one stream's fences: a thread waits, in submission order, on the
// event recorded after each batch (a blocking-sync event: it sleeps, not
// spins) and advances the fence board. Unlike a host function at the end of
// each batch, this never holds the stream: back-to-back batches run back to
// back on the copy engines.
struct Completer {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BatchDone> queue;     // GUARDED_BY(mu)
  std::vector<cudaEvent_t> spare;  // GUARDED_BY(mu): events whose batch completed.
  bool stop = false;               // GUARDED_BY(mu)
  std::thread thread;
};

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(CudaBackendOptions options) : options_(std::move(options)) {}

  ~CudaBackendImpl() override {
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

  Status Init() {
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
      KVTIER_RETURN_IF_ERROR(CudaStatus(
          cudaEventCreateWithFlags(&fence_events_[i], cudaEventInterprocess | cudaEventDisableTiming),
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

  BackendKind kind() const override { return BackendKind::kCuda; }

  std::string Describe() const override {
    return "cuda (device " + std::to_string(options_.device) + ": " + prop_.name + ", sm_" +
           std::to_string(prop_.major) + std::to_string(prop_.minor) + ", promotions at stream priority " +
           std::to_string(priority_[static_cast<int>(CopyDirection::kHostToGpu)]) + ", " + batch_why_ +
           (planner_.memcpy_min_block_bytes == 0
                ? " for every block size (no device access to host addresses)"
                : " for blocks >= " + std::to_string(planner_.memcpy_min_block_bytes >> 10) +
                      " KiB, gather kernel below") +
           ", sealed segments " + options_.name_prefix + ".*)";
  }

  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) override {
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

  Result<Fence> SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst,
                             std::span<const CopyOp> ops) override {
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
          return Status(queued.code(), queued.message() + "; and the stream did not drain (" +
                                           CudaErrorText(drained) + "): the CUDA context may be unusable");
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

  Status Health() override {
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

  bool IsComplete(const Fence& fence) const override { return board_->IsComplete(fence); }
  Status Wait(const Fence& fence, std::chrono::milliseconds timeout) const override {
    return board_->Wait(fence, timeout);
  }
  void SetCompletionNotifier(std::function<void()> notify) override { board_->SetNotifier(std::move(notify)); }
  std::string FenceSegmentName() const override { return board_->name(); }
  int FenceSegmentFd() const override { return board_->share_fd(); }
  CopyStats copy_stats(CopyDirection dir) const override { return board_->stats(dir); }

  std::vector<wire::IpcEventHandle> PromotionFenceEvents() const override {
    return {fence_handles_.begin(), fence_handles_.end()};
  }

  Result<uint64_t> WatchClientEvent(uint64_t client, const wire::IpcEventHandle& handle) override {
    const ClientEventKey key{client, handle};
    auto it = client_events_.find(key);
    if (it == client_events_.end()) {
      KVTIER_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice"));
      if (CloseIdleEvents(client) >= kMaxClientEvents) {
        return ResourceExhausted("client holds " + std::to_string(kMaxClientEvents) +
                                 " GPU events in unfinished work; it must reuse its events");
      }
      cudaIpcEventHandle_t raw;
      std::memcpy(&raw, handle.data(), sizeof(raw));
      cudaEvent_t event = nullptr;
      const cudaError_t err = cudaIpcOpenEventHandle(&event, raw);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return InvalidArgument("GPU event: cudaIpcOpenEventHandle: " + CudaErrorText(err) +
                               " (not an interprocess event of a live process on this GPU)");
      }
      it = client_events_.emplace(key, ClientEvent{event}).first;
    }
    ++it->second.watches;
    const uint64_t id = next_watch_++;
    watches_.emplace(id, it);
    return id;
  }

  WorkState QueryWatch(uint64_t watch) override {
    const auto w = watches_.find(watch);
    if (w == watches_.end()) return WorkState::kDone;
    const cudaError_t err = cudaEventQuery(w->second->second.event);
    if (err == cudaSuccess) return WorkState::kDone;
    cudaGetLastError();  // Neither answer is an error of a later call.
    return err == cudaErrorNotReady ? WorkState::kPending : WorkState::kFailed;
  }

  void EndWatch(uint64_t watch) override {
    const auto w = watches_.find(watch);
    if (w == watches_.end()) return;
    const auto it = w->second;
    watches_.erase(w);
    if (--it->second.watches == 0 && it->second.forgotten) {
      cudaEventDestroy(it->second.event);
      client_events_.erase(it);
    }
  }

  void ForgetClient(uint64_t client) override { CloseIdleEvents(client, /*forget=*/true); }

  bool batched_memcpy() const override { return batched_; }

 private:
  // kUnavailable: no driver or device is an environment problem, not a bug.
  static Status Usable(cudaError_t err, const std::string& what) {
    if (err == cudaSuccess) return Status::Ok();
    return Unavailable("cuda backend: " + what + ": " + CudaErrorText(err));
  }

#if CUDART_VERSION >= 13000
  // One batch of two 4 KiB copies each way between a device buffer and pinned
  // memory allocated outside CUDA (what the pools are), checked byte for byte.
  // Returns "" when it worked, else what failed.
  std::string ProbeBatchedMemcpy() {
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

  // Closes the events of `client` no watch uses; with `forget`, the others
  // close with their last watch. Returns how many stay open.
  size_t CloseIdleEvents(uint64_t client, bool forget = false) {
    size_t open = 0;
    for (auto it = client_events_.lower_bound(ClientEventKey{client, {}});
         it != client_events_.end() && it->first.client == client;) {
      if (it->second.watches == 0) {
        cudaEventDestroy(it->second.event);
        it = client_events_.erase(it);
      } else {
        it->second.forgotten = it->second.forgotten || forget;
        ++open;
        ++it;
      }
    }
    return open;
  }

  Status Gather(const std::vector<PlannedCopy>& sub, const Pool& src, const Pool& dst, int s) {
    gather_.count = static_cast<uint32_t>(sub.size());
    for (size_t i = 0; i < sub.size(); ++i) {
      gather_.copies[i] = GatherCopy{src.base() + sub[i].src_offset, dst.base() + sub[i].dst_offset, sub[i].bytes};
    }
    return LaunchGatherCopy(gather_, streams_[s]);
  }

  Status Memcpy(const std::vector<PlannedCopy>& sub, const Pool& src, const Pool& dst, int s) {
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
      KVTIER_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst.base() + c.dst_offset, src.base() + c.src_offset, c.bytes,
                                                        cudaMemcpyDefault, streams_[s]),
                                        "cudaMemcpyAsync"));
    }
    return Status::Ok();
  }

  // An event to record after a batch on stream `s`: a spare one, or a new one.
  Result<cudaEvent_t> CompletionEvent(int s) {
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

  // Stream `s`'s completion thread.
  void CompleteBatches(int s) {
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

  void Complete(int stream, const BatchDone& done) {
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

  CudaBackendOptions options_;
  cudaDeviceProp prop_{};
  CopyPlannerOptions planner_;
  int priority_[kCopyStreams] = {0, 0};
  cudaStream_t streams_[kCopyStreams] = {nullptr, nullptr};
  cudaEvent_t fence_events_[kFenceEventRing] = {};
  std::array<wire::IpcEventHandle, kFenceEventRing> fence_handles_{};
  // Opened client events, by (client, handle), and the watches on them
  // (engine thread only). Nothing on the GPU waits on them: they are polled.
  struct ClientEventKey {
    uint64_t client;
    wire::IpcEventHandle handle;
    friend auto operator<=>(const ClientEventKey&, const ClientEventKey&) = default;
  };
  struct ClientEvent {
    cudaEvent_t event = nullptr;
    uint32_t watches = 0;
    bool forgotten = false;  // Its client is gone: closed with its last watch.
  };
  using ClientEvents = std::map<ClientEventKey, ClientEvent>;
  ClientEvents client_events_;
  std::unordered_map<uint64_t, ClientEvents::iterator> watches_;
  uint64_t next_watch_ = 1;
  bool batched_ = false;   // Submitting thread only.
  std::string batch_why_;  // How large blocks are copied, and why (Describe).
#if CUDART_VERSION >= 13000
  cudaMemcpyAttributes batch_attrs_[kCopyStreams] = {};  // Per direction: stream order, location hints.
#endif
  std::optional<FenceBoard> board_;  // Made by Init.

  // Submission scratch, reused (submitting thread only).
  GatherCopyBatch gather_{};
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;

  Completer completers_[kCopyStreams];

  std::mutex mu_;
  uint64_t submitted_[kCopyStreams] = {0, 0};       // GUARDED_BY(mu_)
  Clock::time_point last_done_[kCopyStreams] = {};  // GUARDED_BY(mu_)
};

}  // namespace

Result<std::unique_ptr<CudaBackend>> CreateCudaBackend(const CudaBackendOptions& options) {
  auto backend = std::make_unique<CudaBackendImpl>(options);
  KVTIER_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<CudaBackend>(std::move(backend));
}

}  // namespace kvtier::tiering
