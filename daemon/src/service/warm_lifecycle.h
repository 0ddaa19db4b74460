// WarmLifecycle: kvtierd's side of keeping the host tier across a restart.
//
// The engine holds the mechanism (AdoptWarm, SaveWarm, DemoteForShutdown); this
// decides when each runs and says what happened: at start it removes what an
// earlier run left when warm_restart is off, or adopts each engine's manifest
// (one per profile, and one per isolated tenant and profile: engine_set.h);
// while serving it rewrites changed manifests every tiering.warm_snapshot_ms; at
// a clean shutdown it demotes what fits and writes the manifests. Nothing here
// stops a start: a manifest that cannot be adopted is removed and the profile
// starts cold. Used on the event-loop thread only.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "config/config.h"
#include "kvtier/tiering/backend.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::daemon {

class EngineSet;  // engine_set.h, which names this class in its wiring: no include back.

class WarmLifecycle {
 public:
  // Enabled when config.warm_restart is set and the backend keeps its host pool
  // in shared memory (the host backend); with another backend it logs that
  // warm_restart is ignored.
  WarmLifecycle(const DaemonConfig& config, tiering::BackendKind backend);

  bool enabled() const { return enabled_; }

  // Before the engine of `domain` (shm_names::Domain, its options' name) is
  // created. With warm_restart off, removes the manifest and host pool an
  // earlier run with it on left behind.
  void BeforeEngine(const DaemonConfig& config, const std::string& domain) const;
  // Once the engine exists (enabled only): adopts the host tier the manifest
  // lists, or removes a manifest that cannot be adopted; logs the outcome as
  // `who`'s. The first snapshot comes warm_snapshot_ms after the last adoption.
  void AdoptInto(tiering::Engine& engine, const DaemonConfig& config, const std::string& who);

  // Every tick (enabled only): rewrites the manifest of each engine that
  // changed, at most every config.warm_snapshot_ms (0: never).
  void MaybeSnapshot(const EngineSet& engines, const DaemonConfig& config);
  // At a clean shutdown, after the clients are gone (enabled only): demotes
  // what fits from the GPU tier to the host tier, waits up to `budget` for the
  // copies, and writes each engine's manifest with the clean flag.
  void SaveAtShutdown(const EngineSet& engines, const DaemonConfig& config, std::chrono::milliseconds budget);

 private:
  bool enabled_ = false;
  std::chrono::steady_clock::time_point last_snapshot_ = std::chrono::steady_clock::now();
};

}  // namespace kvtier::daemon
