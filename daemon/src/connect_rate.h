// ConnectRate: how many new connections each uid may open, a token bucket per
// uid (limits.connects_per_second, a burst of one second's worth). The server
// asks it at accept, after reading the peer's credentials and before any other
// work for the connection: a Hello is the costliest request kvtierd serves
// (its Welcome passes every segment's descriptor), so a process reconnecting in
// a loop took the event loop from everyone else's requests. Per uid, because
// the uid is what the kernel vouches for at accept (a tenant is only known at
// Hello), and one service's workers share it: the default, 1,000 a second, is
// far above what a host's workers reconnect at, even all restarting at once.
//
// Bounded: past kMaxUids buckets, those that have been full again for a second
// (idle) are forgotten at the next accept.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace kvtier::daemon {

class ConnectRate {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxUids = 4096;

  // True if `uid` may open one more connection at `now` (it is then counted);
  // false past `per_second`. A per_second of 0 admits everyone.
  bool Admit(uint32_t uid, uint32_t per_second, Clock::time_point now) {
    if (per_second == 0) return true;
    const double rate = per_second;
    if (buckets_.size() >= kMaxUids && buckets_.find(uid) == buckets_.end()) Forget(rate, now);
    auto [it, added] = buckets_.try_emplace(uid, Bucket{rate, now});
    Bucket& b = it->second;
    if (!added) {
      const double elapsed = std::chrono::duration<double>(now - b.refilled).count();
      b.tokens = std::min(rate, b.tokens + std::max(0.0, elapsed) * rate);
      b.refilled = now;
    }
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

  size_t size() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens;
    Clock::time_point refilled;
  };
  // Drops the buckets that are full by `now`: forgetting one changes nothing.
  void Forget(double rate, Clock::time_point now) {
    std::erase_if(buckets_, [&](const auto& kv) {
      const Bucket& b = kv.second;
      return b.tokens + std::chrono::duration<double>(now - b.refilled).count() * rate >= rate;
    });
  }
  std::unordered_map<uint32_t, Bucket> buckets_;
};

}  // namespace kvtier::daemon
