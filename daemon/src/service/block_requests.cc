// The block requests: allocate and commit, or save (a write), acquire (or locate:
// an acquire that leases nothing) and release (a read).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "service/service.h"

namespace kvtier::daemon {

using tiering::Engine;

Result<Reply> Service::On(ClientState& c, const wire::AllocateRequest& m) {
  if (c.leases.size() >= config_.max_leases_per_client) {
    return ResourceExhausted("client holds " + std::to_string(c.leases.size()) +
                             " leases, the limit (limits.max_leases_per_client)");
  }
  Engine& e = EngineOf(c);
  // The slots count against the client's tenant's GPU quota until committed.
  auto r = e.TryAllocate(TenantOf(c), m.count);
  if (r.ok() && !r->has_value()) {
    if (MayWaitForRoom(c)) return Reply::Deferred();
    // Waited long enough: answer with what there is now (it may drop or fail).
    r = e.TryAllocate(TenantOf(c), m.count, /*may_wait=*/false);
  }
  if (!r.ok()) return r.status();
  tiering::WriteLease& w = **r;
  c.leases.insert(w.id);
  return Reply{wire::AllocateResponse{w.id, std::move(w.slots)}};
}

Result<tiering::GpuWork> Service::CommitWriter(const ClientState& c, uint64_t lease_id,
                                               const std::optional<wire::IpcEventHandle>& event, const char* what) {
  if (!c.leases.count(lease_id)) return NotFound("lease " + std::to_string(lease_id) + " is not yours");
  if (!event && backend_->kind() == tiering::BackendKind::kCuda) ++counters_.gpu_commits_without_writer_event;
  return WatchClientWork(c, event, what);
}

Result<Reply> Service::On(ClientState& c, const wire::CommitRequest& m) {
  auto writer = CommitWriter(c, m.lease_id, m.writer_event, "commit");
  if (!writer.ok()) return writer.status();
  Engine& e = EngineOf(c);
  auto r = e.Commit(m.lease_id, TenantOf(c), m.session, m.parent, m.start_block, m.tokens, m.slots, *writer);
  if (!r.ok()) {
    if (e.LeaseExpired(m.lease_id)) NoteExpiredLease(c, m.lease_id, "committed");
    return r.status();
  }
  TenantTraffic& t = tenants_.traffic(c.tenant, c.profile);
  t.saved_blocks += r->stored;
  // Room ahead of demand: a commit that crossed the GPU high watermark starts
  // the demotions now, not at the next tick, so the next Allocate finds room.
  e.EnforceWatermarks();
  return Reply{wire::CommitResponse{r->stored, r->duplicates}};
}

Result<Reply> Service::On(ClientState& c, const wire::SaveRequest& m) {
  auto writer = CommitWriter(c, m.lease_id, m.writer_event, "save");
  if (!writer.ok()) return writer.status();
  Engine& e = EngineOf(c);
  const tiering::SaveOptions options{.adopt = (m.flags & wire::kSaveAdopt) != 0, .refill = m.refill};
  auto r = e.Save(m.lease_id, TenantOf(c), m.session, m.parent, m.start_block, m.tokens, m.slots, options, *writer);
  if (!r.ok()) {
    if (e.LeaseExpired(m.lease_id)) NoteExpiredLease(c, m.lease_id, "saved");
    return r.status();
  }
  // The lease was granted again under a new id (or ended, holding nothing).
  c.leases.erase(m.lease_id);
  if (r->lease.id != 0) c.leases.insert(r->lease.id);
  TenantTraffic& t = tenants_.traffic(c.tenant, c.profile);
  t.saved_blocks += r->committed.stored;
  e.EnforceWatermarks();  // As a commit's.
  const auto ttl = config_.engine.lease_timeout.count();
  return Reply{wire::SaveResponse{r->committed.stored, r->committed.duplicates, r->adopted, r->last, r->lease.id,
                                  static_cast<uint32_t>(std::min<int64_t>(ttl, UINT32_MAX)),
                                  std::move(r->lease.slots)}};
}

Result<Reply> Service::On(ClientState& c, const wire::AcquireRequest& m) {
  auto r = Acquire(c, m);
  TenantTraffic& t = tenants_.traffic(c.tenant, c.profile);
  if (!r.ok()) {
    ++t.read_errors;
  } else if (const auto* a = std::get_if<wire::AcquireResponse>(&r->message); a != nullptr && a->lease_id != 0) {
    t.read_blocks += a->blocks.size();
    c.reading[a->lease_id] = std::chrono::steady_clock::now();
  }
  return r;
}

Result<Reply> Service::Acquire(ClientState& c, const wire::AcquireRequest& m) {
  const bool locate = (m.flags & wire::kAcquireLocate) != 0;  // Leases nothing (no promote bits: checked at decode).
  if (!locate && c.leases.size() >= config_.max_leases_per_client) {
    return ResourceExhausted("client holds " + std::to_string(c.leases.size()) +
                             " leases, the limit (limits.max_leases_per_client)");
  }
  bool promote = (m.flags & wire::kAcquirePromote) != 0;
  Engine& e = EngineOf(c);
  tiering::PrefixMatch match;  // The prefix is walked once for this pass's calls, while no block changes.
  if (store_waits_.AcquireWaits(c, m, e, tenants_.connected(), &match)) return Reply::Deferred();
  if (promote && e.AcquireNeedsRoom(c.ns, m.keys, m.tokens, c.model, &match)) {
    if (MayWaitForRoom(c)) return Reply::Deferred();
    // Waited long enough: lease the blocks where they are (readable in the host tier) rather than wait on.
    promote = false;
  }
  tiering::FetchedBlocks fetched;
  const std::optional<ClientState::StoreFetch> fetch = std::exchange(c.fetch, std::nullopt);
  if (fetch && fetch->result && fetch->result->blocks() > 0) {
    fetched.start = fetch->start;
    fetched.payloads = fetch->result->payloads;
  }
  // A locate's blocks are held by a session named after the prefix, ended at
  // once: they stay cached as an ended session's do, until pressure drops them.
  const std::string session = locate && !m.keys.empty() ? "locate:" + m.keys.back().ToHex() : m.session;
  auto r =
      e.Acquire(TenantOf(c), session, m.keys, m.tokens, promote, fetched.payloads.empty() ? nullptr : &fetched, &match);
  if (!r.ok()) return r.status();
  if (locate) {  // What the stores held is in the host tier now; nothing stays pinned.
    if (r->id != 0) (void)e.Release(r->id);
    if (r->matched > 0) (void)e.EndSession(TenantOf(c), session);
    wire::AcquireResponse out;
    out.matched = r->matched;
    return Reply{std::move(out)};
  }
  if (r->id != 0) c.leases.insert(r->id);
  // Read where they lie now, promoted once released.
  if (r->id != 0 && (m.flags & wire::kAcquirePromoteAfterRead) != 0) (void)e.PromoteOnRelease(r->id);
  wire::AcquireResponse out;
  out.lease_id = r->id;
  out.matched = r->matched;
  out.promoted = r->promoted;
  out.fence = r->fence;
  out.blocks.reserve(r->blocks.size());
  for (const auto& b : r->blocks) out.blocks.push_back(wire::BlockLoc{b.tier, b.slot});
  return Reply{std::move(out)};
}

Result<Reply> Service::On(ClientState& c, const wire::ReleaseRequest& m) {
  if (!c.leases.count(m.lease_id)) return NotFound("lease " + std::to_string(m.lease_id) + " is not yours");
  auto after = WatchClientWork(c, m.after_event, "release");
  if (!after.ok()) return after.status();  // The lease stays the client's: it may release it again.
  c.leases.erase(m.lease_id);
  Engine& e = EngineOf(c);
  const bool expired = e.LeaseExpired(m.lease_id);
  if (auto it = c.reading.find(m.lease_id); it != c.reading.end()) {
    TenantTraffic& t = tenants_.traffic(c.tenant, c.profile);
    if (expired) {
      ++t.read_errors;
    } else {
      ++t.read_leases;
      t.read_lease_us += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - it->second).count());
    }
    c.reading.erase(it);
  }
  // A lease the timeout revoked is forgotten now, with an error saying so.
  if (expired) NoteExpiredLease(c, m.lease_id, "released");
  const Status st = e.Release(m.lease_id, *after);
  if (!st.ok()) return st;
  return Reply{wire::OkResponse{}};
}

}  // namespace kvtier::daemon
