// Names for shared-memory segments that are unique to this test process and call.
#pragma once

#include <unistd.h>

#include <atomic>
#include <string>

namespace kvtier::testing {

// "kvtier-test.<tag>.<pid>.<n>": a prefix no other test process (or earlier call
// in this one) uses. Segment names are "/" + prefix (+ suffixes).
inline std::string UniqueShmPrefix(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "kvtier-test." + tag + "." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

}  // namespace kvtier::testing
