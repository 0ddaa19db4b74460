// The session requests: evict (a session, a tenant's, all), end one (its
// blocks kept), set a session's priority, list sessions page by page, and one
// session's chain with where each block lies (the GPU, the host, or the store
// below that holds it).
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "log.h"
#include "service/service.h"
#include "stores/store_factory.h"

namespace kvtier::daemon {

using tiering::Engine;

Result<Reply> Service::On(ClientState& c, const wire::EvictRequest& m) {
  const auto profile = c.profile;
  if (m.all && !c.admin) {
    return Status(StatusCode::kPermissionDenied, "evict --all is for admins (access.admin_users / admin_groups); " +
                                                     c.peer.Describe() + " is not an admin");
  }
  if (!m.session.empty()) {
    // With a tenant too: that tenant's session (admins only, unless it is the client's own).
    auto tenant = TenantToActOn(c, m.tenant, "evict a session");
    if (!tenant.ok()) return tenant.status();
    Engine& e = engines_.Of(profile, *tenant);
    const Status st = e.Evict(TenantNamed(*tenant, e), m.session);
    if (!st.ok()) return st;
    LogInfo("client " + std::to_string(c.id) + " evicted session '" + m.session + "' of tenant '" + *tenant + "'");
    return Reply{wire::CountResponse{1}};
  }
  if (!m.all && m.tenant.empty()) return InvalidArgument("evict needs a session, a tenant or all");
  if (!m.all) {
    auto tenant = TenantToActOn(c, m.tenant, "evict the sessions");
    if (!tenant.ok()) return tenant.status();
  }
  // One tenant's sessions are one range of its engine's table: only that range is walked.
  uint32_t n = 0;
  if (m.all) {
    for (size_t i = engines_.First(profile); i < engines_.Last(profile); ++i) {
      n += engines_[i].engine->EvictSessions(std::nullopt);
    }
  } else {
    Engine& e = engines_.Of(profile, m.tenant);
    n = e.EvictSessions(TenantNamed(m.tenant, e).ns);
  }
  LogInfo("client " + std::to_string(c.id) + " evicted " + std::to_string(n) + " sessions (" +
          (m.all ? std::string("all") : "tenant '" + m.tenant + "'") + ")");
  return Reply{wire::CountResponse{n}};
}

Result<Reply> Service::On(ClientState& c, const wire::EndSessionRequest& m) {
  auto r = EngineOf(c).EndSession(TenantOf(c), m.session);
  if (!r.ok()) return r.status();
  return Reply{wire::CountResponse{*r}};
}

Result<Reply> Service::On(ClientState& c, const wire::SetPriorityRequest& m) {
  if (m.ttl_ms > static_cast<uint64_t>(std::chrono::milliseconds(tiering::kMaxPriorityTtl).count())) {
    return InvalidArgument("priority ttl of " + std::to_string(m.ttl_ms) + " ms exceeds " +
                           std::to_string(tiering::kMaxPriorityTtl.count()) + " hours");
  }
  const auto ttl = std::chrono::milliseconds(static_cast<int64_t>(m.ttl_ms));
  const Status st = EngineOf(c).SetPriority(TenantOf(c), m.session, m.priority, ttl);
  if (!st.ok()) return st;
  if (m.ttl_ms > 0) {
    LogInfo("client " + std::to_string(c.id) + " set session '" + m.session + "' to priority " +
            std::to_string(m.priority) + " for " + std::to_string(m.ttl_ms) + " ms");
  }
  return Reply{wire::OkResponse{}};
}

wire::SessionSummary Service::Summarize(const tiering::SessionInfo& s) const {
  wire::SessionSummary out;
  out.tenant = s.tenant;
  out.id = s.id;
  out.priority = s.priority;
  out.last_use_ms_ago = s.idle_ms;
  out.blocks = s.blocks;
  out.gpu_blocks = s.blocks_in[Tier::kGpu];
  out.host_blocks = s.blocks_in[Tier::kHost];
  out.moving = s.moving;
  out.tokens = s.tokens;
  out.model = s.model;
  return out;
}

Result<Reply> Service::On(ClientState& c, const wire::ListSessionsRequest& m) {
  // A client sees its own tenant's sessions; an admin every tenant's (or one's).
  std::string only = m.tenant_filter;
  if (!c.admin) {
    auto tenant = TenantToActOn(c, m.tenant_filter, "list the sessions");
    if (!tenant.ok()) return tenant.status();
    only = *tenant;
  }
  const auto profile = c.profile;
  tiering::SessionPageLimits limits;
  limits.row_bytes = wire::EncodedSize(SessionSummary{});
  std::optional<tiering::SessionCursor> after;
  // The engines listed: one tenant's, or (an admin's whole listing) every
  // engine of the profile in set order, resuming in the cursor's tenant's.
  size_t first = engines_.IndexOf(profile, only), last = first + 1;
  if (only.empty() && c.admin) {
    first = engines_.First(profile);
    last = engines_.Last(profile);
  }
  if (m.page) {
    limits.sessions = m.page->limit == 0 ? kSessionsPerPage : std::min<size_t>(m.page->limit, kSessionsPerPage);
    limits.bytes = kPageBytes;
    limits.chain_blocks = kPageChainBlocks;
    if (!m.page->after_id.empty()) {
      const size_t resume = engines_.IndexOf(profile, m.page->after_tenant);
      if (resume < first || resume >= last) return Reply{wire::ListSessionsResponse{}};  // Nothing after it here.
      first = resume;
      after = tiering::SessionCursor{TenantNamed(m.page->after_tenant, *engines_[resume].engine).ns, m.page->after_id};
    }
  } else {
    // The older request gets every session in one reply, or an error: never a
    // cut list (the client could not tell), never a frame it cannot take.
    limits.sessions = wire::kMaxArray;
    limits.bytes = wire::kMaxPayload - 4;  // Less the array's count.
    limits.chain_blocks = kUnpagedChainBlocks;
  }
  tiering::SessionPage page;
  for (size_t i = first; i < last; ++i) {
    const Engine& e = *engines_[i].engine;
    std::optional<Namespace> filter;  // One tenant's range of the table, or all of it.
    if (!c.admin || !only.empty()) filter = TenantNamed(only, e).ns;
    tiering::SessionPage part = e.ListSessions(filter, i == first ? after : std::nullopt, limits);
    for (const tiering::SessionInfo& s : part.sessions) {
      limits.bytes -= std::min(limits.bytes, limits.row_bytes + s.id.size() + s.tenant.size());
      limits.chain_blocks -= std::min<uint64_t>(limits.chain_blocks, s.blocks);
    }
    limits.sessions -= std::min(limits.sessions, part.sessions.size());
    if (page.sessions.empty()) {
      page.sessions = std::move(part.sessions);  // The usual case: one engine, no copy.
    } else {
      page.sessions.insert(page.sessions.end(), std::make_move_iterator(part.sessions.begin()),
                           std::make_move_iterator(part.sessions.end()));
    }
    // A full page with engines still to list: the next page resumes after its last row.
    const bool full = limits.sessions == 0 || limits.bytes <= limits.row_bytes || limits.chain_blocks == 0;
    if (part.more || (full && i + 1 < last)) {
      page.more = true;
      break;
    }
  }
  if (!m.page && page.more) {
    return ResourceExhausted("the sessions do not fit one reply (more than " + std::to_string(page.sessions.size()) +
                             " of them); list them page by page (cachectl sessions, or libkvtier's ListSessions, "
                             "which page with ListSessionsRequest.page)");
  }
  wire::ListSessionsResponse out;
  out.sessions.reserve(page.sessions.size());
  for (const tiering::SessionInfo& s : page.sessions) out.sessions.push_back(Summarize(s));
  out.more = m.page.has_value() && page.more;
  return Reply{std::move(out)};
}

Result<Reply> Service::On(ClientState& c, const wire::SessionInfoRequest& m) {
  const Engine& e = EngineOf(c);
  auto r = e.GetSession(TenantOf(c), m.session);
  if (!r.ok()) {
    store_waits_.Cancel(c);
    return r.status();
  }
  std::vector<BlockKey> away;  // Dropped into the stores, held by no local tier.
  for (size_t i = 0; i < r->below.size(); ++i) {
    if (!r->below_local[i]) away.push_back(r->below[i]);
  }
  std::unordered_map<BlockKey, uint8_t, BlockKeyHash> places;  // Of `away`, as the stores said in time.
  if (!away.empty() && store_waits_.SessionInfoWaits(c, e, away, places)) return Reply::Deferred();
  wire::SessionInfoResponse out;
  out.summary = Summarize(*r);
  out.chain = r->chain;
  for (Tier t : r->tiers) out.tiers.push_back(static_cast<uint8_t>(t));
  for (size_t i = 0; i < r->below.size(); ++i) {
    out.chain.push_back(r->below[i]);
    uint8_t place = kPlaceUnknown;
    if (r->below_local[i]) {
      place = static_cast<uint8_t>(*r->below_local[i]);
    } else if (auto it = places.find(r->below[i]); it != places.end()) {
      place = it->second;
    }
    out.tiers.push_back(place);
  }
  out.stores = StoreNames(config_.stores);
  return Reply{std::move(out)};
}

}  // namespace kvtier::daemon
