// The engine's sessions: creating, touching, cutting and removing them (the
// bookkeeping every request shares), and the session API (evict, demote,
// prefetch, priorities, listings).
#include <algorithm>
#include <chrono>
#include <tuple>

#include "engine_impl.h"

namespace kvtier::tiering {
namespace {

Status NoSession(std::string_view id) { return NotFound("session '" + std::string(id) + "' does not exist"); }

}  // namespace

Session* Engine::Impl::GetOrCreateSession(const Tenant& t, std::string_view id) {
  if (Session* s = FindSession(t, id)) return s;
  TenantAccount& account = tenants.Get(t);
  if (sessions.size() >= options.max_sessions) {
    if (Session* victim = SessionToEvictFor(account)) RemoveSession(victim, SessionEnd::kEvicted);
  }
  return sessions.Add(account, id);
}

Session* Engine::Impl::SessionToEvictFor(const TenantAccount& t) const {
  // The tenants holding sessions once `t` holds one, and the share of each.
  const size_t holders = sessions.tenants_holding() + (t.sessions == 0 ? 1 : 0);
  const uint32_t share = std::max<uint32_t>(1, static_cast<uint32_t>(options.max_sessions / holders));
  const TenantAccount* from = &t;
  // Below its share, so the table being full, some tenant holds more than its
  // own: the one holding the most gives up its coldest.
  if (t.sessions < share && sessions.LargestHolder() != nullptr) from = sessions.LargestHolder();
  if (Session* s = sessions.ColdestOf(*from)) return s;
  return sessions.Coldest();
}

Status Engine::Impl::CheckNewSession(const Tenant& t, std::string_view id) {
  if (options.max_sessions_per_tenant == 0 || FindSession(t, id) != nullptr) return Status::Ok();
  TenantAccount& account = tenants.Get(t);
  Status status = tenants.CheckNewSession(account, id, options.max_sessions_per_tenant);
  if (status.ok()) return status;
  // At its limit, the tenant's coldest session that its client ended, or
  // that holds no block (only the keys of those dropped into the stores),
  // makes room for the new one.
  Session* spare = nullptr;
  sessions.VisitColdest([&](Session* s) {
    if (s->tenant == &account && (s->ended || s->chain.empty())) spare = s;
    return spare == nullptr;
  });
  if (spare == nullptr) return status;
  RemoveSession(spare, SessionEnd::kEvicted);
  return Status::Ok();
}

void Engine::Impl::Touch(Session* s) {
  ++changes;
  s->ended = false;
  sessions.Touch(s, clock);
}

void Engine::Impl::Truncate(Session* s, size_t n, FreeReason why) {
  if (s->chain.size() > n) s->below.clear();
  while (s->chain.size() > n) {
    const uint32_t r = s->chain.back();
    s->chain.pop_back();
    Unref(r, why);
  }
}

std::vector<BlockKey> Engine::Impl::ChainAndBelow(const Session& s) const {
  std::vector<BlockKey> keys;
  keys.reserve(s.chain.size() + s.below.size());
  for (uint32_t r : s.chain) keys.push_back(blocks[r].key);
  keys.insert(keys.end(), s.below.begin(), s.below.end());
  return keys;
}

void Engine::Impl::ReconcileBelow(Session* s, const std::vector<BlockKey>& before) const {
  const size_t n = s->chain.size();
  bool continues = n < before.size();
  for (size_t i = 0; continues && i < n; ++i) continues = blocks[s->chain[i]].key == before[i];
  if (continues) {
    s->below.assign(before.begin() + static_cast<std::ptrdiff_t>(n), before.end());
  } else {
    s->below.clear();
  }
}

void Engine::Impl::RemoveSession(Session* s, SessionEnd why) {
  ++changes;
  Truncate(s, 0, FreeReason::kReleased);
  if (why == SessionEnd::kEvicted) {
    ++stats.evicted_sessions;
    if (options.on_session_evicted) options.on_session_evicted(s->tenant->tenant.name, s->id);
  }
  sessions.Remove(s);
}

Status Engine::Evict(const Tenant& tenant, std::string_view session_id) {
  Session* s = impl_->FindSession(tenant, session_id);
  if (s == nullptr) return NoSession(session_id);
  impl_->RemoveSession(s, SessionEnd::kEvicted);
  return Status::Ok();
}

Result<uint32_t> Engine::EndSession(const Tenant& tenant, std::string_view session_id) {
  Impl& impl = *impl_;
  Session* s = impl.FindSession(tenant, session_id);
  if (s == nullptr) return NoSession(session_id);
  ++impl.stats.ended_sessions;
  ++impl.changes;
  // Chains are prefixes from block 0 (every block names its parent), so a
  // session holding this chain's last block holds all of it.
  if (s->chain.empty() || impl.blocks[s->chain.back()].refs > 1) {
    impl.RemoveSession(s, SessionEnd::kEmptied);
    return 0u;
  }
  s->ended = true;
  return static_cast<uint32_t>(s->chain.size());
}

Result<uint32_t> Engine::Demote(const Tenant& tenant, std::string_view session_id) {
  Impl& impl = *impl_;
  Session* s = impl.FindSession(tenant, session_id);
  if (s == nullptr) return NoSession(session_id);
  uint32_t want = 0;
  for (uint32_t r : s->chain) want += impl.blocks[r].IdleIn(Tier::kGpu) ? 1 : 0;
  impl.reclaim.MakeHostRoomFor(s, want);
  uint32_t scheduled = 0;
  for (uint32_t r : s->chain) {  // The session may have lost blocks to the drop above.
    if (impl.slots(Tier::kHost).free_count() == 0 || s->tenant->Room(Tier::kHost) == 0) break;
    if (impl.blocks[r].IdleIn(Tier::kGpu)) {
      impl.mover.Schedule(r, CopyDirection::kGpuToHost);
      ++scheduled;
    }
  }
  impl.Flush(CopyDirection::kGpuToHost);
  return scheduled;
}

Result<uint32_t> Engine::Prefetch(const Tenant& tenant, std::string_view session_id) {
  Impl& impl = *impl_;
  Session* s = impl.FindSession(tenant, session_id);
  if (s == nullptr) return NoSession(session_id);
  ++impl.clock;
  uint32_t scheduled = 0;
  for (uint32_t r : s->chain) {
    Record& rec = impl.blocks[r];
    rec.last_use = impl.clock;
    if (!rec.IdleIn(Tier::kHost)) continue;
    if (impl.slots(Tier::kGpu).free_count() == 0 || rec.tenant->Room(Tier::kGpu) == 0) break;
    impl.mover.Schedule(r, CopyDirection::kHostToGpu);
    ++scheduled;
  }
  impl.Touch(s);
  impl.Flush(CopyDirection::kHostToGpu);
  return scheduled;
}

Status Engine::SetPriority(const Tenant& tenant, std::string_view session_id, int priority,
                           std::chrono::milliseconds ttl) {
  if (priority < kMinPriority || priority > kMaxPriority) {
    return InvalidArgument("priority " + std::to_string(priority) + " not in [0, 7]");
  }
  if (ttl.count() < 0 || ttl > kMaxPriorityTtl) {
    return InvalidArgument("priority ttl of " + std::to_string(ttl.count()) + " ms not in [0, " +
                           std::to_string(std::chrono::milliseconds(kMaxPriorityTtl).count()) + "]");
  }
  Session* s = impl_->FindSession(tenant, session_id);
  if (s == nullptr) return NoSession(session_id);
  ++impl_->changes;
  const auto until = ttl.count() > 0 ? std::chrono::steady_clock::now() + ttl : std::chrono::steady_clock::time_point{};
  impl_->sessions.SetPriority(s, priority, until);
  return Status::Ok();
}

uint32_t Engine::ExpirePriorities(std::chrono::steady_clock::time_point now) {
  const uint32_t expired = impl_->sessions.Expire(now);
  impl_->stats.expired_priorities += expired;
  return expired;
}

namespace {

SessionInfo Describe(const Session& s, const BlockTable& blocks, uint32_t block_tokens, bool detail) {
  SessionInfo info;
  info.tenant = s.tenant->tenant.name;
  info.ns = s.tenant->tenant.ns;
  info.id = s.id;
  info.priority = s.priority;
  info.ended = s.ended;
  info.last_use = s.last_use;
  info.idle_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - s.used_at).count());
  info.blocks = static_cast<uint32_t>(s.chain.size());
  info.tokens = uint64_t{info.blocks} * block_tokens;
  info.blocks_below = static_cast<uint32_t>(s.below.size());
  // A chain is keyed in one model's namespace.
  info.model = s.chain.empty() ? s.below_model : blocks[s.chain.front()].model;
  for (uint32_t r : s.chain) {
    const Record& rec = blocks[r];
    ++info.blocks_in[rec.tier];
    if (rec.moving()) ++info.moving;
    if (detail) {
      info.chain.push_back(rec.key);
      info.tiers.push_back(rec.tier);
    }
  }
  if (detail) {
    info.below = s.below;
    for (const BlockKey& key : s.below) {
      const uint32_t r = blocks.index().Find(key);
      info.below_local.push_back(r == kNoRecord ? std::nullopt : std::optional<Tier>(blocks[r].tier));
    }
  }
  return info;
}

}  // namespace

