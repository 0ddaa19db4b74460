// EvictionPolicy: orders sessions from coldest to warmest for demotion and drop.
//
// The engine tells the policy when a session appears (Track), is used (Touch),
// changes priority (Track again) or disappears (Untrack), and asks it to visit
// sessions coldest first. Lower priority is colder than any higher priority;
// within a priority, least recently used first. Not thread-safe: the engine's thread owns it.
#pragma once

#include <functional>
#include <memory>

namespace kvtier::tiering {

struct Session;

inline constexpr int kMinPriority = 0;
inline constexpr int kMaxPriority = 7;

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void Track(Session* session) = 0;   // Insert, or re-place after a priority change.
  virtual void Touch(Session* session) = 0;   // Now the warmest of its priority.
  virtual void Untrack(Session* session) = 0;
  // Calls `visit` coldest first until it returns false or every session was visited.
  // `visit` must not Track/Touch/Untrack.
  virtual void VisitColdest(const std::function<bool(Session*)>& visit) const = 0;
};

std::unique_ptr<EvictionPolicy> MakeLruPolicy();

}  // namespace kvtier::tiering
