// Mover: the copies of blocks between tiers. It takes moves one block at a
// time, submits them to the backend in batches (one fence each), and applies
// each batch when its fence completes: the block switches tier, or keeps its
// old copy when a reader leased it there meanwhile or it was freed (doomed).
//
// Invariants: a moving record is in exactly one pending or in-flight batch of
// its direction; `demoting()` counts the records moving GPU to host (the GPU
// slots that will come free). A moving block stays readable in its source tier
// until Poll applies its batch.
// Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "block_table.h"
#include "kvtier/fence_layout.h"
#include "kvtier/status.h"
#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

class Mover {
 public:
  // REQUIRES: all outlive the mover; `pools` holds both tiers' pools.
  Mover(Backend& backend, const PerTier<std::unique_ptr<Pool>>& pools, BlockTable& blocks);
  // Waits (bounded) for copies still in flight: they may target the pools.
  ~Mover();

  // Starts moving `r` to the other tier: a destination slot is taken and the
  // index marks it moving; the copy is submitted at the next Flush.
  // REQUIRES: r Ready; unleased if demoting; a free slot in the other tier.
  void Schedule(uint32_t r, CopyDirection dir);
  // Submits the moves scheduled in `dir`, at most `max_batch` blocks per fence.
  // A batch the backend refuses is undone: its blocks stay where they are.
  void Flush(CopyDirection dir, uint32_t max_batch);
  void FlushAll(uint32_t max_batch);

  // Applies every batch whose fence completed. Never blocks. Returns the blocks settled.
  uint32_t Poll();
  // Waits up to `timeout` for the oldest demotion batch, then polls; false if
  // none was in flight or it did not complete.
  bool WaitOldestDemotion(std::chrono::milliseconds timeout);
  // Waits for every batch in flight and applies it. kTimeout if one does not finish.
  Status WaitIdle(std::chrono::milliseconds timeout);

  uint32_t demoting() const { return demoting_; }
  bool in_flight() const;
  uint32_t copies_in_flight() const;  // Blocks in submitted batches.
  uint64_t demoted() const { return demoted_; }    // Copies gpu->host applied.
  uint64_t promoted() const { return promoted_; }  // Copies host->gpu applied.
  // Called with each block a completed demotion left in the host tier (not
  // doomed, not cancelled), as Poll applies it.
  void OnLanded(std::function<void(uint32_t r)> landed) { landed_ = std::move(landed); }

 private:
  struct Batch {
    Fence fence;
    std::vector<uint32_t> records;
  };

  void Complete(uint32_t r);
  void Cancel(uint32_t r);

  Backend& backend_;
  const PerTier<std::unique_ptr<Pool>>& pools_;
  BlockTable& blocks_;
  std::vector<uint32_t> pending_[kCopyStreams];
  std::deque<Batch> inflight_[kCopyStreams];
  uint32_t demoting_ = 0;
  uint64_t demoted_ = 0;
  uint64_t promoted_ = 0;
  std::function<void(uint32_t r)> landed_;
};

}  // namespace kvtier::tiering
