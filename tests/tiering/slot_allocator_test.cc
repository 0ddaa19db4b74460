// SlotAllocator: the free-slot stack of one pool.
#include "slot_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace kvtier::tiering {
namespace {

TEST(SlotAllocatorTest, StartsEmptyAndHandsOutSlotZeroFirst) {
  SlotAllocator a(4);
  EXPECT_EQ(a.capacity(), 4u);
  EXPECT_EQ(a.free_count(), 4u);
  EXPECT_EQ(a.used(), 0u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_FALSE(a.in_use(i));
  EXPECT_FALSE(a.in_use(4)) << "out of range is never in use";
  EXPECT_EQ(a.Allocate(), 0u);
  EXPECT_EQ(a.Allocate(), 1u);
  EXPECT_EQ(a.Allocate(), 2u);
  EXPECT_EQ(a.Allocate(), 3u);
  EXPECT_EQ(a.free_count(), 0u);
  EXPECT_EQ(a.used(), 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_TRUE(a.in_use(i));
}

TEST(SlotAllocatorTest, FreedSlotsAreReusedMostRecentFirst) {
  SlotAllocator a(8);
  for (int i = 0; i < 8; ++i) a.Allocate();
  a.Free(5);
  a.Free(2);
  EXPECT_FALSE(a.in_use(5));
  EXPECT_FALSE(a.in_use(2));
  EXPECT_EQ(a.used(), 6u);
  EXPECT_EQ(a.Allocate(), 2u);
  EXPECT_EQ(a.Allocate(), 5u);
  EXPECT_EQ(a.free_count(), 0u);
}

TEST(SlotAllocatorTest, ZeroCapacity) {
  SlotAllocator a(0);
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(a.free_count(), 0u);
  EXPECT_FALSE(a.in_use(0));
}

TEST(SlotAllocatorTest, RandomUseNeverHandsOutASlotTwice) {
  constexpr uint32_t kSlots = 300;
  SlotAllocator a(kSlots);
  std::set<uint32_t> held;
  std::mt19937 rng(3);
  for (int step = 0; step < 20000; ++step) {
    if (a.free_count() > 0 && (held.empty() || rng() % 2)) {
      const uint32_t s = a.Allocate();
      ASSERT_LT(s, kSlots);
      ASSERT_TRUE(held.insert(s).second) << "slot " << s << " handed out twice";
    } else {
      auto it = held.begin();
      std::advance(it, rng() % held.size());
      a.Free(*it);
      held.erase(it);
    }
    ASSERT_EQ(a.used(), held.size());
    ASSERT_EQ(a.free_count(), kSlots - held.size());
  }
  for (uint32_t s = 0; s < kSlots; ++s) EXPECT_EQ(a.in_use(s), held.count(s) == 1) << s;
}

TEST(SlotAllocatorDeathTest, DoubleFreeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SlotAllocator a(2);
  const uint32_t s = a.Allocate();
  a.Free(s);
  EXPECT_DEATH(a.Free(s), "");
}

TEST(SlotAllocatorDeathTest, FreeOfUnknownSlotAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SlotAllocator a(2);
  EXPECT_DEATH(a.Free(1), "");
  EXPECT_DEATH(a.Free(7), "");
}

}  // namespace
}  // namespace kvtier::tiering

namespace kvtier::tiering {
namespace {

TEST(SlotAllocatorTakeTest, TakesExactlyTheGivenSlots) {
  SlotAllocator a(6);
  const uint32_t take[] = {4, 1};
  ASSERT_TRUE(a.Take(take));
  EXPECT_EQ(a.used(), 2u);
  EXPECT_TRUE(a.in_use(1));
  EXPECT_TRUE(a.in_use(4));
  EXPECT_EQ(a.Allocate(), 0u);  // Lowest free first again.
  EXPECT_EQ(a.Allocate(), 2u);
  const uint32_t dup[] = {3, 3};
  EXPECT_FALSE(a.Take(dup));
  const uint32_t taken[] = {5, 1};
  EXPECT_FALSE(a.Take(taken));
  const uint32_t out_of_range[] = {6};
  EXPECT_FALSE(a.Take(out_of_range));
  EXPECT_EQ(a.used(), 4u);  // A refused Take changed nothing.
  EXPECT_FALSE(a.in_use(5));
  a.Free(4);
  EXPECT_EQ(a.Allocate(), 4u);
}

}  // namespace
}  // namespace kvtier::tiering
