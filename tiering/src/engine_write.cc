// Engine: the write path. Allocating GPU slots under a write lease, and
// committing what a client wrote into them as a session's blocks, in named
// steps (engine_impl.h declares them).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine_impl.h"

namespace kvtier::tiering {

// --- Allocating -------------------------------------------------------------------------------

Status Engine::Impl::CheckAllocateCount(uint32_t count) const {
  if (count == 0 || count > options.max_blocks_per_request) {
    return InvalidArgument("allocate count " + std::to_string(count) + " not in [1, " +
                           std::to_string(options.max_blocks_per_request) + "]");
  }
  if (count > slots(Tier::kGpu).capacity()) {
    return ResourceExhausted("allocate " + std::to_string(count) + " blocks: the gpu tier has only " +
                             std::to_string(slots(Tier::kGpu).capacity()) + " slots");
  }
  return Status::Ok();
}

Status Engine::Impl::MakeAllocateQuotaRoom(TenantAccount& tenant, uint32_t count) {
  const std::string what = "allocate of " + std::to_string(count) + " blocks";
  // While a tenant waits for GPU room, the blocks marked past their tenants'
  // shares whose leases ended since are demoted now (their slots are the
  // waiter's), and this tenant stays within its own share.
  if (gpu_share.contended(GpuShare::Clock::now())) reclaim.ReclaimShares();
  Status room = reclaim.MakeQuotaRoom(tenant, count, nullptr, what);
  if (room.ok()) room = reclaim.MakeShareRoom(tenant, count, what);
  if (!room.ok()) ++stats.allocation_failures;
  return room;
}

Result<WriteLease> Engine::Impl::AllocateNow(TenantAccount& tenant, uint32_t count) {
  SlotAllocator& gpu = slots(Tier::kGpu);
  if (gpu.free_count() < count) {
    // Drop only when dropping makes enough room: a failed allocation loses nothing.
    const uint32_t short_by = count - gpu.free_count();
    if (reclaim.Droppable(Tier::kGpu, short_by) >= short_by) reclaim.DropFromTier(Tier::kGpu, short_by);
  }
  if (gpu.free_count() < count) {
    ++stats.allocation_failures;
    NoteGpuWait(tenant);
    return ResourceExhausted("gpu tier full: " + std::to_string(gpu.free_count()) + " of " +
                             std::to_string(gpu.capacity()) + " slots free, " + std::to_string(count) +
                             " requested; the rest are leased or moving");
  }
  WriteLease out;
  out.slots.reserve(count);
  for (uint32_t i = 0; i < count; ++i) out.slots.push_back(gpu.Allocate());
  tenant.Leased(count);
  out.id = leases.Grant(WriteSlots{out.slots, &tenant});
  return out;
}

Result<WriteLease> Engine::Allocate(const Tenant& tenant, uint32_t count) {
  Impl& impl = *impl_;
  KVTIER_RETURN_IF_ERROR(impl.CheckAllocateCount(count));
  impl.mover.Poll();
  TenantAccount& account = impl.tenants.Get(tenant);
  KVTIER_RETURN_IF_ERROR(impl.MakeAllocateQuotaRoom(account, count));
  impl.reclaim.MakeGpuRoom(count);
  impl.reclaim.WaitForGpuRoom(count, std::chrono::milliseconds(200));
  return impl.AllocateNow(account, count);
}

Result<std::optional<WriteLease>> Engine::TryAllocate(const Tenant& tenant, uint32_t count, bool may_wait) {
  Impl& impl = *impl_;
  KVTIER_RETURN_IF_ERROR(impl.CheckAllocateCount(count));
  impl.mover.Poll();
  // The quota first: the demotions that make room under it free GPU slots too.
  TenantAccount& account = impl.tenants.Get(tenant);
  KVTIER_RETURN_IF_ERROR(impl.MakeAllocateQuotaRoom(account, count));
  if (impl.slots(Tier::kGpu).free_count() < count) {
    impl.reclaim.MakeGpuRoom(count);
    // Demotions in flight free slots within a copy's time: come back then.
    if (may_wait && impl.slots(Tier::kGpu).free_count() < count && impl.mover.demoting() > 0) {
      impl.NoteGpuWait(account);
      return std::optional<WriteLease>();
    }
  }
  auto lease = impl.AllocateNow(account, count);
  if (!lease.ok()) return lease.status();
  return std::optional<WriteLease>(std::move(*lease));
}

// --- Committing -------------------------------------------------------------------------------

Result<WriteSlots*> Engine::Impl::CommitLease(const CommitRequest& c) {
  WriteSlots* lease = leases.FindWrite(c.lease_id);
  if (lease == nullptr) {
    if (const RevokedLease* revoked = leases.FindRevoked(c.lease_id); revoked != nullptr && revoked->write) {
      return FailedPrecondition(DescribeExpired(c.lease_id, *revoked) +
                                ": its slots went back to the pool; allocate again");
    }
    return NotFound("write lease " + std::to_string(c.lease_id) + " does not exist");
  }
  if (lease->tenant != &tenants.Get(c.tenant)) {
    return Status(StatusCode::kPermissionDenied, "write lease " + std::to_string(c.lease_id) + " is tenant '" +
                                                     lease->tenant->tenant.name + "''s, not '" + c.tenant.name + "''s");
  }
  return lease;
}

Status Engine::Impl::CheckCommitSlots(const CommitRequest& c, const WriteSlots& lease,
                                      std::vector<uint32_t>* committed) const {
  if (c.session_id.empty()) return InvalidArgument("commit needs a session id");
  if (c.tokens.size() % bt() != 0) {
    return InvalidArgument(std::to_string(c.tokens.size()) + " tokens is not a whole number of " +
                           std::to_string(bt()) + "-token blocks");
  }
  if (c.count != c.slots.size()) {
    return InvalidArgument(std::to_string(c.count) + " blocks of tokens but " + std::to_string(c.slots.size()) +
                           " slots");
  }
  if (c.count == 0 || c.count > options.max_blocks_per_request) {
    return InvalidArgument("commit of 0 or too many blocks");
  }
  committed->assign(c.slots.begin(), c.slots.end());
  std::sort(committed->begin(), committed->end());
  if (std::adjacent_find(committed->begin(), committed->end()) != committed->end()) {
    return InvalidArgument("a slot is committed twice");
  }
  std::vector<uint32_t> have = lease.slots;
  std::sort(have.begin(), have.end());
  if (!std::includes(have.begin(), have.end(), committed->begin(), committed->end())) {
    return InvalidArgument("a committed slot is not part of write lease " + std::to_string(c.lease_id));
  }
  return Status::Ok();
}

bool Engine::Impl::SessionContinues(const CommitRequest& c) const {
  const Session* s = FindSession(c.tenant, c.session_id);
  const size_t have = s == nullptr ? 0 : s->chain.size();
  if (c.start_block > have) return false;
  return c.start_block == 0 || blocks[s->chain[c.start_block - 1]].key == c.parent;
}

Result<std::vector<uint32_t>> Engine::Impl::CachedChain(const CommitRequest& c, const TenantAccount& account) const {
  const std::string what = "the cached chain of " + std::to_string(c.start_block) + " blocks ending at the parent";
  // Bounded by what the index can hold, before anything is allocated for it.
  if (c.start_block > slots(Tier::kGpu).capacity() + slots(Tier::kHost).capacity()) {
    return InvalidArgument("start_block " + std::to_string(c.start_block) + " is past any chain the cache can hold");
  }
  std::vector<uint32_t> chain(c.start_block);
  BlockKey key = c.parent;
  for (size_t i = c.start_block; i-- > 0;) {
    if (key.IsNull()) return FailedPrecondition(what + " starts at block " + std::to_string(i + 1) + ", not 0");
    const uint32_t r = blocks.index().Find(key);
    // Another tenant's (or model's) block is never adopted, even on a key collision.
    if (r == kNoRecord || blocks[r].tenant != &account || blocks[r].model != c.tenant.model) {
      return FailedPrecondition(what + ": block " + std::to_string(i) +
                                " is no longer cached; acquire the prefix under the session instead");
    }
    chain[i] = r;
    key = blocks.index().parent(r);
  }
  if (!key.IsNull())
    return FailedPrecondition(what + " is longer than that: the parent is not block " +
                              std::to_string(c.start_block - 1));
  return chain;
}

Status Engine::Impl::CheckCommitPlace(const CommitRequest& c, bool adopting) {
  // The commit must continue the session where the caller saw it: its first
  // start_block blocks, the last of them keyed `parent`.
  const Session* existing = FindSession(c.tenant, c.session_id);
  const size_t have = adopting ? c.start_block : existing == nullptr ? 0 : existing->chain.size();
  const std::string session = "session '" + std::string(c.session_id) + "'";
  if (adopting) {
    // The chain walked from `parent` becomes its first start_block blocks.
  } else if (c.start_block > have) {
    return FailedPrecondition("commit at block " + std::to_string(c.start_block) + " of " + session + ", which holds " +
                              std::to_string(have) + " blocks; acquire its prefix under the session first");
  }
  if (!adopting && c.start_block > 0 && blocks[existing->chain[c.start_block - 1]].key != c.parent) {
    return FailedPrecondition("commit parent is not block " + std::to_string(c.start_block - 1) + " of " + session);
  }
  if (c.start_block == 0 && !c.parent.IsNull()) {
    return InvalidArgument("a commit at block 0 must have the null parent key");
  }
  KVTIER_RETURN_IF_ERROR(CheckNewSession(c.tenant, c.session_id));
  const size_t after = c.start_block + c.count;
  if (options.max_session_blocks != 0 && after > options.max_session_blocks) {
    return ResourceExhausted(session + " would hold " + std::to_string(after) +
                             " blocks, past limits.max_session_blocks (" + std::to_string(options.max_session_blocks) +
                             "): commit fewer, or start a new session");
  }
  return Status::Ok();
}

Status Engine::Impl::MakeCommitQuotaRoom(const CommitRequest& c, TenantAccount& account) {
  if (!account.has_quota(Tier::kGpu)) return Status::Ok();
  // New blocks count against the tenant's GPU quota; duplicates do not. The
  // committed slots were counted since Allocate: their charge passes to the
  // new blocks, so this only finds the tenant short of room when it went over
  // meanwhile (a quota demotion cancelled by a reader).
  uint32_t fresh = 0;
  BlockKey prev = c.parent;
  for (size_t i = 0; i < c.count; ++i) {
    prev = ChainKey(prev, c.tenant.KeyNs(), c.tokens.subspan(i * bt(), bt()));
    fresh += blocks.index().Find(prev) == kNoRecord ? 1 : 0;
  }
  return reclaim.MakeQuotaRoom(account, fresh, FindSession(c.tenant, c.session_id),
                               "commit of " + std::to_string(fresh) + " new blocks",
                               /*credit=*/static_cast<uint32_t>(c.count));
}

Engine::Impl::Committed Engine::Impl::ChainCommitted(const CommitRequest& c, TenantAccount& account,
                                                     const std::vector<uint32_t>* adopt) {
  Session* s = GetOrCreateSession(c.tenant, c.session_id);
  // The chain past start_block is replaced; its references go only after the new
  // blocks took theirs, so re-committing cached blocks finds them as duplicates.
  std::vector<BlockKey> before;  // For Session::below, which the new chain may continue.
  if (!s->below.empty()) before = ChainAndBelow(*s);
  std::vector<uint32_t> replaced;
  if (adopt != nullptr) {
    // The whole chain goes: the adopted blocks are its first start_block.
    replaced = std::move(s->chain);
    s->chain.clear();
    for (uint32_t r : *adopt) {
      Ref(r);
      blocks[r].last_use = clock;
      s->chain.push_back(r);
    }
  } else if (s->chain.size() > c.start_block) {
    replaced.assign(s->chain.begin() + c.start_block, s->chain.end());
    s->chain.resize(c.start_block);
  }
  Committed out = PublishCommitted(c, account, s);
  for (auto r = replaced.rbegin(); r != replaced.rend(); ++r) Unref(*r, FreeReason::kReleased);
  if (!before.empty()) ReconcileBelow(s, before);
  Touch(s);
  return out;
}

Engine::Impl::Committed Engine::Impl::PublishCommitted(const CommitRequest& c, TenantAccount& account, Session* s) {
  const Namespace key_ns = c.tenant.KeyNs();  // Keys are chained in the model's namespace.
  Committed out;
  BlockKey prev = c.parent;
  for (size_t i = 0; i < c.count; ++i) {
    const std::span<const TokenId> block = c.tokens.subspan(i * bt(), bt());
    const BlockKey key = ChainKey(prev, key_ns, block);
    uint32_t r = blocks.index().Find(key);
    if (r != kNoRecord) {
      out.duplicate_slots.push_back(c.slots[i]);  // First copy wins.
      ++out.result.duplicates;
      if (!blocks.index().RowMatches(r, prev, block) || blocks[r].tenant != &account ||
          blocks[r].model != c.tenant.model) {
        prev = key;  // A 128-bit collision: the block cannot be published.
        continue;
      }
    } else {
      r = blocks.Publish(key, prev, block, account, c.tenant.model, Tier::kGpu, c.slots[i]);
      ++blocks[r].readers;  // Pinned until the writer is done (HandOverCommitted).
      out.written.push_back(r);
      ++out.result.stored;
    }
    blocks[r].last_use = clock;
    Ref(r);
    s->chain.push_back(r);
    prev = key;
  }
  out.last = prev;
  return out;
}

void Engine::Impl::HandOverCommitted(WriteSlots& lease, const std::vector<uint32_t>& committed, Committed& done,
                                     GpuWork writer) {
  TenantAccount& account = *lease.tenant;
  // Committed slots leave the write lease (n log n, not n * lease size), and
  // the tenant's leased count: they are its blocks now, or the duplicates'
  // slots, which stay counted until given back after the writer.
  std::erase_if(lease.slots, [&](uint32_t x) { return std::binary_search(committed.begin(), committed.end(), x); });
  account.Unleased(static_cast<uint32_t>(committed.size() - done.duplicate_slots.size()));
  GiveBackAfter(writer, std::move(done.duplicate_slots), &account, std::move(done.written), /*writes=*/true);
  stats.committed_blocks += done.result.stored;
  stats.duplicate_blocks += done.result.duplicates;
}

Result<Engine::Impl::Committed> Engine::Impl::CommitChecked(const CommitRequest& c, bool adopt, GpuWork& writer,
                                                            uint32_t* adopted) {
  Result<WriteSlots*> found = CommitLease(c);
  if (!found.ok()) return found.status();
  WriteSlots& lease = **found;
  std::vector<uint32_t> committed;  // The slots, sorted.
  KVTIER_RETURN_IF_ERROR(CheckCommitSlots(c, lease, &committed));
  std::optional<std::vector<uint32_t>> chain;  // The cached prefix the session takes, if it must.
  if (adopt && !SessionContinues(c)) {
    auto walked = CachedChain(c, *lease.tenant);
    if (!walked.ok()) return walked.status();
    chain = std::move(*walked);
  }
  KVTIER_RETURN_IF_ERROR(CheckCommitPlace(c, chain.has_value()));
  KVTIER_RETURN_IF_ERROR(MakeCommitQuotaRoom(c, *lease.tenant));
  ++clock;
  Committed done = ChainCommitted(c, *lease.tenant, chain ? &*chain : nullptr);
  HandOverCommitted(lease, committed, done, std::exchange(writer, GpuWork{}));
  *adopted = chain ? static_cast<uint32_t>(chain->size()) : 0;
  return done;
}

Result<CommitResult> Engine::Commit(LeaseId lease_id, const Tenant& tenant, std::string_view session_id,
                                    const BlockKey& parent, uint32_t start_block, std::span<const TokenId> tokens,
                                    std::span<const uint32_t> slots, GpuWork writer) {
  Impl& impl = *impl_;
  // The watch is the engine's from here: ended on every early return.
  const Impl::WatchOwner owner{impl, writer};
  const Impl::CommitRequest c{lease_id,    tenant, session_id, parent,
                              start_block, tokens, slots,      tokens.size() / impl.bt()};
  uint32_t adopted = 0;
  auto done = impl.CommitChecked(c, /*adopt=*/false, writer, &adopted);
  if (!done.ok()) return done.status();
  return done->result;
}

// --- Saving: a commit that may adopt its prefix, and refills its lease -----------------------

WriteLease Engine::Impl::Regrant(LeaseId id, uint32_t target) {
  std::optional<Lease> old = leases.Take(id);
  WriteSlots held = std::get<WriteSlots>(std::move(old->held));
  TenantAccount& account = *held.tenant;
  SlotAllocator& gpu = slots(Tier::kGpu);
  uint32_t add = target > held.slots.size() ? target - static_cast<uint32_t>(held.slots.size()) : 0;
  add = std::min(add, gpu.free_count());
  if (account.Room(Tier::kGpu) != kNoQuota) add = std::min(add, account.Room(Tier::kGpu));
  // While tenants contend for the tier, spare slots are not held ahead of need.
  if (gpu_share.contended(GpuShare::Clock::now())) add = 0;
  for (uint32_t i = 0; i < add; ++i) held.slots.push_back(gpu.Allocate());
  account.Leased(add);
  WriteLease out;
  if (held.slots.empty()) return out;
  out.slots = held.slots;
  out.id = leases.Grant(std::move(held));
  return out;
}

Result<SaveResult> Engine::Save(LeaseId lease_id, const Tenant& tenant, std::string_view session_id,
                                const BlockKey& parent, uint32_t start_block, std::span<const TokenId> tokens,
                                std::span<const uint32_t> slots, const SaveOptions& options, GpuWork writer) {
  Impl& impl = *impl_;
  const Impl::WatchOwner owner{impl, writer};  // As Commit's.
  const Impl::CommitRequest c{lease_id,    tenant, session_id, parent,
                              start_block, tokens, slots,      tokens.size() / impl.bt()};
  SaveResult out;
  auto done = impl.CommitChecked(c, options.adopt, writer, &out.adopted);
  if (!done.ok()) return done.status();
  out.committed = done->result;
  out.last = done->last;
  out.lease = impl.Regrant(lease_id, options.refill);
  return out;
}

}  // namespace kvtier::tiering
