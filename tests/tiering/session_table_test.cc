// SessionTable: sessions by (tenant, id), each tenant's count, the order the
// eviction policy gives them (the engine's LRU policy), listings in key order,
// and priority deadlines.
#include "session_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine_parts_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class SessionTableTest : public ::testing::Test {
 protected:
  TenantAccount& Account(const std::string& name) {
    return tenants_.Get(Tenant::Make(TestProfile().Fingerprint(), name));
  }
  // A new session of `tenant`, used now: the warmest.
  Session* Add(TenantAccount& tenant, std::string_view id) {
    Session* s = table_.Add(tenant, id);
    table_.Touch(s, ++clock_);
    return s;
  }
  std::vector<std::string> Ids(const std::vector<Session*>& sessions) const {
    std::vector<std::string> ids;
    for (const Session* s : sessions) ids.push_back(s->id);
    return ids;
  }
  std::vector<std::string> ColdestFirst() const { return Ids(table_.ColdestFirst()); }
  // Ids visited by VisitInOrder(only, after), at most `max`.
  std::vector<std::string> InOrder(const std::optional<Namespace>& only, const std::optional<Namespace>& after_ns = {},
                                   std::string_view after_id = {}, size_t max = SIZE_MAX) const {
    std::vector<std::string> ids;
    table_.VisitInOrder(only, after_ns, after_id, [&](const Session& s) {
      ids.push_back(s.id);
      return ids.size() < max;
    });
    return ids;
  }

  TenantLedger tenants_;  // Before the table: sessions point at accounts.
  SessionTable table_{MakeLruPolicy()};
  uint64_t clock_ = 0;
};

TEST_F(SessionTableTest, AnEmptyTableHasNoColdestAndNoHolder) {
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.tenants_holding(), 0u);
  EXPECT_EQ(table_.LargestHolder(), nullptr);
  EXPECT_EQ(table_.Coldest(), nullptr);
  EXPECT_EQ(table_.ColdestOf(Account("a")), nullptr);
  EXPECT_TRUE(table_.ColdestFirst().empty());
  EXPECT_TRUE(InOrder(std::nullopt).empty());
  EXPECT_EQ(table_.Find(Account("a").tenant.ns, "x"), nullptr);
  EXPECT_EQ(table_.Expire(steady_clock::now() + std::chrono::hours(1)), 0u);
  EXPECT_EQ(table_.pending_deadlines(), 0u);
}

// A session is its tenant's: the same id under two tenants is two sessions,
// each counted for its own tenant.
TEST_F(SessionTableTest, SessionsAreFoundByTenantAndId) {
  TenantAccount& a = Account("a");
  TenantAccount& b = Account("b");
  Session* sa = Add(a, "chat");
  Session* sb = Add(b, "chat");
  ASSERT_NE(sa, sb);
  EXPECT_EQ(sa->tenant, &a);
  EXPECT_EQ(sa->id, "chat");
  EXPECT_TRUE(sa->chain.empty());
  EXPECT_EQ(sa->priority, 0);
  EXPECT_EQ(table_.Find(a.tenant.ns, "chat"), sa);
  EXPECT_EQ(table_.Find(b.tenant.ns, "chat"), sb);
  EXPECT_EQ(table_.Find(a.tenant.ns, "chat2"), nullptr);
  EXPECT_EQ(table_.size(), 2u);
  EXPECT_EQ(a.sessions, 1u);
  EXPECT_EQ(b.sessions, 1u);

  table_.Remove(sa);
  EXPECT_EQ(table_.Find(a.tenant.ns, "chat"), nullptr);
  EXPECT_EQ(table_.Find(b.tenant.ns, "chat"), sb);
  EXPECT_EQ(table_.size(), 1u);
  EXPECT_EQ(a.sessions, 0u);
  EXPECT_EQ(ColdestFirst(), std::vector<std::string>{"chat"}) << "the policy forgot it too";
  // The id is free again.
  Session* again = Add(a, "chat");
  EXPECT_EQ(table_.Find(a.tenant.ns, "chat"), again);
  EXPECT_EQ(a.sessions, 1u);
}

// The tenant holding the most sessions is known at once, as sessions come and go.
TEST_F(SessionTableTest, TheLargestHolderFollowsTheCounts) {
  TenantAccount& a = Account("a");
  TenantAccount& b = Account("b");
  Add(a, "a1");
  EXPECT_EQ(table_.LargestHolder(), &a);
  EXPECT_EQ(table_.tenants_holding(), 1u);
  Session* b1 = Add(b, "b1");
  Session* b2 = Add(b, "b2");
  Session* b3 = Add(b, "b3");
  EXPECT_EQ(table_.LargestHolder(), &b);
  EXPECT_EQ(table_.tenants_holding(), 2u);
  table_.Remove(b1);
  EXPECT_EQ(table_.LargestHolder(), &b) << "2 sessions to a's 1";
  EXPECT_EQ(table_.tenants_holding(), 2u);
  table_.Remove(b2);
  table_.Remove(b3);
  EXPECT_EQ(table_.LargestHolder(), &a);
  EXPECT_EQ(table_.tenants_holding(), 1u) << "a tenant without sessions holds none";
  EXPECT_EQ(b.sessions, 0u);
}

