// FenceBoard: the completion side every backend shares. A fence is (stream,
// sequence); the board keeps each stream's completed sequence in its own memory
// and publishes it, with the submitted one, in the shared fence segment clients
// map read-only (the daemon never reads that segment back), wakes local
// waiters, keeps the copy statistics, and calls the completion notifier
// outside its lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

#include "kvtier/fence_layout.h"
#include "kvtier/shm_segment.h"
#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

class FenceBoard {
 public:
  // REQUIRES: segment holds at least sizeof(FenceSegment) bytes.
  explicit FenceBoard(ShmSegment segment) : segment_(std::move(segment)) {
    state_ = reinterpret_cast<FenceSegment*>(segment_.data());
    std::memset(state_, 0, sizeof(FenceSegment));
    state_->magic = kFenceMagic;
    state_->abi_version = kShmAbiVersion;
  }

  const std::string& name() const { return segment_.name(); }
  int share_fd() const { return segment_.share_fd(); }

  // Batch `seq` of `stream` was submitted (callers number batches in order).
  void Submitted(int stream, uint64_t seq) {
    std::atomic_ref<uint64_t>(state_->submitted[stream]).store(seq, std::memory_order_relaxed);
  }

  // Batch `seq` of `stream` finished: counts it, publishes it, wakes waiters,
  // then runs the notifier. Batches of one stream complete in order.
  void Completed(int stream, uint64_t seq, uint64_t blocks, uint64_t bytes, double busy_seconds) {
    {
      std::lock_guard lock(mu_);
      CopyStats& st = stats_[stream];
      ++st.batches;
      st.blocks += blocks;
      st.bytes += bytes;
      st.busy_seconds += busy_seconds;
      completed_[stream].store(seq, std::memory_order_release);
      std::atomic_ref<uint64_t>(state_->completed[stream]).store(seq, std::memory_order_release);
    }
    done_cv_.notify_all();
    // Outside mu_: the notifier may take its caller's locks, and those callers
    // may submit or wait meanwhile.
    std::lock_guard notify_lock(notify_mu_);
    if (notify_) notify_();
  }

  bool IsComplete(const Fence& fence) const {
    if (fence.IsNull()) return true;
    return completed_[static_cast<int>(fence.stream)].load(std::memory_order_acquire) >= fence.seq;
  }

  Status Wait(const Fence& fence, std::chrono::milliseconds timeout) const {
    if (IsComplete(fence)) return Status::Ok();
    std::unique_lock lock(mu_);
    if (!done_cv_.wait_for(lock, timeout, [&] { return IsComplete(fence); })) {
      return Status(StatusCode::kTimeout, "copy fence " + std::to_string(fence.seq) + " still pending");
    }
    return Status::Ok();
  }

  void SetNotifier(std::function<void()> notify) {
    std::lock_guard lock(notify_mu_);  // Once this returns, the old notifier is not running.
    notify_ = std::move(notify);
  }

  CopyStats stats(CopyDirection dir) const {
    std::lock_guard lock(mu_);
    return stats_[static_cast<int>(dir)];
  }

 private:
  ShmSegment segment_;
  FenceSegment* state_ = nullptr;             // Published for clients; written only.
  std::atomic<uint64_t> completed_[kCopyStreams] = {};  // What the daemon believes.
  mutable std::mutex mu_;
  mutable std::condition_variable done_cv_;
  CopyStats stats_[kCopyStreams];  // GUARDED_BY(mu_)
  std::mutex notify_mu_;
  std::function<void()> notify_;  // GUARDED_BY(notify_mu_)
};

}  // namespace kvtier::tiering
