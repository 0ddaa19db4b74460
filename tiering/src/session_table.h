// SessionTable: the sessions of one engine, keyed by (tenant, id), the
// eviction policy that orders them, and their priority deadlines.
//
// It owns the Session objects and keeps each tenant's session count; what a
// session's chain references is the engine's business (a session is removed
// only once its chain is empty). Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
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
  Session* Find(const Namespace& ns, std::string_view id) const;
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
  // Every session, coldest first.
  std::vector<Session*> ColdestFirst() const;
  // Visits coldest first until `visit` returns false; see EvictionPolicy.
  template <typename F>
  void VisitColdest(F&& visit) const {
    policy_->VisitColdest(visit);
  }
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [key, s] : sessions_) f(*s);
  }

 private:
  struct Key {
    Namespace ns;
    std::string id;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return NamespaceHash{}(k.ns) ^ (std::hash<std::string>{}(k.id) * 0x9e3779b97f4a7c15ULL);
    }
  };
  // Priority deadlines, earliest on top. An entry whose session is gone or has
  // another deadline by now is stale and skipped.
  struct Expiry {
    std::chrono::steady_clock::time_point at;
    Key session;
    bool operator>(const Expiry& o) const { return at > o.at; }
  };

  std::unordered_map<Key, std::unique_ptr<Session>, KeyHash> sessions_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> expiries_;

  // Rebuilds the queue from the live deadlines once stale entries outnumber them.
  void CompactDeadlines();
};

}  // namespace kvtier::tiering
