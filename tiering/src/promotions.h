// PromotionQueue: host-tier blocks that read leases used in place, waiting for
// GPU room to be promoted (Engine::PromoteOnRelease), oldest first.
//
// Nothing is pinned: each entry keeps its block's key, which tells a record
// freed and reused since from the block that was read. Bounded: at most
// `limit` entries (the GPU tier's slots, more than could ever be promoted at
// once); past it the oldest is given up. Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>

#include "kvtier/block_key.h"

namespace kvtier::tiering {

struct WantedPromotion {
  uint32_t record = 0;
  BlockKey key;  // The block's key when it was read.
  std::chrono::steady_clock::time_point since;
};

// How long a wanted promotion waits for GPU room before the block stays where it is.
inline constexpr std::chrono::milliseconds kWantedPromotionFor{1000};

class PromotionQueue {
 public:
  explicit PromotionQueue(size_t limit) : limit_(limit) {}

  // Adds block `record`, keyed `key`, wanted since `since`, as the newest;
  // a block queued already keeps its place (two readers who both asked for its
  // promotion want it once). Returns how many of the oldest it pushed out (0
  // or 1): those are given up.
  size_t Add(uint32_t record, const BlockKey& key, std::chrono::steady_clock::time_point since);
  // Visits the entries oldest first and keeps, in order, those `keep(const
  // WantedPromotion&)` returns true for (the others were promoted or given up).
  // `keep` must not add entries.
  template <typename Keep>
  void Retain(Keep&& keep) {
    std::deque<WantedPromotion> left;
    for (const WantedPromotion& w : wanted_) {
      if (keep(w)) {
        left.push_back(w);
      } else {
        Forget(w.record);
      }
    }
    wanted_ = std::move(left);
  }
  // Gives up every entry. Returns how many there were.
  size_t Clear() {
    queued_.clear();
    return std::exchange(wanted_, {}).size();
  }

  bool empty() const { return wanted_.empty(); }
  size_t size() const { return wanted_.size(); }

 private:
  void Forget(uint32_t record) {
    if (auto it = queued_.find(record); it != queued_.end() && --it->second == 0) queued_.erase(it);
  }

  size_t limit_;
  std::deque<WantedPromotion> wanted_;  // Oldest first.
  // Entries per record (more than one only for a record reused by another
  // block while its old entry waits): Add looks for a duplicate only there.
  std::unordered_map<uint32_t, uint32_t> queued_;
};

}  // namespace kvtier::tiering
