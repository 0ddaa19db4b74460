// Warm restart: saving the manifest of the host tier (SaveWarm), demoting for
// a shutdown, and adopting an earlier run's host tier (AdoptWarm). The byte
// format is warm_manifest.h's.
#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "engine_impl.h"
#include "warm_manifest.h"

namespace kvtier::tiering {
namespace {

std::chrono::microseconds Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
}

}  // namespace

bool Engine::warm_dirty() const { return impl_->change_count() != impl_->saved_changes; }

Result<WarmSaveReport> Engine::SaveWarm(const std::string& manifest_segment, bool clean) {
  Impl& impl = *impl_;
  const auto start = std::chrono::steady_clock::now();
  const Pool& host = *impl.pools[Tier::kHost];
  const BlockIndex& index = impl.blocks.index();
  WarmManifest manifest;
  manifest.geometry = WarmGeometry{impl.options.profile.Fingerprint(), host.slot_bytes(), impl.bt(), host.slots()};
  manifest.clean = clean;
  manifest.written_unix_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  WarmSaveReport report;
  std::unordered_map<uint32_t, uint32_t> listed;  // Record -> index in manifest.blocks.
  for (Session* s : impl.sessions.ColdestFirst()) {
    WarmSession ws;
    for (uint32_t r : s->chain) {
      // Only the host-tier prefix: a block whose parent is not kept is of no use.
      Record& rec = impl.blocks[r];
      if (!rec.ReadyIn(Tier::kHost)) break;
      auto [it, added] = listed.try_emplace(r, static_cast<uint32_t>(manifest.blocks.size()));
      if (added) {
        if (!rec.checksummed) {
          rec.checksum = PayloadChecksum(host.slot_data(rec.slot), host.slot_bytes());
          rec.checksummed = true;
          ++report.checksummed;
        }
        WarmBlock b;
        b.key = rec.key;
        b.parent = index.parent(r);
        b.ns = rec.ns();
        b.model = rec.model;
        b.checksum = rec.checksum;
        b.host_slot = rec.slot;
        b.tokens.assign(index.tokens(r), index.tokens(r) + impl.bt());
        manifest.blocks.push_back(std::move(b));
      }
      ws.chain.push_back(it->second);
    }
    if (ws.chain.empty()) continue;
    ws.tenant = s->tenant->tenant.name;
    ws.id = s->id;
    ws.priority = s->priority;
    ws.ended = s->ended;
    manifest.sessions.push_back(std::move(ws));
  }
  const std::vector<std::byte> bytes = EncodeWarmManifest(manifest);
  KVTIER_RETURN_IF_ERROR(WriteWarmSegment(manifest_segment, bytes));
  impl.saved_changes = impl.change_count();
  ++impl.stats.warm_snapshots;
  report.blocks = static_cast<uint32_t>(manifest.blocks.size());
  report.sessions = static_cast<uint32_t>(manifest.sessions.size());
  report.bytes = bytes.size();
  report.took = Since(start);
  return report;
}

uint32_t Engine::DemoteForShutdown() {
  Impl& impl = *impl_;
  const std::vector<Session*> coldest_first = impl.sessions.ColdestFirst();
  // Up to the host tier's high watermark, not to full: the next start would
  // otherwise find it past the mark and drop (down to the low one) at once.
  const uint32_t host_slots = impl.pools[Tier::kHost]->slots();
  const auto cap = static_cast<uint32_t>(impl.options.host_high_watermark * host_slots);
  uint32_t scheduled = 0;
  for (auto it = coldest_first.rbegin(); it != coldest_first.rend(); ++it) {
    for (uint32_t r : (*it)->chain) {
      if (impl.slots(Tier::kHost).free_count() == 0 || host_slots - impl.slots(Tier::kHost).free_count() >= cap) break;
      if (impl.blocks[r].IdleIn(Tier::kGpu)) {
        impl.mover.Schedule(r, CopyDirection::kGpuToHost);
        ++scheduled;
      }
    }
  }
  impl.Flush(CopyDirection::kGpuToHost);
  return scheduled;
}