Result<SessionInfo> Engine::GetSession(const Tenant& tenant, std::string_view session_id) const {
  const Session* s = impl_->FindSession(tenant, session_id);
  if (s == nullptr) return NoSession(session_id);
  return Describe(*s, impl_->blocks, impl_->bt(), true);
}

SessionPage Engine::ListSessions(const std::optional<Namespace>& tenant, const std::optional<SessionCursor>& after,
                                 const SessionPageLimits& limits) const {
  SessionPage page;
  uint64_t blocks = 0;
  size_t bytes = 0;
  const std::optional<Namespace> after_ns = after ? std::optional<Namespace>(after->ns) : std::nullopt;
  impl_->sessions.VisitInOrder(
      tenant, after_ns, after ? std::string_view(after->id) : std::string_view(), [&](const Session& s) {
        const size_t row = limits.row_bytes + s.id.size() + s.tenant->tenant.name.size();
        if (!page.sessions.empty() && (page.sessions.size() >= limits.sessions ||
                                       blocks + s.chain.size() > limits.chain_blocks || bytes + row > limits.bytes)) {
          page.more = true;
          return false;
        }
        blocks += s.chain.size();
        bytes += row;
        page.sessions.push_back(Describe(s, impl_->blocks, impl_->bt(), false));
        return true;
      });
  return page;
}

