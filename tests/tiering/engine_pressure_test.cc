// Engine: pressure — the watermarks that demote and drop the coldest
// sessions, and allocation into full pools.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

// --- Watermarks -------------------------------------------------------------------

class WatermarkTest : public EngineTest {
 protected:
  // 10 GPU slots: above 8 used, demote down to 5.
  void StartGpuPressure() {
    EngineOptions o = Options(10, 32);
    o.gpu_high_watermark = 0.8;
    o.gpu_low_watermark = 0.5;
    Start(o);
  }
  std::vector<Tier> Mixed(size_t host, size_t gpu) {
    std::vector<Tier> v(host, Tier::kHost);
    v.insert(v.end(), gpu, Tier::kGpu);
    return v;
  }
};

TEST_F(WatermarkTest, TickDemotesTheLeastRecentlyUsedSessionFirst) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3), c = MakeChain(3, 2), d = MakeChain(4, 1);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  engine_->Tick();
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u) << "8 of 10 is not above the high watermark";
  auto use = Get("a", a);  // a becomes the warmest: b, c, a.
  ASSERT_TRUE(use.ok());
  ASSERT_TRUE(engine_->Release(use->id).ok());
  Put("d", d);  // 9 of 10.
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 3));
  EXPECT_EQ(Tiers("c"), Mixed(1, 1));
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 3));
  EXPECT_EQ(Tiers("d"), All(Tier::kGpu, 1));
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 5u) << "down to the low watermark";
  EXPECT_EQ(st.demoted_blocks, 4u);
  EXPECT_EQ(st.dropped_blocks, 0u);
  engine_->Tick();
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ExpectChainHolds(b, 3);
  ExpectChainHolds(c, 2);
  ExpectConsistent();
}

TEST_F(WatermarkTest, LowerPriorityIsDemotedBeforeHigher) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3), c = MakeChain(3, 2), d = MakeChain(4, 1);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  ASSERT_TRUE(engine_->SetPriority(tenant_, "a", 3).ok());
  ASSERT_TRUE(engine_->SetPriority(tenant_, "b", 3).ok());
  Put("d", d);
  // Coldest first: priority 0 (c, d), then priority 3 (a, b).
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("c"), All(Tier::kHost, 2));
  EXPECT_EQ(Tiers("d"), All(Tier::kHost, 1));
  EXPECT_EQ(Tiers("a"), Mixed(1, 2));
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->GetSession(tenant_, "a")->priority, 3);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  ExpectConsistent();
}

TEST_F(WatermarkTest, RetuneAppliesNewWatermarksFromTheNextTick) {
  Start(Options(10, 32));  // Watermarks at 1.0: no pressure.
  const Chain a = MakeChain(1, 5), b = MakeChain(2, 4);
  Put("a", a);
  Put("b", b);
  engine_->Tick();
  EXPECT_EQ(engine_->stats().copies_in_flight + engine_->stats().demoted_blocks, 0u);

  EngineOptions bad = engine_->options();
  bad.gpu_high_watermark = 0.5;
  bad.gpu_low_watermark = 0.6;
  const Status refused = engine_->Retune(bad);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  // The rule kvtierd's configuration rows check too, in the same words (LowWatermarkProblem).
  EXPECT_EQ(refused.message(), "gpu_low_watermark must not exceed gpu_high_watermark");
  bad = engine_->options();
  bad.host_low_watermark = 0;
  EXPECT_EQ(engine_->Retune(bad).message(), "host_low_watermark must be > 0");
  bad = engine_->options();
  bad.max_copy_batch = 0;
  EXPECT_EQ(engine_->Retune(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->options().gpu_high_watermark, 1.0) << "a rejected retune changes nothing";

  EngineOptions o = engine_->options();
  o.gpu_high_watermark = 0.8;
  o.gpu_low_watermark = 0.5;
  o.max_copy_batch = 2;
  o.gpu_slots = 99;  // Not tunable: ignored.
  ASSERT_TRUE(engine_->Retune(o).ok());
  EXPECT_EQ(engine_->options().gpu_low_watermark, 0.5);
  EXPECT_EQ(engine_->options().max_copy_batch, 2u);
  EXPECT_EQ(engine_->options().gpu_slots, 10u);
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u) << "9 of 10 is above the new high watermark: down to 5";
  EXPECT_EQ(Tiers("a"), Mixed(4, 1));
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 4));
  EXPECT_EQ(backend_->copy_stats(CopyDirection::kGpuToHost).batches, 2u) << "4 blocks in batches of 2";
  ExpectConsistent();
}

TEST_F(WatermarkTest, LeasedSessionsAreSkipped) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 5);
  Put("a", a);
  Put("b", b);
  auto pin = Get("", a);
  ASSERT_TRUE(pin.ok());
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 4));
  EXPECT_EQ(Tiers("b"), Mixed(4, 1));
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

