// Engine: creation, the read path, background work and figures (the write path
// is engine_write.cc). The parts it is made of are listed in engine_impl.h.
#include "kvtier/tiering/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "engine_impl.h"
#include "kvtier/shm_names.h"

namespace kvtier::tiering {

// --- Impl: freeing blocks, lookup -------------------------------------------------------------

void Engine::Impl::MaybeFree(uint32_t r, FreeReason why) {
  const Record& rec = blocks[r];
  if (rec.held() || rec.doomed) return;
  const BlockKey key = rec.key;
  if (why == FreeReason::kPressure && options.on_spill && rec.ReadyIn(Tier::kHost)) Spill(r, /*dropped=*/true);
  blocks.Unpublish(r);
  ++changes;
  const bool dropped = why == FreeReason::kPressure;
  if (dropped) ++stats.dropped_blocks;
  if (options.on_free) options.on_free(key, dropped);
}

uint32_t Engine::Impl::MatchRecords(const Namespace& ns, const ModelId& model, std::span<const BlockKey> keys,
                                    std::span<const TokenId> tokens, std::vector<uint32_t>* out) const {
  ++prefix_walks;
  const size_t n = std::min(keys.size(), tokens.size() / bt());
  out->resize(n);
  // The keys come from the client, which may have chained them in another
  // tenant's namespace: only this tenant's blocks may match. The index's 32-bit
  // tag check turns most others away (and prefetches the hits' rows), but two
  // tenants' tags can collide, so block 0's record must be this tenant's. That
  // settles the rest: a block's stored parent is the key of a block of its own
  // tenant (BlockTable's invariant), so a block whose parent matches the key of
  // this tenant's block before it is this tenant's too.
  const TenantAccount* tenant = tenants.Find(ns);
  // A model's blocks are the tenant's too, but keyed apart: block 0 must be
  // of this model as well (its key was chained in the model's namespace).
  const size_t found =
      tenant == nullptr ? 0 : blocks.index().FindPrefix(keys.first(n), NamespaceTag(KeyNamespace(ns, model)), *out);
  // A block is `writing` only while a commit's GPU work is settling: with none
  // (always on the host backend) no record needs reading for it, which would
  // cost a cache miss per block.
  const bool writers = !settling.empty();
  uint32_t matched = 0;
  for (size_t i = 0; i < found; ++i) {
    const uint32_t r = (*out)[i];
    if (i == 0 && (blocks[r].tenant != tenant || blocks[r].model != model)) break;
    if (writers && blocks[r].writing) break;  // Its writer's GPU may not have finished it: never served before.
    const BlockKey parent = i == 0 ? BlockKey{} : keys[i - 1];
    if (!blocks.index().RowMatches(r, parent, tokens.subspan(i * bt(), bt()))) break;
    ++matched;
  }
  out->resize(matched);
  return matched;
}

std::span<const uint32_t> Engine::Impl::Matched(const Namespace& ns, const ModelId& model,
                                                std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                                                PrefixMatch* match, PrefixMatch& scratch) {
  PrefixMatch& m = match != nullptr ? *match : scratch;
  if (m.generation != blocks.generation() || m.keys < keys.size() || !(m.ns == ns) || !(m.model == model)) {
    m.matched = MatchRecords(ns, model, keys, tokens, &m.records);
    m.generation = blocks.generation();
    m.keys = keys.size();
    m.ns = ns;
    m.model = model;
  }
  // Matched against more keys: its first ones are these keys' prefix.
  return std::span<const uint32_t>(m.records).first(std::min<size_t>(m.records.size(), keys.size()));
}

void Engine::Impl::NoteGpuWait(TenantAccount& account) {
  if (gpu_share.NoteWaiting(account, tenants, GpuShare::Clock::now())) reclaim.ReclaimShares();
}

uint32_t Engine::Impl::Promotable(std::span<const uint32_t> recs) const {
  uint32_t n = 0;
  for (uint32_t r : recs) n += blocks[r].IdleIn(Tier::kHost) ? 1 : 0;
  return n;
}

// --- Creation -----------------------------------------------------------------------------

namespace {

// The checks on the settings Retune may change.
Status CheckTunables(const EngineTunables& o) {
  if (std::string p = LowWatermarkProblem(o.gpu_low_watermark, o.gpu_high_watermark, "gpu_high_watermark");
      !p.empty()) {
    return InvalidArgument("gpu_low_watermark " + p);
  }
  if (std::string p = LowWatermarkProblem(o.host_low_watermark, o.host_high_watermark, "host_high_watermark");
      !p.empty()) {
    return InvalidArgument("host_low_watermark " + p);
  }
  if (o.max_copy_batch == 0) return InvalidArgument("max_copy_batch must be > 0");
  if (o.lease_timeout.count() < 0) return InvalidArgument("lease_timeout must be >= 0 (0: never)");
  if (o.gpu_share_window.count() < 0) return InvalidArgument("gpu_share_window must be >= 0 (0: no fair share)");
  return Status::Ok();
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
  impl_->settling.ForEach([&](Settling& s) { impl_->EndWatch(s.work); });
  // Copies for the stores target the pools: they land before the pools go.
  impl_->mirrors.WaitAll(impl_->backend, std::chrono::seconds(30));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o, Backend& backend,
                                               std::unique_ptr<EvictionPolicy> policy) {
  KVTIER_RETURN_IF_ERROR(o.profile.Validate());
  if (o.gpu_slots == 0 || o.host_slots == 0) return InvalidArgument("gpu_slots and host_slots must be > 0");
  if (uint64_t{o.gpu_slots} + o.host_slots > (1u << 30)) return InvalidArgument("more than 2^30 slots in all");
  KVTIER_RETURN_IF_ERROR(CheckTunables(o));
  if (o.max_sessions == 0) return InvalidArgument("max_sessions must be > 0");
  if (o.index_segment.empty()) return InvalidArgument("index_segment must label the index segment");

  const uint32_t max_records = o.gpu_slots + o.host_slots;
  auto index = BlockIndex::Create(o.index_segment, o.profile.block_tokens, max_records, o.profile.Fingerprint());
  if (!index.ok()) return index.status();
  if (o.stores_below) index->SetFlags(kIndexFlagStoresBelow);
  auto impl = std::make_unique<Impl>(o, backend, std::move(index).value(), policy ? std::move(policy) : MakeLruPolicy());
  KVTIER_RETURN_IF_ERROR(impl->tenants.SetQuotas(o.quotas));
  const size_t bytes = o.profile.BlockBytes();
  for (Tier t : kTiers) {
    PoolSpec spec{t, bytes, t == Tier::kGpu ? o.gpu_slots : o.host_slots, shm_names::PoolObject(o.name, t)};
    spec.persistent = o.warm_restart && t == Tier::kHost;
    auto pool = backend.CreatePool(spec);
    if (!pool.ok()) return pool.status();
    impl->pools[t] = std::move(pool).value();
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const ModelProfile& Engine::profile() const { return impl_->options.profile; }
const EngineOptions& Engine::options() const { return impl_->options; }
Pool& Engine::pool(Tier tier) const { return *impl_->pools[tier]; }
const std::string& Engine::index_segment_name() const { return impl_->blocks.index().segment_name(); }
int Engine::index_fd() const { return impl_->blocks.index().share_fd(); }

// --- Read path ------------------------------------------------------------------------------

uint32_t Engine::Match(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                       const ModelId& model) const {
  std::vector<uint32_t> recs;
  return impl_->MatchRecords(ns, model, keys, tokens, &recs);
}

uint32_t Engine::Match(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                       const ModelId& model, PrefixMatch* match) {
  PrefixMatch scratch;
  return static_cast<uint32_t>(impl_->Matched(ns, model, keys, tokens, match, scratch).size());
}

bool Engine::AcquireNeedsRoom(const Namespace& ns, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                              const ModelId& model, PrefixMatch* match) {
  Impl& impl = *impl_;
  if (keys.size() > impl.options.max_blocks_per_request || tokens.size() != keys.size() * impl.bt()) return false;
  // Room for every key: nothing to wait for, and no need to match twice.
  if (impl.slots(Tier::kGpu).free_count() >= keys.size()) return false;
  impl.mover.Poll();
  PrefixMatch scratch;
  const std::span<const uint32_t> recs = impl.Matched(ns, model, keys, tokens, match, scratch);
  if (recs.empty()) return false;
  // Past its fair share while another tenant waits, a tenant promotes nothing:
  // no room is made (or waited for) for it.
  TenantAccount& account = *impl.blocks[recs[0]].tenant;
  const uint32_t to_promote = std::min(impl.Promotable(recs), impl.gpu_share.Room(account, GpuShare::Clock::now()));
  if (to_promote <= impl.slots(Tier::kGpu).free_count()) return false;
  // Pinned while room is made, so the demotion walk and host-tier drops pass
  // them by (Acquire pins them the same way).
  for (uint32_t r : recs) ++impl.blocks[r].readers;
  impl.reclaim.MakeGpuRoom(to_promote);
  for (uint32_t r : recs) --impl.blocks[r].readers;
  const bool wait = impl.slots(Tier::kGpu).free_count() < to_promote && impl.mover.demoting() > 0;
  if (wait) impl.NoteGpuWait(account);
  return wait;
}

bool Engine::Impl::MakePromotionRoom(const Tenant& tenant, std::span<const uint32_t> recs, bool fetched) {
  // Host-tier hits need GPU slots: demote colder blocks to make room rather
  // than lease a shorter prefix. The reading session was just touched, so it is
  // the last one the demotion walk reaches. Making room may drop host blocks:
  // the matched ones are pinned meanwhile, so none is dropped (or freed) before
  // it is leased.
  bool promote = true;
  TenantAccount& account = tenants.Get(tenant);
  // Past its fair share while another tenant waits, nothing is promoted: make no room for it.
  const uint32_t to_promote = std::min(Promotable(recs), gpu_share.Room(account, GpuShare::Clock::now()));
  for (uint32_t r : recs) ++blocks[r].readers;
  if (to_promote > slots(Tier::kGpu).free_count()) {
    reclaim.MakeGpuRoom(to_promote);
    // Blocks a store brought are never waited for: without room for every
    // promotion, the prefix is leased where it is (the demotions just
    // scheduled make room for the next turn).
    if (!fetched) reclaim.WaitForGpuRoom(to_promote, std::chrono::milliseconds(200));
    if (fetched && to_promote > slots(Tier::kGpu).free_count()) promote = false;
  }
  // Under a GPU quota, the tenant's colder GPU blocks make way.
  const uint32_t room = account.Room(Tier::kGpu);
  if (to_promote > room) reclaim.DemoteColdest(to_promote - room, &account);
  for (uint32_t r : recs) --blocks[r].readers;  // Pinned again for the lease, or freed.
  return promote;
}

ReadRecords Engine::Impl::PinForRead(std::span<const uint32_t> recs, bool promote) {
  ReadRecords lease;
  if (recs.empty()) return lease;
  TenantAccount& account = *blocks[recs[0]].tenant;  // Matched blocks are all the reader's tenant's.
  const auto now = GpuShare::Clock::now();
  // Past its fair share while another tenant waits, the tenant's GPU blocks
  // past the share (marked by ReclaimShares) are not pinned again, nor are
  // its blocks being demoted (a pin would cancel the demotion): the lease
  // stops before them, and once its older leases end their slots go to the
  // waiter. Leases are never revoked early: a reader would read reused slots.
  const bool over_share = gpu_share.Over(account, now);
  bool share_limited = false;
  bool no_slot = false;
  for (uint32_t r : recs) {
    Record& rec = blocks[r];
    if (over_share && rec.tier == Tier::kGpu &&
        (rec.state == BlockState::kDemoting || (rec.ReadyIn(Tier::kGpu) && rec.share_epoch == gpu_share.epoch()))) {
      share_limited = true;
      break;
    }
    if (promote && rec.IdleIn(Tier::kHost)) {
      if (GpuRoom(account, now) > 0) {
        if (slots(Tier::kGpu).free_count() == 0) {  // No room to promote: lease what we have.
          no_slot = true;
          break;
        }
        mover.Schedule(r, CopyDirection::kHostToGpu);
      } else if (gpu_share.Room(account, now) == 0) {
        share_limited = true;  // Leased where it is, in the host tier.
      }
    }
    ++rec.readers;
    lease.records.push_back(r);
  }
  if (share_limited) ++stats.share_limited;
  // A matched block left out of the lease (no room to promote) whose last
  // session reference went while it was pinned is freed now.
  for (size_t i = lease.records.size(); i < recs.size(); ++i) MaybeFree(recs[i], FreeReason::kPressure);
  Flush(CopyDirection::kHostToGpu);
  if (no_slot) NoteGpuWait(account);
  return lease;
}

void Engine::Impl::LocateLeased(std::span<const uint32_t> leased, ReadLease* out) const {
  uint64_t wait_seq = 0;
  for (uint32_t r : leased) {
    const Record& rec = blocks[r];
    if (rec.state == BlockState::kPromoting) {
      out->blocks.push_back(BlockLocation{Tier::kGpu, rec.dst_slot});
      ++out->promoted;
      wait_seq = std::max(wait_seq, rec.move_seq);
    } else {
      out->blocks.push_back(BlockLocation{rec.tier, rec.slot});
    }
  }
  out->fence = Fence{wait_seq, CopyDirection::kHostToGpu};
}

Result<ReadLease> Engine::Acquire(const Tenant& tenant, std::string_view session_id, std::span<const BlockKey> keys,
                                  std::span<const TokenId> tokens, bool promote, const FetchedBlocks* fetched,
                                  PrefixMatch* match) {
  Impl& impl = *impl_;
  if (keys.size() > impl.options.max_blocks_per_request) return InvalidArgument("acquire of too many blocks");
  if (tokens.size() != keys.size() * impl.bt()) {
    return InvalidArgument("acquire: " + std::to_string(keys.size()) + " keys need " +
                           std::to_string(keys.size() * impl.bt()) + " tokens, got " + std::to_string(tokens.size()));
  }
  impl.Settle();  // Blocks whose writer finished by now are served.
  // A session never holds more than max_session_blocks, however long the prefix cached.
  const size_t asked = impl.options.max_session_blocks != 0
                           ? std::min<size_t>(keys.size(), impl.options.max_session_blocks)
                           : keys.size();
  ReadLease out;
  PrefixMatch scratch;
  std::vector<uint32_t> recs;
  {
    const std::span<const uint32_t> m =
        impl.Matched(tenant.ns, tenant.model, keys.first(asked), tokens.first(asked * impl.bt()), match, scratch);
    recs.assign(m.begin(), m.end());
  }
  out.matched = static_cast<uint32_t>(recs.size());
  for (uint32_t r : recs) ++impl.stats.hit_blocks_in[impl.blocks[r].tier];

  // A session comes into being with its first block: an acquire that matches
  // nothing names none into being (it would cost the table an entry for no
  // block), while an existing session's chain becomes what matched.
  const bool existing = !session_id.empty() && impl.FindSession(tenant, session_id) != nullptr;
  if (fetched != nullptr && (existing || session_id.empty() || impl.CheckNewSession(tenant, session_id).ok())) {
    // Published unheld: the session's references or the lease take them.
    out.imported = impl.ImportFetched(tenant, keys.first(asked), tokens.first(asked * impl.bt()), *fetched, recs);
    out.matched += out.imported;
  }
  const bool into_session = existing || (!session_id.empty() && out.matched > 0);
  if (into_session && !existing) KVTIER_RETURN_IF_ERROR(impl.CheckNewSession(tenant, session_id));
  ++impl.clock;
  impl.stats.hit_blocks += out.matched - out.imported;
  impl.stats.miss_blocks += keys.size() - out.matched;
  // Only a session's use orders demotion; a reader without one (a probe, a
  // scheduler) must not make blocks look warmer than every session holding them.
  if (into_session) impl.SetChain(tenant, session_id, recs);

  if (promote && !recs.empty()) promote = impl.MakePromotionRoom(tenant, recs, fetched != nullptr);
  ReadRecords lease = impl.PinForRead(recs, promote);
  impl.LocateLeased(lease.records, &out);
  if (!lease.records.empty()) out.id = impl.leases.Grant(std::move(lease));
  return out;
}

// --- Background and introspection -------------------------------------------------------------

uint32_t Engine::Poll() {
  Impl& impl = *impl_;
  const uint32_t settled = impl.mover.Poll() + impl.Settle() + impl.PollMirrors();
  impl.PromoteWanted();  // Demotions that landed made room.
  return settled;
}

void Engine::EnforceWatermarks() { impl_->reclaim.EnforceWatermarks(); }

Status Engine::Retune(const EngineTunables& t) {
  KVTIER_RETURN_IF_ERROR(CheckTunables(t));
  static_cast<EngineTunables&>(impl_->options) = t;
  // A shorter window ends a wait sooner (0: at once); marks made in it mean
  // nothing once nobody waits.
  impl_->gpu_share.set_window(t.gpu_share_window);
  return Status::Ok();
}

Status Engine::WaitIdle(std::chrono::milliseconds timeout) {
  do {  // Landed demotions may let wanted promotions start.
    impl_->mover.FlushAll(impl_->options.max_copy_batch);
    KVTIER_RETURN_IF_ERROR(impl_->mover.WaitIdle(timeout));
  } while (impl_->PromoteWanted() > 0);
  return Status::Ok();
}

bool Engine::CopiesInFlight() const { return impl_->mover.in_flight(); }

EngineStats Engine::stats() const {
  const Impl& impl = *impl_;
  EngineStats s = impl.stats;
  s.prefix_walks = impl.prefix_walks;
  for (Tier t : kTiers) {
    s.slots[t] = impl.slots(t).capacity();
    s.used[t] = impl.slots(t).used();
  }
  s.blocks = impl.blocks.index().size();
  s.sessions = static_cast<uint32_t>(impl.sessions.size());
  s.copies_in_flight = impl.mover.copies_in_flight();
  s.gpu_work_pending = static_cast<uint32_t>(impl.settling.size());
  s.demoted_blocks = impl.mover.demoted();
  s.promoted_blocks = impl.mover.promoted();
  impl.tenants.ForEach([&](const TenantAccount& a) { s.leased_slots += a.leased; });
  s.write_leases = impl.leases.write_count();
  s.read_leases = impl.leases.read_count();
  if (const auto oldest = impl.leases.OldestGrant()) {
    s.oldest_lease_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - *oldest).count());
  }
  return s;
}

TenantUsage Engine::tenant_usage(const Namespace& ns) const {
  TenantUsage out;
  if (const TenantAccount* a = impl_->tenants.Find(ns)) {
    for (Tier t : kTiers) out.blocks[t] = a->Blocks(t);
    out.leased = a->leased;
    out.sessions = a->sessions;
  }
  return out;
}

}  // namespace kvtier::tiering
