// EvictionPolicy: orders sessions from coldest to warmest for demotion and drop.
//
// The engine names each session by a SessionHandle, tells the policy when a
// session appears or changes priority (Track), is used (Touch) or disappears
// (Untrack), and asks it to visit sessions coldest first. A policy keeps what
// it needs per session itself: it sees only handles and priorities, so any
// code can implement one. Not thread-safe: the engine's thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace kvtier::tiering {

inline constexpr int kMinPriority = 0;
inline constexpr int kMaxPriority = 7;

// A session as the policy sees it: opaque, chosen by the engine, unique among
// the sessions tracked. Once Untracked, a handle may name a later session.
using SessionHandle = uint64_t;

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Tracks `session` at `priority` (in [kMinPriority, kMaxPriority]): a new
  // session, or one whose priority changed. It becomes the warmest of `priority`.
  virtual void Track(SessionHandle session, int priority) = 0;
  // `session` was used: now the warmest of its priority. Ignored if not tracked.
  virtual void Touch(SessionHandle session) = 0;
  // Forgets `session`. Ignored if not tracked.
  virtual void Untrack(SessionHandle session) = 0;
  // Calls `visit` coldest first until it returns false or every tracked session
  // was visited. `visit` must not Track/Touch/Untrack.
  virtual void VisitColdest(const std::function<bool(SessionHandle)>& visit) const = 0;
};

// Least recently used first, lower priorities before higher ones: a session is
// colder than every session of a higher priority, whenever each was used.
std::unique_ptr<EvictionPolicy> MakeLruPolicy();

}  // namespace kvtier::tiering