std::vector<uint32_t> Engine::Impl::AdoptBlocks(const WarmManifest& manifest) {
  const Pool& host = *pools[Tier::kHost];
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> by_key;
  std::vector<uint32_t> record_of(manifest.blocks.size(), kNoRecord);
  std::vector<uint32_t> taken;  // Host slots.
  for (size_t i = 0; i < manifest.blocks.size(); ++i) {
    const WarmBlock& b = manifest.blocks[i];
    if (!b.parent.IsNull()) {
      // Its parent must be adopted, and its tenant's (BlockTable's invariant).
      auto parent = by_key.find(b.parent);
      if (parent == by_key.end() || !(blocks[parent->second].ns() == b.ns) || blocks[parent->second].model != b.model) {
        continue;
      }
    }
    if (by_key.find(b.key) != by_key.end()) continue;
    if (ChainKey(b.parent, KeyNamespace(b.ns, b.model), b.tokens) != b.key) continue;
    if (PayloadChecksum(host.slot_data(b.host_slot), host.slot_bytes()) != b.checksum) continue;
    const uint32_t r = blocks.Publish(b.key, b.parent, b.tokens, tenants.Get(b.ns), b.model, Tier::kHost, b.host_slot);
    blocks[r].checksum = b.checksum;
    blocks[r].checksummed = true;
    by_key.emplace(b.key, r);
    record_of[i] = r;
    taken.push_back(b.host_slot);
  }
  if (!slots(Tier::kHost).Take(taken)) std::abort();  // Decode guarantees distinct, in-range slots.
  return record_of;
}

void Engine::Impl::AdoptSessions(const WarmManifest& manifest, const std::vector<uint32_t>& record_of,
                                 WarmAdoptReport* report) {
  for (const WarmSession& ws : manifest.sessions) {
    std::vector<uint32_t> chain;
    BlockKey prev;
    for (uint32_t i : ws.chain) {
      const uint32_t r = record_of[i];
      if (r == kNoRecord || manifest.blocks[i].parent != prev) break;
      chain.push_back(r);
      prev = manifest.blocks[i].key;
    }
    if (chain.empty()) {
      ++report->dropped_sessions;
      continue;
    }
    // The session's tenant is its blocks' (keys are chained in its namespace).
    const Tenant tenant{blocks[chain.front()].ns(), ws.tenant, ModelId{}};
    if (FindSession(tenant, ws.id) != nullptr) {
      ++report->dropped_sessions;
      continue;
    }
    ++clock;
    for (uint32_t r : chain) {
      Ref(r);
      blocks[r].last_use = clock;
    }
    Session* s = GetOrCreateSession(tenant, ws.id);
    s->chain = std::move(chain);
    sessions.SetPriority(s, std::clamp(ws.priority, kMinPriority, kMaxPriority), {});
    Touch(s);
    s->ended = ws.ended;
    ++report->adopted_sessions;
  }
}

Result<WarmAdoptReport> Engine::AdoptWarm(const std::string& manifest_segment) {
  Impl& impl = *impl_;
  if (!impl.options.warm_restart) return FailedPrecondition("warm restart is off for this engine");
  if (impl.blocks.index().size() != 0 || impl.sessions.size() != 0 || !impl.leases.empty()) {
    return FailedPrecondition("a warm restart adopts into an empty engine only");
  }
  const auto start = std::chrono::steady_clock::now();
  WarmAdoptReport report;
  auto bytes = ReadWarmSegment(manifest_segment);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return report;
    return bytes.status();
  }
  report.found = true;
  Pool& host = *impl.pools[Tier::kHost];
  const WarmGeometry expected{impl.options.profile.Fingerprint(), host.slot_bytes(), impl.bt(), host.slots()};
  auto decoded = DecodeWarmManifest(*bytes, expected);
  if (!decoded.ok() || !host.adopted()) {
    report.reason = !decoded.ok() ? decoded.status().message()
                                  : "the host pool segment was missing or had another size, so its blocks are gone";
    RemoveWarmSegment(manifest_segment);
    report.took = Since(start);
    return report;
  }
  const WarmManifest& manifest = *decoded;
  report.compatible = true;
  report.clean = manifest.clean;
  report.listed_blocks = static_cast<uint32_t>(manifest.blocks.size());

  const std::vector<uint32_t> record_of = impl.AdoptBlocks(manifest);
  impl.AdoptSessions(manifest, record_of, &report);
  // What no session holds would be freed at once: let it go now.
  for (uint32_t r : record_of) {
    if (r == kNoRecord || impl.blocks[r].refs != 0) continue;
    impl.blocks.Unpublish(r);
  }
  report.adopted_blocks = impl.blocks.index().size();
  report.dropped_blocks = report.listed_blocks - report.adopted_blocks;
  impl.stats.warm_adopted_blocks += report.adopted_blocks;
  impl.stats.warm_dropped_blocks += report.dropped_blocks;
  impl.stats.warm_adopted_sessions += report.adopted_sessions;
  ++impl.changes;  // The next snapshot replaces the old (clean) manifest.
  report.took = Since(start);
  return report;
}

}  // namespace kvtier::tiering
