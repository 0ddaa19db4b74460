// EngineInspector: the engine's full consistency check, for tests and the
// engine demo. O(state); never called while serving.
#pragma once

#include <cstddef>

#include "kvtier/status.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::tiering {

class EngineInspector {
 public:
  // Verifies the invariants of engine.h and of its parts (block_table.h,
  // mover.h, tenant_ledger.h): slot ownership, references and readers, the
  // index, tenant counts (blocks, moves, write-lease slots, sessions), leases
  // in grant order and their counts, the demotion count, record leaks.
  // kInternal naming the first one broken.
  static Status CheckInvariants(const Engine& engine);
  // Priority deadlines queued (SessionTable::pending_deadlines).
  static size_t PendingDeadlines(const Engine& engine);
  // Adds `delta` to the leased-slot count of the tenant with namespace `ns`
  // (which must have an account), so that a test sees CheckInvariants catch a
  // count that is off. Breaks the engine: for tests of the checker only.
  static void SkewLeasedSlots(Engine& engine, const Namespace& ns, int delta);
};

}  // namespace kvtier::tiering
