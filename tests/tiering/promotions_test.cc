// PromotionQueue: blocks read in place that wait for GPU room, oldest first,
// at most `limit` of them (past it the oldest is given up), each keeping the
// key its block had when it was read.
#include "promotions.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

Clock::time_point T0() { return Clock::time_point{} + std::chrono::hours(1); }
BlockKey KeyOf(uint32_t record) { return BlockKey{record + 100u, record * 3u + 1}; }

// The records in the queue, oldest first (a Retain that keeps everything).
std::vector<uint32_t> Records(PromotionQueue& q) {
  std::vector<uint32_t> out;
  q.Retain([&](const WantedPromotion& w) {
    out.push_back(w.record);
    return true;
  });
  return out;
}

TEST(PromotionQueueTest, AnEmptyQueueVisitsNothing) {
  PromotionQueue q(4);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.size(), 0u);
  EXPECT_TRUE(Records(q).empty());
  EXPECT_EQ(q.Clear(), 0u);
}

TEST(PromotionQueueTest, EntriesAreVisitedOldestFirstWithWhatTheyWereAddedWith) {
  PromotionQueue q(8);
  for (uint32_t r : {5u, 2u, 9u}) EXPECT_EQ(q.Add(r, KeyOf(r), T0() + milliseconds(r)), 0u);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_FALSE(q.empty());
  std::vector<uint32_t> seen;
  q.Retain([&](const WantedPromotion& w) {
    seen.push_back(w.record);
    EXPECT_EQ(w.key, KeyOf(w.record));
    EXPECT_EQ(w.since, T0() + milliseconds(w.record));
    return true;
  });
  EXPECT_EQ(seen, (std::vector<uint32_t>{5, 2, 9})) << "insertion order, not record order";
  EXPECT_EQ(Records(q), seen) << "keeping everything changes nothing";
}

// Retain drops what `keep` refuses and keeps the rest in their order.
TEST(PromotionQueueTest, RetainKeepsTheRestInOrder) {
  PromotionQueue q(16);
  for (uint32_t r = 0; r < 7; ++r) q.Add(r, KeyOf(r), T0());
  q.Retain([](const WantedPromotion& w) { return w.record % 2 == 1; });
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{1, 3, 5}));
  q.Retain([](const WantedPromotion&) { return false; });
  EXPECT_TRUE(q.empty());
}

// Two readers of one block who both asked for its promotion want it once: the
// second Add keeps the first entry's place and pushes no other block out.
TEST(PromotionQueueTest, ABlockQueuedAlreadyKeepsItsPlace) {
  PromotionQueue q(3);
  EXPECT_EQ(q.Add(1, KeyOf(1), T0()), 0u);
  EXPECT_EQ(q.Add(2, KeyOf(2), T0()), 0u);
  EXPECT_EQ(q.Add(3, KeyOf(3), T0()), 0u);
  EXPECT_EQ(q.Add(1, KeyOf(1), T0()), 0u) << "queued already: nothing is given up";
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{1, 2, 3}));
  // Given up (or promoted) since: wanted again, it is queued again, as the newest.
  q.Retain([](const WantedPromotion& w) { return w.record != 1; });
  EXPECT_EQ(q.Add(1, KeyOf(1), T0()), 0u);
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{2, 3, 1}));
  // The record reused by another block while the old entry waits: that block is queued too.
  EXPECT_EQ(q.Add(1, KeyOf(9), T0()), 1u) << "a fourth entry: the oldest goes";
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{3, 1, 1}));
  q.Retain([](const WantedPromotion& w) { return w.key != KeyOf(1); });
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{3, 1}));
  EXPECT_EQ(q.Add(1, KeyOf(9), T0()), 0u) << "the reused record's entry is still queued";
  EXPECT_EQ(q.size(), 2u);
  q.Clear();
  EXPECT_EQ(q.Add(1, KeyOf(9), T0()), 0u);
  EXPECT_EQ(q.size(), 1u);
}

// Past `limit` the oldest entry is given up, one per Add, and Add says so.
TEST(PromotionQueueTest, PastTheLimitTheOldestIsGivenUp) {
  PromotionQueue q(3);
  EXPECT_EQ(q.Add(1, KeyOf(1), T0()), 0u);
  EXPECT_EQ(q.Add(2, KeyOf(2), T0()), 0u);
  EXPECT_EQ(q.Add(3, KeyOf(3), T0()), 0u) << "at the limit, not past it";
  EXPECT_EQ(q.Add(4, KeyOf(4), T0()), 1u);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{2, 3, 4}));
  EXPECT_EQ(q.Add(5, KeyOf(5), T0()), 1u);
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{3, 4, 5}));
}

// Room freed by Retain or Clear is room again: the limit counts what is queued.
TEST(PromotionQueueTest, RoomFreedByRetainOrClearIsRoomAgain) {
  PromotionQueue q(2);
  q.Add(1, KeyOf(1), T0());
  q.Add(2, KeyOf(2), T0());
  q.Retain([](const WantedPromotion& w) { return w.record != 1; });
  EXPECT_EQ(q.Add(3, KeyOf(3), T0()), 0u);
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(q.Clear(), 2u);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.Add(4, KeyOf(4), T0()), 0u);
  EXPECT_EQ(q.Add(5, KeyOf(5), T0()), 0u);
  EXPECT_EQ(Records(q), (std::vector<uint32_t>{4, 5}));
}

// A queue of limit 0 (no GPU slots) keeps nothing: every entry is given up.
TEST(PromotionQueueTest, AQueueOfNoRoomGivesUpEveryEntry) {
  PromotionQueue q(0);
  EXPECT_EQ(q.Add(1, KeyOf(1), T0()), 1u);
  EXPECT_TRUE(q.empty());
}

// Nothing is pinned, so a record may be freed and reused by another block
// while its entry waits: the entry keeps the key that was read, which is
// what tells the two apart. The same record may come twice, each entry with
// its own key.
TEST(PromotionQueueTest, EachEntryKeepsTheKeyItsBlockHadWhenRead) {
  PromotionQueue q(4);
  const BlockKey first{1, 1};
  const BlockKey reused{2, 2};
  q.Add(7, first, T0());
  q.Add(7, reused, T0() + milliseconds(5));
  EXPECT_EQ(q.size(), 2u);
  std::vector<BlockKey> keys;
  q.Retain([&](const WantedPromotion& w) {
    keys.push_back(w.key);
    return w.key == reused;  // The engine drops an entry whose record's key changed.
  });
  EXPECT_EQ(keys, (std::vector<BlockKey>{first, reused}));
  ASSERT_EQ(q.size(), 1u);
  q.Retain([&](const WantedPromotion& w) {
    EXPECT_EQ(w.record, 7u);
    EXPECT_EQ(w.key, reused);
    EXPECT_EQ(w.since, T0() + milliseconds(5));
    return true;
  });
}

}  // namespace
}  // namespace kvtier::tiering