TEST_F(WatermarkTest, BlocksReadWithoutASessionStillCoolDown) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 3), c = MakeChain(3, 2);
  Put("a", a);
  // A reader without a session name (a scheduler, say) reads a's blocks once.
  auto peek = Get("", a);
  ASSERT_TRUE(peek.ok());
  ASSERT_TRUE(engine_->Release(peek->id).ok());
  Put("b", b);
  Put("c", c);  // 9 of 10: demote 4.
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // a was used least recently, by its session and by the reader alike.
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 3));
  EXPECT_EQ(Tiers("c"), All(Tier::kGpu, 2));
  ExpectConsistent();
}

TEST_F(WatermarkTest, ASharedPrefixIsDemotedWithItsWarmestSession) {
  StartGpuPressure();
  const Chain system = MakeChain(100, 2);
  const Chain a = MakeChain(1, 2, &system);
  const Chain b = MakeChain(2, 2, &system);
  const Chain c = MakeChain(3, 3);
  Put("a", a);
  Put("b", b, 0);  // Shares the system prompt (duplicates), warmer than a.
  Put("c", c);     // 2 + 2 + 2 + 3 = 9 of 10: demote 4.
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // Walking coldest first: a's own 2 blocks, then b's (the system prompt was used by b
  // after a's last use, so it goes with b).
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  EXPECT_EQ(Tiers("b"), Mixed(2, 2));
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  EXPECT_EQ(Tiers("c"), All(Tier::kGpu, 3));
  ExpectChainHolds(a, 4);
  ExpectChainHolds(b, 4);
  ExpectConsistent();
}

TEST_F(WatermarkTest, BlocksLastUsedByAnEvictedSessionCanStillBeDemoted) {
  StartGpuPressure();
  const Chain system = MakeChain(100, 4);
  const Chain a = MakeChain(1, 1, &system);
  const Chain b = MakeChain(2, 1, &system);
  Put("a", a);
  Put("b", b);  // Uses the system prompt after a did.
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  const Chain c = MakeChain(3, 5);
  Put("c", c);  // 10 of 10.
  auto pin = Get("", c);
  ASSERT_TRUE(pin.ok());
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // Only a's blocks can move; the system prompt is now a's alone, however recently
  // b used it, so all of a goes and usage is back at the low watermark.
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 5));
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

TEST_F(WatermarkTest, HostPressureDropsTheColdestSessions) {
  EngineOptions o = Options(16, 8);
  o.host_high_watermark = 0.75;  // Above 6 of 8, drop down to 4.
  o.host_low_watermark = 0.5;
  Start(o);
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3), c = MakeChain(3, 2);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  for (const char* s : {"a", "b"}) ASSERT_GT(*engine_->Demote(tenant_, s), 0u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  engine_->Tick();
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 6u) << "6 of 8 is not above the high watermark";
  EXPECT_TRUE(freed_.empty());
  ASSERT_EQ(*engine_->Demote(tenant_, "c"), 2u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  engine_->Tick();
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kHost], 4u);
  EXPECT_EQ(st.dropped_blocks, 4u);
  EXPECT_EQ(FreedCount(true), 4u);
  EXPECT_EQ(FreedCount(false), 0u);
  for (const BlockKey& k : a.keys) EXPECT_TRUE(WasFreed(k, true));
  EXPECT_TRUE(WasFreed(b.keys[2], true)) << "then the tail of the next coldest";
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound) << "an emptied session goes";
  EXPECT_EQ(Matched(a), 0u);
  EXPECT_EQ(Matched(b), 2u);
  EXPECT_EQ(Matched(c), 2u);
  ExpectChainHolds(b, 2);
  ExpectChainHolds(c, 2);
  ExpectConsistent();
}

// --- Full pools ---------------------------------------------------------------------

TEST_F(EngineTest, FullPoolsWithEverythingLeasedRefuseAllocationAndLoseNothing) {
  Start(Options(4, 4));
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  auto pin = Get("", a);
  ASSERT_TRUE(pin.ok());
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("gpu tier full"), std::string::npos) << w.status().ToString();
  EXPECT_NE(w.status().message().find("0 of 4 slots free"), std::string::npos) << w.status().ToString();
  EXPECT_EQ(engine_->stats().allocation_failures, 1u);
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(Matched(a), 4u);
  ExpectLeaseHolds(*pin, a);
  ExpectConsistent();

  // Write leases hold slots the same way.
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  auto w1 = engine_->Allocate(tenant_, 4);  // Demotes all of a (coldest, unleased) to the host tier.
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  auto w2 = engine_->Allocate(tenant_, 1);
  EXPECT_EQ(w2.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->stats().allocation_failures, 2u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w1->id).ok());
  EXPECT_TRUE(engine_->Allocate(tenant_, 4).ok());
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, AllocateLargerThanTheTierIsRefused) {
  Start(Options(4, 4));
  auto w = engine_->Allocate(tenant_, 5);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("4 slots"), std::string::npos) << w.status().ToString();
}