uint32_t Engine::EvictSessions(const std::optional<Namespace>& tenant) {
  std::vector<Session*> doomed;
  impl_->sessions.VisitInOrder(tenant, std::nullopt, {}, [&](Session& s) {
    doomed.push_back(&s);
    return true;
  });
  for (Session* s : doomed) impl_->RemoveSession(s, SessionEnd::kEvicted);
  return static_cast<uint32_t>(doomed.size());
}

std::vector<SessionInfo> Engine::ListSessions() const {
  std::vector<SessionInfo> out;
  out.reserve(impl_->sessions.size());
  impl_->sessions.ForEach([&](const Session& s) { out.push_back(Describe(s, impl_->blocks, impl_->bt(), false)); });
  std::sort(out.begin(), out.end(), [](const SessionInfo& a, const SessionInfo& b) {
    return std::tie(a.tenant, a.id) < std::tie(b.tenant, b.id);
  });
  return out;
}

void Engine::Impl::SetChain(const Tenant& t, std::string_view id, const std::vector<uint32_t>& recs) {
  for (uint32_t r : recs) Ref(r);
  Session* s = GetOrCreateSession(t, id);
  for (uint32_t r : recs) blocks[r].last_use = clock;
  std::vector<BlockKey> before;  // For Session::below, which the new chain may continue.
  if (!s->below.empty()) before = ChainAndBelow(*s);
  std::vector<uint32_t> old = std::move(s->chain);
  s->chain = recs;
  if (!before.empty()) ReconcileBelow(s, before);
  for (auto r = old.rbegin(); r != old.rend(); ++r) Unref(*r, FreeReason::kReleased);
  Touch(s);
}

}  // namespace kvtier::tiering
