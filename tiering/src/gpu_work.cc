// What waits for a client's GPU work: the slots and blocks of released leases
// and commits whose work the client's GPU may still be doing (settling.h).
//
// The engine never trusts a client to have finished: a slot is reused, and a
// written block served or demoted, only once the event the client recorded
// after its work reports done. The events are polled (Backend::QueryWatch),
// never waited on, so a slow or dead client holds back only its own slots and
// blocks.
#include <algorithm>
#include <unordered_set>

#include "engine_impl.h"

namespace kvtier::tiering {

void Engine::Impl::EndWatch(GpuWork& work) {
  if (!work.none()) backend.EndWatch(work.watch);
  work.watch = 0;
}

void Engine::Impl::GiveBackAfter(GpuWork work, std::vector<uint32_t> slots, TenantAccount* tenant,
                                 std::vector<uint32_t> records, bool writes) {
  Settling s{work, std::move(slots), tenant, std::move(records), writes, std::chrono::steady_clock::now()};
  if (work.none() || backend.QueryWatch(work.watch) == Backend::WorkState::kDone) {
    GiveBack(s);
    return;
  }
  if (s.slots.empty() && s.records.empty()) {
    EndWatch(s.work);
    return;
  }
  for (uint32_t r : s.records) blocks[r].writing = blocks[r].writing || writes;
  if (writes) blocks.Changed();  // Not served while written (MatchRecords).
  settling.Add(std::move(s));
}

void Engine::Impl::GiveBack(Settling& s) {
  EndWatch(s.work);
  // Committed blocks are written now: copies of them go to the stores.
  if (s.writes && options.spill_committed && options.on_spill) Mirror(s.records);
  if (!s.slots.empty()) {
    s.tenant->Unleased(static_cast<uint32_t>(s.slots.size()));
    for (uint32_t slot : s.slots) slots(Tier::kGpu).Free(slot);
  }
  if (s.writes) blocks.Changed();  // Served from now on.
  for (uint32_t r : s.records) {
    Record& rec = blocks[r];
    --rec.readers;
    if (s.writes) rec.writing = false;
    if (!blocks.FreeDoomed(r)) MaybeFree(r, FreeReason::kReleased);
  }
}

uint32_t Engine::Impl::Settle() {
  if (settling.empty()) return 0;
  const auto now = std::chrono::steady_clock::now();
  const std::chrono::milliseconds timeout = options.lease_timeout;
  uint32_t settled = 0;
  // Giving back frees blocks, never adds work to wait for: what is added again is what still waits.
  for (Settling& s : settling.TakeAll()) {
    const Backend::WorkState state = backend.QueryWatch(s.work.watch);
    const bool expired = timeout.count() > 0 && now - s.since >= timeout;
    if (state == Backend::WorkState::kPending && !expired) {
      settling.Add(std::move(s));
      continue;
    }
    if (state == Backend::WorkState::kPending) ++stats.expired_gpu_work;
    // Blocks whose writer's context failed (or timed out) hold whatever it left.
    if (s.writes && state != Backend::WorkState::kDone) DropUnwritten(s.records);
    settled += static_cast<uint32_t>(s.slots.size() + s.records.size());
    GiveBack(s);
  }
  return settled;
}

void Engine::Impl::DropUnwritten(std::span<const uint32_t> records) {
  std::unordered_set<uint32_t> drop;
  std::vector<const TenantAccount*> owners;
  for (uint32_t r : records) {
    if (blocks[r].doomed) continue;
    drop.insert(r);
    if (std::find(owners.begin(), owners.end(), blocks[r].tenant) == owners.end()) owners.push_back(blocks[r].tenant);
  }
  if (drop.empty()) return;
  // Every session holding one is cut just before it (a chain never has gaps).
  std::vector<std::pair<Session*, size_t>> cuts;
  for (const TenantAccount* owner : owners) {
    sessions.VisitInOrder(owner->tenant.ns, std::nullopt, {}, [&](Session& s) {
      for (size_t i = 0; i < s.chain.size(); ++i) {
        if (drop.count(s.chain[i]) != 0) {
          cuts.emplace_back(&s, i);
          break;
        }
      }
      return true;
    });
  }
  for (auto [s, at] : cuts) {
    Truncate(s, at, FreeReason::kPressure);
    if (s->chain.empty()) RemoveSession(s, SessionEnd::kEmptied);
  }
  // Still pinned by their settling entry: out of the index now, their slots
  // come free when it is given back.
  for (uint32_t r : drop) {
    blocks.Doom(r);
    ++changes;
    ++stats.unfinished_writes_dropped;
  }
}

uint32_t Engine::ClientGone(uint64_t client) {
  Impl& impl = *impl_;
  uint32_t dropped = 0;
  impl.settling.ForEach([&](const Settling& s) {
    if (!s.writes || s.work.client != client) return;
    if (impl.backend.QueryWatch(s.work.watch) == Backend::WorkState::kDone) return;  // Written after all.
    for (uint32_t r : s.records) dropped += impl.blocks[r].doomed ? 0 : 1;
    impl.DropUnwritten(s.records);
  });
  return dropped;
}

}  // namespace kvtier::tiering
