// RateBuckets: a token bucket per key, each refilled at a rate the caller
// passes at every call (so a reload changes it at once) up to a burst. Used
// for new connections per uid (server.cc) and store fetch bytes per tenant
// (store_waits.cc).
//
// Bounded: when a new key finds kMaxKeys buckets, those full again by now
// (idle long enough to have refilled) are forgotten first; forgetting a full
// bucket changes nothing, since a new one starts full.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <unordered_map>

namespace kvtier::daemon {

template <typename Key>
class RateBuckets {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxKeys = 4096;

  // The tokens `key` holds at `now`, refilled at `rate` a second up to
  // `burst` (a new key starts with `burst`).
  double Available(const Key& key, double rate, double burst, Clock::time_point now) {
    if (buckets_.size() >= kMaxKeys && buckets_.find(key) == buckets_.end()) Forget(rate, burst, now);
    auto [it, added] = buckets_.try_emplace(key, Bucket{burst, now});
    Bucket& b = it->second;
    if (!added) {
      const double elapsed = std::max(0.0, std::chrono::duration<double>(now - b.refilled).count());
      b.tokens = std::min(burst, b.tokens + elapsed * rate);
      b.refilled = now;
    }
    return b.tokens;
  }
  // Takes `n` of `key`'s tokens. REQUIRES: Available(key, ...) was called first.
  void Take(const Key& key, double n) { buckets_.at(key).tokens -= n; }

  size_t size() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens;
    Clock::time_point refilled;
  };
  void Forget(double rate, double burst, Clock::time_point now) {
    std::erase_if(buckets_, [&](const auto& kv) {
      const Bucket& b = kv.second;
      return b.tokens + std::chrono::duration<double>(now - b.refilled).count() * rate >= burst;
    });
  }
  std::unordered_map<Key, Bucket> buckets_;
};

}  // namespace kvtier::daemon
