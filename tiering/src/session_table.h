// SessionTable: the sessions of one engine, keyed by (tenant, id), the
// eviction policy that orders them (knowing each by a SessionHandle the table
// assigns), and their priority deadlines.
//
// It owns the Session objects and keeps each tenant's session count; what a
// session's chain references is the engine's business (a session is removed
// only once its chain is empty). The sessions are kept in key order (tenant
// namespace, then id), so one tenant's sessions are one range: a listing or an
// eviction of one tenant walks that range alone, and a listing resumes after
// any key. Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tiering/policy.h"
#include "session.h"
#include "tenant_ledger.h"

namespace kvtier::tiering {

class SessionTable {
 public:
  explicit SessionTable(std::unique_ptr<EvictionPolicy> policy);
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  size_t size() const { return sessions_.size(); }
  // Tenants holding at least one session.
  size_t tenants_holding() const { return holders_.size(); }
  // The tenant holding the most sessions (nullptr if none); O(1).
  const TenantAccount* LargestHolder() const { return holders_.empty() ? nullptr : holders_.rbegin()->second; }
  Session* Find(const Namespace& ns, std::string_view id) const;
  // The session the policy knows as `h`. Aborts if there is none: the policy
  // named a session it was never given, or one untracked.
  Session* ByHandle(SessionHandle h) const {
    if (h >= by_handle_.size() || by_handle_[h] == nullptr) std::abort();
    return by_handle_[h];
  }
  // A new, empty session of `tenant`, tracked by the policy. REQUIRES: absent.
  Session* Add(TenantAccount& tenant, std::string_view id);
  // REQUIRES: s->chain is empty.
  void Remove(Session* s);

  // Marks `s` used at engine clock `clock`: it becomes the warmest of its priority.
  void Touch(Session* s, uint64_t clock);
  // Sets the priority; with a deadline (not the epoch) it goes back to 0 at the
  // first Expire at or after it.
  void SetPriority(Session* s, int priority, std::chrono::steady_clock::time_point until);
  // Sets priorities whose deadline passed by `now` back to 0. Returns how many.
  uint32_t Expire(std::chrono::steady_clock::time_point now);
  // Deadlines queued, stale ones included: at most 2 x sessions + 64, however
  // often priorities are set or sessions go.
  size_t pending_deadlines() const { return expiries_.size(); }

  // The coldest session (nullptr if none).
  Session* Coldest() const;
  // The coldest session of `tenant` (nullptr if it has none): the policy's
  // order, walked from the coldest until one of the tenant's.
  Session* ColdestOf(const TenantAccount& tenant) const;
  // Every session, coldest first.
  std::vector<Session*> ColdestFirst() const;
  // Visits coldest first until `visit` returns false; see EvictionPolicy.
  template <typename F>
  void VisitColdest(F&& visit) const {
    policy_->VisitColdest([&](SessionHandle h) { return visit(ByHandle(h)); });
  }
  // Every session, in key order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [key, s] : sessions_) f(*s);
  }
  // In key order, the sessions of the tenant with namespace `only` (every
  // tenant's when nullopt) whose key comes after (after_ns, after_id) when
  // `after_ns` is given, until `visit(Session&)` returns false. Visits only
  // that range: O(log n) to find its start, then one step per session visited.
  // `visit` must not add or remove sessions.
  template <typename F>
  void VisitInOrder(const std::optional<Namespace>& only, const std::optional<Namespace>& after_ns,
                    std::string_view after_id, F&& visit) const {
    auto it = only ? sessions_.lower_bound(KeyRef{*only, std::string_view()}) : sessions_.begin();
    if (after_ns) {
      // The later of the range's start and the first key after the cursor.
      const auto resume = sessions_.upper_bound(KeyRef{*after_ns, after_id});
      if (resume == sessions_.end() || it == sessions_.end() || KeyLess{}(it->first, resume->first)) it = resume;
    }
    for (; it != sessions_.end(); ++it) {
      if (only && !(it->first.ns == *only)) return;
      if (!visit(*it->second)) return;
    }
  }

 private:
  struct Key {
    Namespace ns;
    std::string id;
  };
  // A key to look up without copying the id.
  struct KeyRef {
    const Namespace& ns;
    std::string_view id;
  };
  // (namespace, id) order; transparent, so lookups take a KeyRef.
  struct KeyLess {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return std::tie(a.ns.id.hi, a.ns.id.lo) < std::tie(b.ns.id.hi, b.ns.id.lo) ||
             (a.ns == b.ns && std::string_view(a.id) < std::string_view(b.id));
    }
  };
  // Priority deadlines, earliest on top. An entry whose session is gone or has
  // another deadline by now is stale and skipped.
  struct Expiry {
    std::chrono::steady_clock::time_point at;
    Key session;
    bool operator>(const Expiry& o) const { return at > o.at; }
  };

  std::map<Key, std::unique_ptr<Session>, KeyLess> sessions_;
  // The tenants holding sessions, by how many (kept as sessions come and go).
  std::set<std::pair<uint32_t, const TenantAccount*>> holders_;
  std::unique_ptr<EvictionPolicy> policy_;
  // Each session by its handle, which is its index here; handles of removed
  // sessions are given to new ones (free_handles_), so this stays as long as
  // the most sessions ever held at once.
  std::vector<Session*> by_handle_;
  std::vector<SessionHandle> free_handles_;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> expiries_;

  // Rebuilds the queue from the live deadlines once stale entries outnumber them.
  void CompactDeadlines();
  SessionHandle NewHandle(Session* s);
};

}  // namespace kvtier::tiering
