// CudaBackendImpl: the CUDA backend (cuda_backend.h): its streams, fences,
// completion threads and client event watches. Internal to kvtier::cuda_backend.
//
// Its work, by concept:
//   cuda_pools.h        the GPU and pinned host pools, the CUDA error helpers
//   cuda_backend.cc     lifecycle: creation, Init (streams, fence events, the
//                       batched-memcpy probe), Describe, CreatePool, Health
//   cuda_copies.cc      copy submission (gather kernel or memcpy), completion
//                       events and the completion threads
//   cuda_events.cc      fences, promotion fence events, client event watches
//
// Thread-safety: as Backend's (backend.h): CreatePool, SubmitCopies and the
// event watches from one thread (the engine's: the submitting thread);
// IsComplete, Wait and copy_stats from any (the FenceBoard is thread-safe).
// Each stream's completion thread shares with the submitting thread only its
// Completer (under its mu), submitted_/last_done_ (under mu_) and the board.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "copy_kernels.h"
#include "kvtier/tiering/copy_planner.h"
#include "kvtier/tiering/fence_board.h"
#include "kvtier/tiering/cuda_backend.h"

namespace kvtier::tiering::cuda {

using Clock = std::chrono::steady_clock;

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
  // Waits for both streams, stops the completion threads, destroys every event and stream.
  ~CudaBackendImpl() override;

  // Creates the streams, their completion threads and the promotion fence
  // events, loads the gather kernel, chooses how large blocks are copied and
  // creates the fence segment. kUnavailable when the device cannot be used.
  Status Init();

  // cuda_backend.cc
  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string Describe() const override;
  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) override;
  Status Health() override;
  bool batched_memcpy() const override { return batched_; }

  // cuda_copies.cc
  Result<Fence> SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst, std::span<const CopyOp> ops) override;

  // cuda_events.cc
  bool IsComplete(const Fence& fence) const override;
  Status Wait(const Fence& fence, std::chrono::milliseconds timeout) const override;
  void SetCompletionNotifier(std::function<void()> notify) override;
  std::string FenceSegmentName() const override;
  int FenceSegmentFd() const override;
  CopyStats copy_stats(CopyDirection dir) const override;
  std::vector<wire::IpcEventHandle> PromotionFenceEvents() const override;
  Result<uint64_t> WatchClientEvent(uint64_t client, const wire::IpcEventHandle& handle) override;
  WorkState QueryWatch(uint64_t watch) override;
  void EndWatch(uint64_t watch) override;
  void ForgetClient(uint64_t client) override;

 private:
  // kUnavailable: no driver or device is an environment problem, not a bug.
  static Status Usable(cudaError_t err, const std::string& what);

#if CUDART_VERSION >= 13000
  // One batch of two 4 KiB copies each way between a device buffer and pinned
  // memory allocated outside CUDA (what the pools are), checked byte for byte.
  // Returns "" when it worked, else what failed.
  std::string ProbeBatchedMemcpy();
#endif

  // Closes the events of `client` no watch uses; with `forget`, the others
  // close with their last watch. Returns how many stay open.
  size_t CloseIdleEvents(uint64_t client, bool forget = false);

  // Queue one submission of a plan on stream `s`: through the gather kernel,
  // or through the copy engines (one batched call, else a memcpy per copy).
  Status Gather(const std::vector<PlannedCopy>& sub, const Pool& src, const Pool& dst, int s);
  Status Memcpy(const std::vector<PlannedCopy>& sub, const Pool& src, const Pool& dst, int s);

  // An event to record after a batch on stream `s`: a spare one, or a new one.
  Result<cudaEvent_t> CompletionEvent(int s);

  // Stream `s`'s completion thread.
  void CompleteBatches(int s);
  // Advances the fence board for a completed batch, with its busy time.
  void Complete(int stream, const BatchDone& done);

  CudaBackendOptions options_;
  cudaDeviceProp prop_{};       // The device's, read by Init.
  CopyPlannerOptions planner_;  // Which blocks go to the gather kernel, which to the copy engines.
  // Streams and their priorities, indexed by CopyDirection: promotions at the
  // highest priority, demotions at the lowest.
  int priority_[kCopyStreams] = {0, 0};
  cudaStream_t streams_[kCopyStreams] = {nullptr, nullptr};
  // Interprocess events the promotion stream records after batch `seq` (at
  // seq % kFenceEventRing), and their handles for clients (PromotionFenceEvents).
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

  Completer completers_[kCopyStreams];  // One per stream.

  // Per stream: the last batch submitted, and when the previous batch completed (busy time).
  std::mutex mu_;
  uint64_t submitted_[kCopyStreams] = {0, 0};       // GUARDED_BY(mu_)
  Clock::time_point last_done_[kCopyStreams] = {};  // GUARDED_BY(mu_)
};

}  // namespace kvtier::tiering::cuda
