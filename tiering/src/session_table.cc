// SessionTable: sessions by (tenant, id), their eviction order and priorities (session_table.h).
#include "session_table.h"

#include <cstdlib>

namespace kvtier::tiering {

SessionTable::SessionTable(std::unique_ptr<EvictionPolicy> policy) : policy_(std::move(policy)) {}

Session* SessionTable::Find(const Namespace& ns, std::string_view id) const {
  auto it = sessions_.find(KeyRef{ns, id});
  return it == sessions_.end() ? nullptr : it->second.get();
}

Session* SessionTable::Add(TenantAccount& tenant, std::string_view id) {
  auto s = std::make_unique<Session>();
  s->tenant = &tenant;
  s->id = std::string(id);
  Session* raw = s.get();
  if (!sessions_.emplace(Key{tenant.tenant.ns, raw->id}, std::move(s)).second) std::abort();
  if (tenant.sessions > 0) holders_.erase({tenant.sessions, &tenant});
  holders_.insert({++tenant.sessions, &tenant});
  raw->handle = NewHandle(raw);
  policy_->Track(raw->handle, raw->priority);
  return raw;
}

SessionHandle SessionTable::NewHandle(Session* s) {
  if (free_handles_.empty()) {
    by_handle_.push_back(s);
    return by_handle_.size() - 1;
  }
  const SessionHandle h = free_handles_.back();
  free_handles_.pop_back();
  by_handle_[h] = s;
  return h;
}

void SessionTable::Remove(Session* s) {
  if (!s->chain.empty()) std::abort();
  policy_->Untrack(s->handle);
  by_handle_[s->handle] = nullptr;
  free_handles_.push_back(s->handle);
  TenantAccount& tenant = *s->tenant;
  holders_.erase({tenant.sessions, &tenant});
  if (--tenant.sessions > 0) holders_.insert({tenant.sessions, &tenant});
  // Found before it is erased: the KeyRef points into the session the erase destroys.
  sessions_.erase(sessions_.find(KeyRef{s->tenant->tenant.ns, s->id}));
  CompactDeadlines();
}

void SessionTable::Touch(Session* s, uint64_t clock) {
  s->last_use = clock;
  s->used_at = std::chrono::steady_clock::now();
  policy_->Touch(s->handle);
}

void SessionTable::SetPriority(Session* s, int priority, std::chrono::steady_clock::time_point until) {
  s->priority = priority;
  s->priority_until = until;
  if (until != std::chrono::steady_clock::time_point{}) {
    expiries_.push(Expiry{until, Key{s->tenant->tenant.ns, s->id}});
    CompactDeadlines();
  }
  policy_->Track(s->handle, priority);
}

void SessionTable::CompactDeadlines() {
  // Each SetPriority with a ttl queues an entry and a replaced one stays until
  // its time: without this, a client resetting a ttl in a loop grows the queue
  // without bound. Amortized O(1): a rebuild follows at least as many pushes.
  if (expiries_.size() <= 2 * sessions_.size() + 64) return;
  std::vector<Expiry> live;
  for (const auto& [key, s] : sessions_) {
    if (s->priority_until != std::chrono::steady_clock::time_point{}) live.push_back(Expiry{s->priority_until, key});
  }
  expiries_ = decltype(expiries_)(std::greater<>{}, std::move(live));
}

uint32_t SessionTable::Expire(std::chrono::steady_clock::time_point now) {
  uint32_t expired = 0;
  while (!expiries_.empty() && expiries_.top().at <= now) {
    const Expiry e = expiries_.top();
    expiries_.pop();
    Session* s = Find(e.session.ns, e.session.id);
    if (s == nullptr || s->priority_until != e.at) continue;
    s->priority = 0;  // What every session starts with.
    s->priority_until = {};
    policy_->Track(s->handle, s->priority);
    ++expired;
  }
  return expired;
}

Session* SessionTable::Coldest() const {
  Session* coldest = nullptr;
  VisitColdest([&](Session* s) {
    coldest = s;
    return false;
  });
  return coldest;
}

Session* SessionTable::ColdestOf(const TenantAccount& tenant) const {
  Session* coldest = nullptr;
  VisitColdest([&](Session* s) {
    if (s->tenant != &tenant) return true;
    coldest = s;
    return false;
  });
  return coldest;
}

std::vector<Session*> SessionTable::ColdestFirst() const {
  std::vector<Session*> out;
  out.reserve(sessions_.size());
  VisitColdest([&](Session* s) {
    out.push_back(s);
    return true;
  });
  return out;
}

}  // namespace kvtier::tiering
