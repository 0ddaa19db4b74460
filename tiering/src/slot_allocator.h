// SlotAllocator: O(1) allocation of the slots of one pool (a stack of free slots).
// Not thread-safe. Double frees and frees of unknown slots abort: they are engine bugs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

namespace kvtier::tiering {

class SlotAllocator {
 public:
  explicit SlotAllocator(uint32_t slots) : in_use_(slots, 0) {
    free_.reserve(slots);
    for (uint32_t i = slots; i > 0; --i) free_.push_back(i - 1);  // Slot 0 is handed out first.
  }

  uint32_t capacity() const { return static_cast<uint32_t>(in_use_.size()); }
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t used() const { return capacity() - free_count(); }
  bool in_use(uint32_t slot) const { return slot < in_use_.size() && in_use_[slot] != 0; }

  // REQUIRES: free_count() > 0.
  uint32_t Allocate() {
    const uint32_t slot = free_.back();
    free_.pop_back();
    in_use_[slot] = 1;
    return slot;
  }

  // Marks exactly `slots` in use (adoption of an earlier run's pool). Returns
  // false, changing nothing, if a slot is out of range, listed twice or taken.
  // O(capacity). Afterwards the lowest free slot is handed out first again.
  bool Take(std::span<const uint32_t> slots) {
    std::vector<uint8_t> next = in_use_;
    for (uint32_t s : slots) {
      if (s >= next.size() || next[s] != 0) return false;
      next[s] = 1;
    }
    in_use_ = std::move(next);
    free_.clear();
    for (uint32_t i = capacity(); i > 0; --i) {
      if (in_use_[i - 1] == 0) free_.push_back(i - 1);
    }
    return true;
  }

  void Free(uint32_t slot) {
    if (!in_use(slot)) std::abort();
    in_use_[slot] = 0;
    free_.push_back(slot);
  }

 private:
  std::vector<uint32_t> free_;
  std::vector<uint8_t> in_use_;
};

}  // namespace kvtier::tiering
