// SettlingQueue: what clients' GPU work may still use, oldest first, taken out
// whole to be given back or added again (gpu_work.cc).
#include "settling.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "tenant_ledger.h"

namespace kvtier::tiering {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point T0() { return Clock::time_point{} + std::chrono::hours(1); }

// A release's slots (charged to `tenant`) waiting for watch `watch`.
Settling Slots(uint64_t watch, std::vector<uint32_t> slots, TenantAccount* tenant) {
  Settling s;
  s.work = GpuWork{watch, /*client=*/watch * 10};
  s.slots = std::move(slots);
  s.tenant = tenant;
  s.since = T0() + std::chrono::milliseconds(watch);
  return s;
}
// A commit's new blocks, written by the work of watch `watch`.
Settling Written(uint64_t watch, std::vector<uint32_t> records) {
  Settling s;
  s.work = GpuWork{watch, watch * 10};
  s.records = std::move(records);
  s.writes = true;
  s.since = T0() + std::chrono::milliseconds(watch);
  return s;
}

std::vector<uint64_t> Watches(const SettlingQueue& q) {
  std::vector<uint64_t> out;
  q.ForEach([&](const Settling& s) { out.push_back(s.work.watch); });
  return out;
}

TEST(SettlingQueueTest, AnEmptyQueueHasNothingToTake) {
  SettlingQueue q;
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.size(), 0u);
  EXPECT_TRUE(q.TakeAll().empty());
  EXPECT_TRUE(Watches(q).empty());
}

TEST(SettlingQueueTest, EntriesAreVisitedOldestFirst) {
  TenantAccount tenant;
  SettlingQueue q;
  q.Add(Slots(3, {1, 2}, &tenant));
  q.Add(Written(1, {7}));
  q.Add(Slots(2, {3}, &tenant));
  EXPECT_EQ(q.size(), 3u);
  EXPECT_FALSE(q.empty());
  EXPECT_EQ(Watches(q), (std::vector<uint64_t>{3, 1, 2})) << "in the order added, not by watch";
}

// TakeAll hands every entry over, oldest first, as it was added, and leaves
// the queue empty; what is added again goes behind what came meanwhile.
TEST(SettlingQueueTest, TakeAllHandsEveryEntryOverOldestFirst) {
  TenantAccount tenant;
  SettlingQueue q;
  q.Add(Slots(1, {4, 5}, &tenant));
  q.Add(Written(2, {8, 9, 10}));
  std::vector<Settling> taken = q.TakeAll();
  EXPECT_TRUE(q.empty());
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].work.watch, 1u);
  EXPECT_EQ(taken[0].work.client, 10u);
  EXPECT_EQ(taken[0].slots, (std::vector<uint32_t>{4, 5}));
  EXPECT_EQ(taken[0].tenant, &tenant);
  EXPECT_TRUE(taken[0].records.empty());
  EXPECT_FALSE(taken[0].writes);
  EXPECT_EQ(taken[0].since, T0() + std::chrono::milliseconds(1));
  EXPECT_EQ(taken[1].work.watch, 2u);
  EXPECT_EQ(taken[1].records, (std::vector<uint32_t>{8, 9, 10}));
  EXPECT_TRUE(taken[1].writes);
  EXPECT_EQ(taken[1].tenant, nullptr);

  // The work of watch 1 is done; 2's is not. A new entry came meanwhile.
  q.Add(Written(3, {11}));
  q.Add(std::move(taken[1]));
  EXPECT_EQ(Watches(q), (std::vector<uint64_t>{3, 2}));
  EXPECT_TRUE(q.TakeAll().back().writes);
  EXPECT_TRUE(q.TakeAll().empty()) << "a second TakeAll finds nothing";
}

// ForEach visits the entries in place: what it changes stays.
TEST(SettlingQueueTest, ForEachVisitsTheEntriesInPlace) {
  TenantAccount tenant;
  SettlingQueue q;
  q.Add(Slots(1, {1}, &tenant));
  q.Add(Slots(2, {2}, &tenant));
  q.ForEach([](Settling& s) { s.work = GpuWork{}; });
  size_t none = 0;
  std::as_const(q).ForEach([&](const Settling& s) { none += s.work.none() ? 1 : 0; });
  EXPECT_EQ(none, 2u);
  EXPECT_EQ(q.size(), 2u);
}

}  // namespace
}  // namespace kvtier::tiering
