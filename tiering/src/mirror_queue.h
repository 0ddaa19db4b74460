// MirrorQueue: committed blocks being copied to free host slots so that the
// stores below the host tier get them at once (EngineOptions::spill_committed;
// store_io.cc offers each copy once it lands), in submission order.
//
// Invariants: each copy pins its block (counted in its `readers`) and owns its
// host slot until its batch's fence completes and the engine takes the batch.
// Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

class MirrorQueue {
 public:
  struct Copy {
    uint32_t record = 0;
    uint32_t host_slot = 0;
  };
  struct Batch {
    Fence fence;
    std::vector<Copy> copies;
  };

  // Adds a submitted batch as the newest.
  void Add(Batch batch) { batches_.push_back(std::move(batch)); }
  // Takes the oldest batch out if its copies landed; nullopt if none did.
  std::optional<Batch> TakeLanded(const Backend& backend) {
    if (batches_.empty() || !backend.IsComplete(batches_.front().fence)) return std::nullopt;
    std::optional<Batch> landed(std::move(batches_.front()));
    batches_.pop_front();
    return landed;
  }
  // Waits for every batch, up to `timeout` each: the copies target the pools,
  // which must outlive them.
  void WaitAll(const Backend& backend, std::chrono::milliseconds timeout) const {
    for (const Batch& b : batches_) (void)backend.Wait(b.fence, timeout);
  }
  // Calls f(const Copy&) for every copy in flight.
  template <typename F>
  void ForEachCopy(F&& f) const {
    for (const Batch& b : batches_) {
      for (const Copy& c : b.copies) f(c);
    }
  }

 private:
  std::deque<Batch> batches_;  // Oldest first.
};

}  // namespace kvtier::tiering
