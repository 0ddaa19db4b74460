// ConnectRate: how many new connections each uid may open, a token bucket per
// uid (limits.connects_per_second, a burst of one second's worth). The server
// asks it at accept, after reading the peer's credentials and before any other
// work for the connection: a Hello is the costliest request kvtierd serves
// (its Welcome passes every segment's descriptor), so a process reconnecting in
// a loop took the event loop from everyone else's requests. Per uid, because
// the uid is what the kernel vouches for at accept (a tenant is only known at
// Hello), and one service's workers share it: the default, 1,000 a second, is
// far above what a host's workers reconnect at, even all restarting at once.
#pragma once

#include <cstdint>

#include "rate_buckets.h"

namespace kvtier::daemon {

class ConnectRate {
 public:
  using Clock = RateBuckets<uint32_t>::Clock;

  // True if `uid` may open one more connection at `now` (it is then counted);
  // false past `per_second`. A per_second of 0 admits everyone.
  bool Admit(uint32_t uid, uint32_t per_second, Clock::time_point now) {
    if (per_second == 0) return true;
    if (buckets_.Available(uid, per_second, per_second, now) < 1) return false;
    buckets_.Take(uid, 1);
    return true;
  }

 private:
  RateBuckets<uint32_t> buckets_;
};

}  // namespace kvtier::daemon
