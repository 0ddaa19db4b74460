// When the engines' warm-restart calls run, and what they log (warm_lifecycle.h).
#include "service/warm_lifecycle.h"

#include <sys/mman.h>

#include <cstdio>
#include <string>

#include "kvtier/shm_names.h"
#include "kvtier/shm_segment.h"
#include "log.h"
#include "service/engine_set.h"

namespace kvtier::daemon {
namespace {

std::string Millis(std::chrono::microseconds us) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", static_cast<double>(us.count()) / 1000.0);
  return buf;
}

// The host pool outlives this run (it is not when its name was squatted).
bool Kept(const tiering::Engine& e) { return e.pool(Tier::kHost).persistence_lost().empty(); }

std::string Manifest(const DaemonConfig& config, const tiering::Engine& e) {
  return shm_names::WarmManifest(config.instance, e.options().name);
}

}  // namespace

WarmLifecycle::WarmLifecycle(const DaemonConfig& config, tiering::BackendKind backend)
    : enabled_(config.warm_restart && backend == tiering::BackendKind::kHost) {
  if (config.warm_restart && !enabled_) {
    LogWarn(std::string("warm_restart is ignored with the ") + tiering::BackendKindName(backend) +
            " backend (host backend only)");
  }
}

void WarmLifecycle::BeforeEngine(const DaemonConfig& config, const std::string& domain) const {
  if (config.warm_restart) return;
  const std::string manifest = shm_names::WarmManifest(config.instance, domain);
  ShmSegment::RemoveIfOwned(shm_names::Staging(manifest));  // A write the earlier run did not finish.
  if (ShmSegment::RemoveIfOwned(manifest)) {
    const std::string pool = shm_names::Pool(config.instance, domain, Tier::kHost);
    ShmSegment::RemoveIfOwned(pool);
    LogInfo("warm restart: removed " + manifest + " and " + pool + " left by an earlier run (warm_restart is off)");
  }
}

void WarmLifecycle::AdoptInto(tiering::Engine& engine, const DaemonConfig& config, const std::string& whose) {
  if (!enabled_) return;
  const std::string manifest = Manifest(config, engine);
  const std::string who = "warm restart, " + whose + ": ";
  if (const std::string& lost = engine.pool(Tier::kHost).persistence_lost(); !lost.empty()) {
    LogError(who + "off for this run, the host tier is not kept: " + lost +
             " (remove it, or choose another instance name)");
    return;
  }
  auto report = engine.AdoptWarm(manifest);
  if (!report.ok()) {
    const bool removed = ShmSegment::RemoveIfOwned(manifest);
    LogWarn(who + (removed ? "removed " : "ignored ") + manifest + ", which cannot be read or trusted (" +
            report.status().ToString() + "); starting cold");
  } else if (!report->found) {
    LogInfo(who + "no manifest " + manifest + "; starting cold");
  } else if (!report->compatible) {
    LogWarn(who + "removed stale segment " + manifest + " (" + report->reason + "); starting cold");
  } else {
    LogInfo(who + "adopted " + std::to_string(report->adopted_blocks) + " of " + std::to_string(report->listed_blocks) +
            " host blocks (" + std::to_string(report->dropped_blocks) + " dropped) and " +
            std::to_string(report->adopted_sessions) + " sessions (" + std::to_string(report->dropped_sessions) +
            " dropped) from a " + (report->clean ? "clean-shutdown manifest" : "snapshot (unclean shutdown)") + " in " +
            Millis(report->took));
  }
  last_snapshot_ = std::chrono::steady_clock::now();
}

void WarmLifecycle::MaybeSnapshot(const EngineSet& engines, const DaemonConfig& config) {
  if (!enabled_ || config.warm_snapshot_ms == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_snapshot_ < std::chrono::milliseconds(config.warm_snapshot_ms)) return;
  last_snapshot_ = now;
  for (size_t i = 0; i < engines.size(); ++i) {
    tiering::Engine& e = *engines[i].engine;
    if (!e.warm_dirty() || !Kept(e)) continue;
    auto r = e.SaveWarm(Manifest(config, e), false);
    if (!r.ok()) {
      LogWarn("warm restart: snapshot of " + engines.Describe(i) + " failed: " + r.status().ToString());
    } else {
      LogDebug("warm restart: snapshot of " + engines.Describe(i) + ": " + std::to_string(r->blocks) + " blocks, " +
               std::to_string(r->sessions) + " sessions in " + Millis(r->took));
    }
  }
}

void WarmLifecycle::SaveAtShutdown(const EngineSet& engines, const DaemonConfig& config,
                                 std::chrono::milliseconds budget) {
  if (!enabled_) return;
  const auto start = std::chrono::steady_clock::now();
  uint32_t demoted = 0;
  for (const EngineMember& m : engines) demoted += m.engine->DemoteForShutdown();
  Status idle;
  for (const EngineMember& m : engines) {
    idle = m.engine->WaitIdle(budget);
    if (!idle.ok()) break;
  }
  if (!idle.ok()) LogWarn("warm restart: demotions did not all land in time (" + idle.message() + "); saving what did");
  for (size_t i = 0; i < engines.size(); ++i) {
    tiering::Engine& e = *engines[i].engine;
    if (!Kept(e)) continue;
    auto r = e.SaveWarm(Manifest(config, e), true);
    if (!r.ok()) {
      LogError("warm restart: cannot write the manifest of " + engines.Describe(i) + ": " + r.status().ToString());
      continue;
    }
    LogInfo("warm restart, " + engines.Describe(i) + ": saved " + std::to_string(r->blocks) + " host blocks of " +
            std::to_string(r->sessions) + " sessions (" + std::to_string(r->bytes) + " bytes of manifest)");
  }
  LogInfo("warm restart: demoted " + std::to_string(demoted) + " blocks and wrote the manifests in " +
          Millis(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start)));
}

}  // namespace kvtier::daemon
