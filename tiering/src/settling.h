// SettlingQueue: what a client's GPU work still uses, held back until the
// engine sees that work done (gpu_work.cc gives it back): the slots of a
// released write lease or of a commit's duplicates, and the blocks of a
// released read lease or of a commit.
//
// Invariants: every entry waits for work (a watch the engine owns) and holds
// slots or blocks; its slots are still counted in `tenant`'s leased slots, its
// blocks pinned (counted in their `readers`), and a commit's blocks marked
// `writing`. Oldest first. Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvtier/tiering/engine_leases.h"

namespace kvtier::tiering {

struct TenantAccount;

struct Settling {
  GpuWork work;
  std::vector<uint32_t> slots;      // GPU slots, freed after the work.
  TenantAccount* tenant = nullptr;  // Whose leased count `slots` are in; set when slots is non-empty.
  std::vector<uint32_t> records;    // Blocks pinned until the work is done.
  bool writes = false;              // The work writes `records` (a commit's new blocks).
  std::chrono::steady_clock::time_point since;
};

class SettlingQueue {
 public:
  // Adds `s` as the newest. REQUIRES: the invariants above hold for it.
  void Add(Settling s) { entries_.push_back(std::move(s)); }
  // Takes every entry out, oldest first: each is given back or added again.
  std::vector<Settling> TakeAll() { return std::exchange(entries_, {}); }

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Calls f(Settling&) for every entry, oldest first. `f` must not add or take entries.
  template <typename F>
  void ForEach(F&& f) {
    for (Settling& s : entries_) f(s);
  }
  template <typename F>
  void ForEach(F&& f) const {
    for (const Settling& s : entries_) f(s);
  }

 private:
  std::vector<Settling> entries_;
};

}  // namespace kvtier::tiering