// Coldest first: least recently touched first within a priority, and a lower
// priority before any higher one.
TEST_F(SessionTableTest, TheColdestComeFirstByPriorityThenLastUse) {
  TenantAccount& a = Account("a");
  TenantAccount& b = Account("b");
  Session* s1 = Add(a, "1");
  Session* s2 = Add(b, "2");
  Session* s3 = Add(a, "3");
  EXPECT_EQ(ColdestFirst(), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(table_.Coldest(), s1);
  table_.Touch(s1, ++clock_);
  EXPECT_EQ(s1->last_use, clock_);
  EXPECT_EQ(ColdestFirst(), (std::vector<std::string>{"2", "3", "1"}));
  EXPECT_EQ(table_.Coldest(), s2);
  EXPECT_EQ(table_.ColdestOf(a), s3) << "walks past the other tenants' colder sessions";
  EXPECT_EQ(table_.ColdestOf(b), s2);

  table_.SetPriority(s2, 3, {});
  EXPECT_EQ(s2->priority, 3);
  EXPECT_EQ(ColdestFirst(), (std::vector<std::string>{"3", "1", "2"}));
  table_.Touch(s3, ++clock_);
  EXPECT_EQ(ColdestFirst(), (std::vector<std::string>{"1", "3", "2"})) << "used, but still below priority 3";

  std::vector<std::string> visited;
  table_.VisitColdest([&](Session* s) {
    visited.push_back(s->id);
    return visited.size() < 2;
  });
  EXPECT_EQ(visited, (std::vector<std::string>{"1", "3"})) << "stops when told";
}

// Listings walk (tenant, id) order whatever the order sessions came in: one
// tenant's sessions are one range, and a listing resumes after any key.
TEST_F(SessionTableTest, ListingsWalkKeyOrderAndResumeAfterAnyKey) {
  TenantAccount& a = Account("a");
  TenantAccount& b = Account("b");
  for (const char* id : {"m", "c", "x", "a"}) Add(a, id);
  for (const char* id : {"k", "b"}) Add(b, id);
  EXPECT_EQ(InOrder(a.tenant.ns), (std::vector<std::string>{"a", "c", "m", "x"}));
  EXPECT_EQ(InOrder(b.tenant.ns), (std::vector<std::string>{"b", "k"}));
  const std::vector<std::string> all = InOrder(std::nullopt);
  ASSERT_EQ(all.size(), 6u);
  std::vector<std::string> each;
  table_.ForEach([&](const Session& s) { each.push_back(s.id); });
  EXPECT_EQ(each, all) << "ForEach is key order too";
  const bool a_first = all.front() == "a";
  const std::vector<std::string> a_then_b = {"a", "c", "m", "x", "b", "k"};
  const std::vector<std::string> b_then_a = {"b", "k", "a", "c", "m", "x"};
  EXPECT_EQ(all, a_first ? a_then_b : b_then_a) << "one tenant's range, then the other's";

  EXPECT_EQ(InOrder(a.tenant.ns, a.tenant.ns, "c"), (std::vector<std::string>{"m", "x"}));
  EXPECT_EQ(InOrder(a.tenant.ns, a.tenant.ns, "d"), (std::vector<std::string>{"m", "x"})) << "a key no session has";
  EXPECT_TRUE(InOrder(a.tenant.ns, a.tenant.ns, "x").empty());
  EXPECT_EQ(InOrder(a.tenant.ns, a.tenant.ns, ""), (std::vector<std::string>{"a", "c", "m", "x"}));
  // A cursor in another tenant's range: only `only`'s sessions after it.
  const Namespace& first = a_first ? a.tenant.ns : b.tenant.ns;
  const Namespace& second = a_first ? b.tenant.ns : a.tenant.ns;
  EXPECT_EQ(InOrder(second, first, "zzz"), InOrder(second)) << "a cursor before the range starts it";
  EXPECT_TRUE(InOrder(first, second, "").empty()) << "a cursor past the range ends it";

  // Paging by two, each page resuming after the last key seen, lists everyone once.
  std::vector<std::string> paged;
  std::optional<Namespace> after_ns;
  std::string after_id;
  for (int pages = 0; pages < 10; ++pages) {
    std::vector<std::pair<Namespace, std::string>> page;
    table_.VisitInOrder(std::nullopt, after_ns, after_id, [&](const Session& s) {
      page.emplace_back(s.tenant->tenant.ns, s.id);
      return page.size() < 2;
    });
    if (page.empty()) break;
    for (const auto& [ns, id] : page) paged.push_back(id);
    after_ns = page.back().first;
    after_id = page.back().second;
  }
  EXPECT_EQ(paged, all);
}

TEST_F(SessionTableTest, APriorityWithADeadlineGoesBackToZeroThen) {
  TenantAccount& a = Account("a");
  Session* s = Add(a, "s");
  const auto now = steady_clock::now();
  table_.SetPriority(s, 5, now + milliseconds(1000));
  EXPECT_EQ(s->priority, 5);
  EXPECT_EQ(s->priority_until, now + milliseconds(1000));
  EXPECT_EQ(table_.Expire(now), 0u);
  EXPECT_EQ(s->priority, 5);
  EXPECT_EQ(table_.Expire(now + milliseconds(1000)), 1u) << "at the deadline";
  EXPECT_EQ(s->priority, 0);
  EXPECT_EQ(s->priority_until, steady_clock::time_point{});
  EXPECT_EQ(table_.Expire(now + milliseconds(5000)), 0u) << "once";

  // Back at priority 0, they are colder than any session above it again.
  Session* t = Add(a, "t");
  Session* u = Add(a, "u");
  table_.SetPriority(u, 1, {});
  table_.SetPriority(t, 2, now + milliseconds(10));
  table_.SetPriority(s, 4, now + milliseconds(20));
  EXPECT_EQ(ColdestFirst(), (std::vector<std::string>{"u", "t", "s"}));
  EXPECT_EQ(table_.Expire(now + milliseconds(20)), 2u);
  const std::vector<std::string> order = ColdestFirst();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order.back(), "u");
  EXPECT_EQ(s->priority + t->priority, 0);
}

