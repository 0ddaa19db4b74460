// ReplySpin: when a client polls for kvtierd's reply instead of sleeping in recv.
//
// Right after a reply kvtierd is still polling (busy_poll_us), so the next
// reply comes within microseconds: a client whose request follows its previous
// reply within the window (ClientOptions::reply_spin) polls for the reply
// (yielding, in case the daemon shares its CPU) rather than sleep and pay a
// wake-up. After a pause the daemon sleeps, and spinning would only take a CPU
// it may need to wake up on.
//
// A spin that runs out is not yet a reason to stop: a polling daemon runs out
// a spin now and then (a large commit, another client served first, a
// preempted vCPU), and pausing for each would leave the client sleeping through
// the fast replies that follow. kMissesBeforePause spins running out in a row
// (a daemon that does not poll: busy_poll_us 0) pause spinning for kPause; a
// spin that finds its reply starts the count again.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvtier::client_internal {

class ReplySpin {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr uint32_t kMissesBeforePause = 3;
  static constexpr auto kPause = std::chrono::milliseconds(100);

  explicit ReplySpin(std::chrono::microseconds window) : window_(window) {}

  // Until when to poll for the reply to a request sent at `now`; `now` itself
  // (no polling) when the caller should block in recv at once.
  Clock::time_point PollUntil(Clock::time_point now) const {
    if (window_.count() <= 0 || now - last_reply_ >= window_ || now < paused_until_) return now;
    return now + window_;
  }
  // A spin found its reply.
  void Found() { misses_ = 0; }
  // A reply arrived at `now` (found by a spin or by a blocking recv).
  void Replied(Clock::time_point now) { last_reply_ = now; }
  // A spin ran out at `now` without its reply.
  void Missed(Clock::time_point now) {
    if (++misses_ < kMissesBeforePause) return;
    misses_ = 0;
    paused_until_ = now + kPause;
  }

 private:
  std::chrono::microseconds window_;
  Clock::time_point last_reply_{};    // When the previous reply arrived.
  Clock::time_point paused_until_{};  // No polling before this.
  uint32_t misses_ = 0;               // Spins in a row that ran out.
};

}  // namespace kvtier::client_internal