TEST_F(EngineTest, AllocateDemotesColdestBlocksBeforeDroppingAny) {
  Start(Options(6, 4));
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(freed_.empty()) << "the host tier had room: nothing may be lost";
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(Matched(a), 3u);
  EXPECT_EQ(Matched(b), 3u);
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->blocks_in[Tier::kHost], 2u) << "the coldest session made the room";
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, TryAllocateNeverWaitsAndSucceedsOnceTheDemotionsLand) {
  Start(Options(6, 4), /*manual=*/true);
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  const int waits = manual_->wait_calls;
  auto pending = engine_->TryAllocate(tenant_, 2);
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  EXPECT_FALSE(pending->has_value()) << "the GPU tier is full; demotions of a were scheduled, not waited for";
  EXPECT_EQ(manual_->wait_calls, waits) << "TryAllocate must not wait on a fence";
  EXPECT_EQ(manual_->queued_ops(), 2u) << "the coldest session's blocks are being demoted";
  // Asking again before the copies land schedules nothing more.
  auto again = engine_->TryAllocate(tenant_, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ(manual_->queued_ops(), 2u);
  manual_->RunAll();
  auto w = engine_->TryAllocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->has_value());
  EXPECT_EQ((*w)->slots.size(), 2u);
  EXPECT_TRUE(freed_.empty()) << "room came from demotion: nothing was lost";
  EXPECT_EQ(Matched(a), 3u);
  ASSERT_TRUE(engine_->Release((*w)->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, TryAllocateThatMayNotWaitFailsWithoutLosingLeasedBlocks) {
  Start(Options(4, 4), /*manual=*/true);
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  auto pin = Get("", a);  // Nothing can be demoted or dropped.
  ASSERT_TRUE(pin.ok());
  auto r = engine_->TryAllocate(tenant_, 1);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << "no copy in flight: nothing to wait for";
  r = engine_->TryAllocate(tenant_, 1, /*may_wait=*/false);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(freed_.empty());
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, AcquireNeedsRoomWhileDemotionsForItsPromotionsAreInFlight) {
  Start(Options(4, 8), /*manual=*/true);
  manual_->complete_on_wait = true;
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 4u);
  manual_->RunAll();
  engine_->Poll();
  Put("b", b);  // The GPU tier is full of b; a is in the host tier.
  manual_->complete_on_wait = false;
  EXPECT_TRUE(engine_->AcquireNeedsRoom(ns_, a.keys, a.tokens)) << "b's demotion must land first";
  EXPECT_EQ(manual_->queued_ops(), 4u) << "b is being demoted to make the room";
  EXPECT_FALSE(engine_->GetSession(tenant_, "a")->blocks_in[Tier::kGpu]) << "no effect on a";
  manual_->RunAll();
  EXPECT_FALSE(engine_->AcquireNeedsRoom(ns_, a.keys, a.tokens)) << "the room is there now";
  const int waits = manual_->wait_calls;
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(manual_->wait_calls, waits) << "Acquire found the room: it did not wait";
  ASSERT_EQ(lease->blocks.size(), 4u);
  EXPECT_EQ(lease->promoted, 4u);
  manual_->RunAll();
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_TRUE(freed_.empty());
  ExpectConsistent();
}

TEST_F(EngineTest, AllocateDropsColdestUnleasedBlocksAsALastResort) {
  Start(Options(6, 4));
  // Fill the host tier with blocks a reader holds, so nothing can be demoted.
  const Chain h = MakeChain(9, 4);
  Put("h", h);
  ASSERT_EQ(*engine_->Demote(tenant_, "h"), 4u);
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(5)).ok());
  auto pin = Get("", h, /*promote=*/false);
  ASSERT_TRUE(pin.ok());
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(WasFreed(a.keys[2], true));
  EXPECT_TRUE(WasFreed(a.keys[1], true));
  EXPECT_EQ(Matched(a), 1u) << "the coldest session loses its tail first";
  EXPECT_EQ(Matched(b), 3u);
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, FailedAllocateDropsNothing) {
  // Two GPU slots are pinned by a reader, two hold an unleased session. Asking for
  // three cannot succeed: the unleased blocks must not be thrown away for nothing.
  Start(Options(4, 4));
  const Chain a = MakeChain(1, 2), b = MakeChain(2, 2);
  Put("a", a);
  Put("b", b);
  auto pin = Get("", b);
  ASSERT_TRUE(pin.ok());
  auto w = engine_->Allocate(tenant_, 3);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(freed_.empty()) << "blocks were dropped by an allocation that failed anyway";
  EXPECT_EQ(Matched(a), 2u);
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

}  // namespace
}  // namespace kvtier::tiering
