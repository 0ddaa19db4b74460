// The LRU eviction policy, through the public EvictionPolicy interface alone:
// sessions are handles, as they would be to a policy written outside the engine.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvtier/tiering/policy.h"

namespace kvtier::tiering {
namespace {

class LruPolicyTest : public ::testing::Test {
 protected:
  // Every tracked session, coldest first.
  std::vector<SessionHandle> Order() const {
    std::vector<SessionHandle> out;
    policy_->VisitColdest([&](SessionHandle s) {
      out.push_back(s);
      return true;
    });
    return out;
  }

  std::unique_ptr<EvictionPolicy> policy_ = MakeLruPolicy();
};

using Handles = std::vector<SessionHandle>;

TEST_F(LruPolicyTest, AnEmptyPolicyVisitsNothing) {
  bool visited = false;
  policy_->VisitColdest([&](SessionHandle) {
    visited = true;
    return true;
  });
  EXPECT_FALSE(visited);
}

TEST_F(LruPolicyTest, SessionsOfOnePriorityComeInTheOrderTheyWereTracked) {
  policy_->Track(10, 0);
  policy_->Track(20, 0);
  policy_->Track(30, 0);
  EXPECT_EQ(Order(), (Handles{10, 20, 30}));
}

TEST_F(LruPolicyTest, ATouchedSessionBecomesTheWarmestOfItsPriority) {
  policy_->Track(1, 0);
  policy_->Track(2, 0);
  policy_->Track(3, 0);
  policy_->Touch(1);
  EXPECT_EQ(Order(), (Handles{2, 3, 1}));
  policy_->Touch(3);
  EXPECT_EQ(Order(), (Handles{2, 1, 3}));
  policy_->Touch(3);
  EXPECT_EQ(Order(), (Handles{2, 1, 3})) << "touching the warmest changes nothing";
}

TEST_F(LruPolicyTest, ALowerPriorityIsColderHoweverRecentlyItWasUsed) {
  policy_->Track(1, 3);
  policy_->Track(2, 0);
  policy_->Track(3, kMaxPriority);
  policy_->Track(4, 3);
  policy_->Touch(2);
  policy_->Touch(1);
  EXPECT_EQ(Order(), (Handles{2, 4, 1, 3}));
}

TEST_F(LruPolicyTest, TrackingAgainMovesASessionToItsNewPriorityAsTheWarmest) {
  policy_->Track(1, 0);
  policy_->Track(2, 2);
  policy_->Track(3, 2);
  policy_->Track(1, 2);
  EXPECT_EQ(Order(), (Handles{2, 3, 1}));
  policy_->Track(3, 0);
  EXPECT_EQ(Order(), (Handles{3, 2, 1}));
  policy_->Track(2, 2);
  EXPECT_EQ(Order(), (Handles{3, 1, 2})) << "the same priority again: now its warmest";
}

TEST_F(LruPolicyTest, PrioritiesOutsideTheRangeCountAsItsEnds) {
  policy_->Track(1, kMaxPriority);
  policy_->Track(2, kMaxPriority + 5);
  policy_->Track(3, kMinPriority);
  policy_->Track(4, kMinPriority - 5);
  EXPECT_EQ(Order(), (Handles{3, 4, 1, 2}));
}

TEST_F(LruPolicyTest, AnUntrackedSessionIsNoLongerVisited) {
  policy_->Track(1, 0);
  policy_->Track(2, 1);
  policy_->Track(3, 0);
  policy_->Untrack(1);
  EXPECT_EQ(Order(), (Handles{3, 2}));
  policy_->Untrack(2);
  policy_->Untrack(3);
  EXPECT_TRUE(Order().empty());
}

TEST_F(LruPolicyTest, AnUntrackedHandleMayNameANewSession) {
  policy_->Track(1, 4);
  policy_->Track(2, 0);
  policy_->Untrack(1);
  policy_->Track(1, 0);
  EXPECT_EQ(Order(), (Handles{2, 1})) << "tracked anew at its new priority, as the warmest";
}

TEST_F(LruPolicyTest, TouchingOrUntrackingAnUnknownSessionChangesNothing) {
  policy_->Track(1, 0);
  policy_->Track(2, 0);
  policy_->Touch(7);
  policy_->Untrack(8);
  policy_->Untrack(1);
  policy_->Untrack(1);
  policy_->Touch(1);
  EXPECT_EQ(Order(), (Handles{2}));
}

TEST_F(LruPolicyTest, AVisitStopsOnceItReturnsFalse) {
  for (SessionHandle s = 1; s <= 5; ++s) policy_->Track(s, 0);
  Handles seen;
  policy_->VisitColdest([&](SessionHandle s) {
    seen.push_back(s);
    return seen.size() < 2;
  });
  EXPECT_EQ(seen, (Handles{1, 2}));
}

TEST_F(LruPolicyTest, HandlesAreOpaqueNumbersNotIndexes) {
  const SessionHandle big = SessionHandle{1} << 62;
  policy_->Track(big, 1);
  policy_->Track(0, 1);
  policy_->Track(big + 1, 1);
  policy_->Touch(big);
  EXPECT_EQ(Order(), (Handles{0, big + 1, big}));
}

TEST_F(LruPolicyTest, ManySessionsKeepTheirOrderThroughTouchesAndRemovals) {
  // 1000 sessions, priority s % 3; the odd ones touched in reverse, every tenth untracked.
  for (SessionHandle s = 0; s < 1000; ++s) policy_->Track(s, static_cast<int>(s % 3));
  for (SessionHandle s = 999; s < 1000; s -= 2) policy_->Touch(s);
  for (SessionHandle s = 0; s < 1000; s += 10) policy_->Untrack(s);
  Handles want;
  for (int p = 0; p < 3; ++p) {
    for (SessionHandle s = 0; s < 1000; s += 2) {
      if (s % 3 == static_cast<SessionHandle>(p) && s % 10 != 0) want.push_back(s);
    }
    for (SessionHandle s = 999; s < 1000; s -= 2) {
      if (s % 3 == static_cast<SessionHandle>(p)) want.push_back(s);
    }
  }
  EXPECT_EQ(Order(), want);
}

}  // namespace
}  // namespace kvtier::tiering
