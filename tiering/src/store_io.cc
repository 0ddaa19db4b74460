// The engine's side of the stores below the host tier: host-tier blocks
// offered to them (on_spill) and blocks fetched from them placed in the host
// tier (Import). The stores themselves (the top-level stores/) know nothing of the engine.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>

#include "engine_impl.h"

namespace kvtier::tiering {

void Engine::Impl::Spill(uint32_t r, bool dropped) {
  Record& rec = blocks[r];
  if (!dropped && rec.spilled) return;
  const Pool& host = *pools[Tier::kHost];
  Offer(r, std::span<const std::byte>(host.slot_data(rec.slot), host.slot_bytes()), dropped);
}

void Engine::Impl::Offer(uint32_t r, std::span<const std::byte> payload, bool dropped) {
  Record& rec = blocks[r];
  rec.spilled = true;
  HostBlock b;
  b.key = rec.key;
  b.parent = blocks.index().parent(r);
  b.key_ns = rec.key_ns();
  b.tokens = std::span<const TokenId>(blocks.index().tokens(r), bt());
  b.payload = payload;
  b.dropped = dropped;
  ++stats.spilled_blocks;
  options.on_spill(b);
}

void Engine::Impl::Mirror(std::span<const uint32_t> records) {
  MirrorQueue::Batch batch;
  std::vector<CopyOp> ops;
  auto submit = [&] {
    if (ops.empty()) return;
    auto fence = backend.SubmitCopies(CopyDirection::kGpuToHost, *pools[Tier::kGpu], *pools[Tier::kHost], ops);
    if (fence.ok()) {
      batch.fence = *fence;
      mirrors.Add(std::move(batch));
    } else {
      // Refused: offered when they land in the host tier instead.
      for (const auto& [r, slot] : batch.copies) {
        slots(Tier::kHost).Free(slot);
        --blocks[r].readers;
        MaybeFree(r, FreeReason::kReleased);
      }
    }
    batch = MirrorQueue::Batch{};
    ops.clear();
  };
  for (uint32_t r : records) {
    Record& rec = blocks[r];
    if (rec.doomed || rec.spilled || !rec.ReadyIn(Tier::kGpu)) continue;
    if (slots(Tier::kHost).free_count() == 0) break;  // Nothing is evicted for a copy.
    const uint32_t slot = slots(Tier::kHost).Allocate();
    ++rec.readers;
    ops.push_back(CopyOp{rec.slot, slot});
    batch.copies.push_back({r, slot});
    if (ops.size() >= options.max_copy_batch) submit();
  }
  submit();
}

uint32_t Engine::Impl::PollMirrors() {
  uint32_t done = 0;
  const Pool& host = *pools[Tier::kHost];
  while (std::optional<MirrorQueue::Batch> landed = mirrors.TakeLanded(backend)) {
    for (const auto& [r, slot] : landed->copies) {
      if (!blocks[r].doomed) Offer(r, std::span<const std::byte>(host.slot_data(slot), host.slot_bytes()), false);
      slots(Tier::kHost).Free(slot);
      --blocks[r].readers;
      if (!blocks.FreeDoomed(r)) MaybeFree(r, FreeReason::kReleased);
      ++done;
    }
  }
  return done;
}

uint32_t Engine::Impl::ImportFetched(const Tenant& tenant, std::span<const BlockKey> keys,
                                     std::span<const TokenId> tokens, const FetchedBlocks& fetched,
                                     std::vector<uint32_t>& recs) {
  const auto cached = static_cast<uint32_t>(recs.size());
  // The cached prefix must reach the fetch's start; blocks cached since are skipped.
  if (cached < fetched.start || cached >= fetched.start + fetched.payloads.size()) return 0;
  const Pool& host = *pools[Tier::kHost];
  const size_t n = std::min(keys.size() - cached, fetched.payloads.size() - (cached - fetched.start));
  const std::span<const std::span<const std::byte>> payloads =
      std::span(fetched.payloads).subspan(cached - fetched.start, n);
  for (const auto& p : payloads) {
    if (p.size() != host.slot_bytes()) return 0;  // Not this pool's blocks.
  }
  TenantAccount& account = tenants.Get(tenant);
  // Host-tier room, as for a demotion: the tenant's own coldest host blocks
  // under its host quota, else anyone's coldest. The prefix is pinned meanwhile.
  for (uint32_t r : recs) ++blocks[r].readers;
  if (const uint32_t room = account.Room(Tier::kHost); n > room) {
    reclaim.DropFromTier(Tier::kHost, static_cast<uint32_t>(n) - room, &account);
  }
  if (const uint32_t free = slots(Tier::kHost).free_count(); n > free) {
    reclaim.DropFromTier(Tier::kHost, static_cast<uint32_t>(n) - free);
  }
  for (uint32_t r : recs) --blocks[r].readers;

  // Keys are the tenant's own, recomputed: a fetched block is published under
  // the key its parent and tokens give, whatever the request said.
  std::vector<BlockKey> computed(n);
  const BlockKey parent = cached == 0 ? BlockKey{} : keys[cached - 1];
  ComputeKeys(tenant.KeyNs(), parent, tokens.subspan(size_t{cached} * bt(), n * bt()), bt(), computed);
  uint32_t imported = 0;
  BlockKey prev = parent;
  for (size_t i = 0; i < n; ++i) {
    if (computed[i] != keys[cached + i]) break;
    if (blocks.index().Find(computed[i]) != kNoRecord) break;  // Cached since the fetch began.
    if (slots(Tier::kHost).free_count() == 0 || account.Room(Tier::kHost) == 0) break;
    const uint32_t slot = slots(Tier::kHost).Allocate();
    std::memcpy(host.slot_data(slot), payloads[i].data(), host.slot_bytes());
    const std::span<const TokenId> block_tokens = tokens.subspan((cached + i) * bt(), bt());
    const uint32_t r = blocks.Publish(computed[i], prev, block_tokens, account, tenant.model, Tier::kHost, slot);
    blocks[r].spilled = true;  // It came from a store: not offered back as landed.
    recs.push_back(r);
    prev = computed[i];
    ++imported;
  }
  stats.imported_blocks += imported;
  if (imported > 0) ++changes;
  return imported;
}

uint32_t Engine::SpillHostTier() {
  Impl& impl = *impl_;
  if (!impl.options.on_spill) return 0;
  impl.mover.Poll();
  const std::vector<Session*> coldest_first = impl.sessions.ColdestFirst();
  std::unordered_set<uint32_t> offered;
  for (auto it = coldest_first.rbegin(); it != coldest_first.rend(); ++it) {
    for (uint32_t r : (*it)->chain) {
      if (impl.blocks[r].ReadyIn(Tier::kHost) && offered.insert(r).second) impl.Spill(r, /*dropped=*/true);
    }
  }
  return static_cast<uint32_t>(offered.size());
}

Result<uint32_t> Engine::ImportLate(const Tenant& tenant, std::string_view session_id,
                                    std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                                    const FetchedBlocks& fetched) {
  Impl& impl = *impl_;
  if (keys.size() > impl.options.max_blocks_per_request || tokens.size() != keys.size() * impl.bt()) {
    return InvalidArgument("late import: " + std::to_string(keys.size()) + " keys and " +
                           std::to_string(tokens.size()) + " tokens");
  }
  if (session_id.empty()) return 0;  // Nothing would hold them.
  impl.Settle();
  const size_t asked = impl.options.max_session_blocks != 0
                           ? std::min<size_t>(keys.size(), impl.options.max_session_blocks)
                           : keys.size();
  std::vector<uint32_t> recs;
  impl.MatchRecords(tenant.ns, tenant.model, keys.first(asked), tokens.first(asked * impl.bt()), &recs);
  // The session's chain must be a prefix of what the request names (it held the
  // cached prefix then, or has grown along the same keys since): else it moved on.
  Session* s = impl.FindSession(tenant, session_id);
  if (s != nullptr) {
    if (s->chain.size() > recs.size() || !std::equal(s->chain.begin(), s->chain.end(), recs.begin())) return 0;
  } else if (!impl.CheckNewSession(tenant, session_id).ok()) {
    return 0;
  }
  const uint32_t imported =
      impl.ImportFetched(tenant, keys.first(asked), tokens.first(asked * impl.bt()), fetched, recs);
  if (imported == 0) return 0;
  ++impl.clock;
  impl.SetChain(tenant, session_id, recs);
  return imported;
}

}  // namespace kvtier::tiering
