// ManualBackend: a Backend whose copies land only when the test runs them, for
// tests that need a copy to stay in flight, a backend that refuses work, or
// clients' GPU events that finish when the test says. Pools are plain heap
// memory (no segment: nothing to export). Everything else runs on the real host
// backend (host_backend.h); this one stands in only where that one cannot hold
// a copy back. Not thread-safe: the test's thread drives it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

class HeapPool final : public Pool {
 public:
  HeapPool(const PoolSpec& spec, std::unique_ptr<std::byte[]> mem)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, mem.get()), mem_(std::move(mem)) {}
  PoolHandle Export() const override {
    PoolHandle h;
    h.tier = tier();
    h.slot_bytes = slot_bytes();
    h.slots = slots();
    return h;
  }

 private:
  std::unique_ptr<std::byte[]> mem_;
};

class ManualBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  std::string Describe() const override { return "manual (test)"; }

  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) override {
    auto mem = std::make_unique<std::byte[]>(spec.slot_bytes * spec.slots);
    return std::unique_ptr<Pool>(new HeapPool(spec, std::move(mem)));
  }

  Result<Fence> SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst,
                             std::span<const CopyOp> ops) override {
    if (refuse_submits > 0) {
      --refuse_submits;
      return Unavailable("copy refused by the test");
    }
    const int d = static_cast<int>(dir);
    EXPECT_EQ(src.slot_bytes(), dst.slot_bytes());
    EXPECT_EQ(src.tier(), dir == CopyDirection::kGpuToHost ? Tier::kGpu : Tier::kHost);
    jobs_[d].push_back(Job{++submitted_[d], &src, &dst, std::vector<CopyOp>(ops.begin(), ops.end())});
    return Fence{submitted_[d], dir};
  }

  bool IsComplete(const Fence& f) const override {
    return f.IsNull() || completed_[static_cast<int>(f.stream)] >= f.seq;
  }

  Status Wait(const Fence& f, std::chrono::milliseconds) const override {
    ++wait_calls;
    if (!IsComplete(f) && complete_on_wait) RunUntil(f);
    if (IsComplete(f)) return Status::Ok();
    return Status(StatusCode::kTimeout, "manual backend: copy not run");
  }

  void SetCompletionNotifier(std::function<void()>) override {}
  std::string FenceSegmentName() const override { return ""; }
  int FenceSegmentFd() const override { return -1; }
  CopyStats copy_stats(CopyDirection) const override { return {}; }

  // Emulated client events: byte 0 of the handle names the event; the test
  // says when it is done (every event is pending until then).
  Result<uint64_t> WatchClientEvent(uint64_t, const wire::IpcEventHandle& event) override {
    watches_[next_watch_] = event[0];
    return next_watch_++;
  }
  WorkState QueryWatch(uint64_t watch) override {
    const auto it = watches_.find(watch);
    EXPECT_NE(it, watches_.end()) << "query of an ended watch";
    if (it == watches_.end()) return WorkState::kDone;
    const auto e = events.find(it->second);
    return e == events.end() ? WorkState::kPending : e->second;
  }
  void EndWatch(uint64_t watch) override { EXPECT_EQ(watches_.erase(watch), 1u) << "watch ended twice"; }
  size_t open_watches() const { return watches_.size(); }
  std::unordered_map<uint8_t, WorkState> events;

  // Lands every queued copy, promotions first.
  void RunAll() const {
    for (int d : {static_cast<int>(CopyDirection::kHostToGpu), static_cast<int>(CopyDirection::kGpuToHost)}) {
      while (!jobs_[d].empty()) RunOne(d);
    }
  }
  size_t queued_ops() const {
    size_t n = 0;
    for (const auto& q : jobs_) {
      for (const Job& j : q) n += j.ops.size();
    }
    return n;
  }

  mutable int wait_calls = 0;
  bool complete_on_wait = false;  // Wait runs the copies it waits for, like a synchronous device.
  int refuse_submits = 0;         // The next N SubmitCopies calls fail.

 private:
  struct Job {
    uint64_t seq;
    const Pool* src;
    const Pool* dst;
    std::vector<CopyOp> ops;
  };

  void RunOne(int d) const {
    const Job& j = jobs_[d].front();
    for (const CopyOp& op : j.ops)
      std::memcpy(j.dst->slot_data(op.dst_slot), j.src->slot_data(op.src_slot), j.src->slot_bytes());
    completed_[d] = j.seq;
    jobs_[d].pop_front();
  }
  void RunUntil(const Fence& f) const {
    const int d = static_cast<int>(f.stream);
    while (completed_[d] < f.seq && !jobs_[d].empty()) RunOne(d);
  }

  mutable std::deque<Job> jobs_[kCopyStreams];
  std::unordered_map<uint64_t, uint8_t> watches_;
  uint64_t next_watch_ = 1;
  uint64_t submitted_[kCopyStreams] = {0, 0};
  mutable uint64_t completed_[kCopyStreams] = {0, 0};
};

}  // namespace kvtier::tiering