// A later SetPriority replaces the deadline (none: cancels it); a session
// removed leaves nothing to expire.
TEST_F(SessionTableTest, ALaterPriorityReplacesTheDeadline) {
  TenantAccount& a = Account("a");
  Session* replaced = Add(a, "replaced");
  Session* cancelled = Add(a, "cancelled");
  Session* removed = Add(a, "removed");
  const auto now = steady_clock::now();
  table_.SetPriority(replaced, 3, now + milliseconds(10));
  table_.SetPriority(replaced, 3, now + milliseconds(1000));
  table_.SetPriority(cancelled, 4, now + milliseconds(10));
  table_.SetPriority(cancelled, 6, {});
  table_.SetPriority(removed, 2, now + milliseconds(10));
  table_.Remove(removed);
  EXPECT_EQ(table_.Expire(now + milliseconds(500)), 0u);
  EXPECT_EQ(replaced->priority, 3);
  EXPECT_EQ(cancelled->priority, 6);
  EXPECT_EQ(table_.Expire(now + milliseconds(1000)), 1u);
  EXPECT_EQ(replaced->priority, 0);
  EXPECT_EQ(cancelled->priority, 6) << "no deadline: kept";
}

// However often deadlines are set, the queue stays within 2 x sessions + 64,
// and removing sessions lets theirs go.
TEST_F(SessionTableTest, TheDeadlineQueueStaysBounded) {
  TenantAccount& a = Account("a");
  Session* s[2] = {Add(a, "s0"), Add(a, "s1")};
  const auto now = steady_clock::now();
  for (int i = 0; i < 5000; ++i) {
    table_.SetPriority(s[i % 2], 1, now + milliseconds(1000 + i));
    ASSERT_LE(table_.pending_deadlines(), 2u * 2 + 64) << "after " << i;
  }
  EXPECT_EQ(table_.Expire(now + milliseconds(500)), 0u);
  EXPECT_EQ(table_.Expire(now + milliseconds(10000)), 2u) << "only the latest deadline of each counts";
  for (int i = 0; i < 500; ++i) table_.SetPriority(s[0], 1, now + milliseconds(20000 + i));
  table_.Remove(s[0]);
  table_.Remove(s[1]);
  EXPECT_LE(table_.pending_deadlines(), 64u);
  EXPECT_EQ(table_.Expire(now + std::chrono::hours(1)), 0u);
}

// Adding a session that exists, or removing one whose chain still holds
// blocks, is an engine bug: it aborts.
TEST(SessionTableDeathTest, AddingTwiceOrRemovingAHeldSessionAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TenantLedger tenants;
  SessionTable table(MakeLruPolicy());
  TenantAccount& a = tenants.Get(Tenant::Make(TestProfile().Fingerprint(), "a"));
  Session* s = table.Add(a, "s");
  EXPECT_DEATH(table.Add(a, "s"), "");
  s->chain.push_back(0);
  EXPECT_DEATH(table.Remove(s), "");
  s->chain.clear();
  table.Remove(s);
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace kvtier::tiering
