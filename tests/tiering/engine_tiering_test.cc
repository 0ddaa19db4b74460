// Engine: moving blocks between the tiers on request — demotion, promotion
// (at acquire, at release, by prefetch) — and making room for it.
#include <gtest/gtest.h>

#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

// --- Demotion, promotion, prefetch -----------------------------------------------

TEST_F(EngineTest, DemoteThenAcquirePromotesWithIntactBytes) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 4);
  Put("s", c);
  auto n = engine_->Demote(tenant_, "s");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 0u);
  EXPECT_EQ(st.used[Tier::kHost], 4u);
  EXPECT_EQ(st.demoted_blocks, 4u);
  EXPECT_EQ(st.copies_in_flight, 0u);
  auto info = engine_->GetSession(tenant_, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tiers, All(Tier::kHost, 4));
  EXPECT_EQ(info->blocks_in[Tier::kHost], 4u);
  EXPECT_EQ(info->moving, 0u);
  ExpectConsistent();
  ExpectChainHolds(c, 4);  // Read in place in the host tier.

  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_EQ(lease->promoted, 4u);
  EXPECT_FALSE(lease->fence.IsNull());
  EXPECT_EQ(lease->fence.stream, CopyDirection::kHostToGpu);
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kGpu);
  EXPECT_INVARIANTS();
  // The worker waits on the fence through the backend, then reads the GPU slots.
  ASSERT_TRUE(backend_->Wait(lease->fence, kWait).ok());
  ExpectLeaseHolds(*lease, c);
  EXPECT_EQ(engine_->Poll(), 4u);
  st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 4u);
  EXPECT_EQ(st.used[Tier::kHost], 0u);
  EXPECT_EQ(st.promoted_blocks, 4u);
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 4));
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, AcquireWithoutPromoteLeasesInTheHostTier) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("s", c));
  auto lease = Get("s", c, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kHost);
  ExpectLeaseHolds(*lease, c);
  // While leased in the host tier, neither prefetch nor a promoting acquire moves them.
  EXPECT_EQ(*engine_->Prefetch(tenant_, "s"), 0u);
  auto second = Get("", c, /*promote=*/true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->promoted, 0u);
  for (const BlockLocation& loc : second->blocks) EXPECT_EQ(loc.tier, Tier::kHost);
  ASSERT_TRUE(engine_->Release(second->id).ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, PromoteOnReleaseMovesTheReadHostBlocksOnceTheLeaseEnds) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("s", c));
  auto lease = Get("s", c, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull()) << "nothing to wait for: read where they lie";
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kHost);
  ExpectLeaseHolds(*lease, c);
  engine_->Poll();
  EXPECT_EQ(Tiers("s"), All(Tier::kHost, 4)) << "nothing moves while the lease is held";
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 4u) << "promoted at release, into free GPU slots";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 4));
  EXPECT_EQ(engine_->stats().promoted_blocks, 4u);
  EXPECT_EQ(engine_->stats().after_read_promotions, 4u);
  EXPECT_EQ(engine_->stats().after_read_given_up, 0u);
  ExpectChainHolds(c, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, PromoteOnReleaseDemotesColderBlocksAndPromotesWhenTheyLand) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);  // The GPU tier is full.
  auto lease = Get("a", a, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 4u) << "b's demotion, started at release";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());  // b lands in the host tier, then a is promoted.
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 4));
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 4));
  EXPECT_EQ(engine_->stats().after_read_promotions, 4u) << "once b's demotion landed";
  EXPECT_TRUE(freed_.empty()) << "nothing lost";
  ExpectChainHolds(a, 4);
  ExpectChainHolds(b, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, PromoteOnReleaseLeavesBlocksWhereTheyAreWithoutRoomOrASession) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4), d = MakeChain(3, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);
  auto hold = Get("", b);  // All of the GPU tier pinned: no room can come.
  ASSERT_TRUE(hold.ok());
  auto lease = Get("a", a, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ASSERT_TRUE(engine_->Release(hold->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4)) << "given up when no room was coming";
  EXPECT_EQ(engine_->stats().after_read_given_up, 4u);
  EXPECT_EQ(engine_->stats().after_read_promotions, 0u);
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 4));

  // A block no session holds any more is freed with the lease, not promoted.
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("d", d));
  auto read = Get("", d, /*promote=*/false);
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(read->id).ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "d").ok());
  ASSERT_TRUE(engine_->Release(read->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  EXPECT_EQ(freed_.size(), 6u) << "b's four blocks and d's two";
  ExpectConsistent();

  // Only a read lease can be marked.
  EXPECT_EQ(engine_->PromoteOnRelease(read->id).code(), StatusCode::kNotFound);
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(engine_->PromoteOnRelease(w->id).code(), StatusCode::kNotFound);
  ASSERT_TRUE(engine_->Release(w->id).ok());
}

TEST_F(EngineTest, PrefetchPromotesASession) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("s", c);
  EXPECT_EQ(*engine_->Prefetch(tenant_, "s"), 0u) << "already in the GPU tier";
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  EXPECT_EQ(*engine_->Demote(tenant_, "s"), 0u) << "already moving";
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  const uint64_t before = engine_->GetSession(tenant_, "s")->last_use;
  auto n = engine_->Prefetch(tenant_, "s");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(*engine_->Prefetch(tenant_, "s"), 0u) << "already moving";
  EXPECT_GT(engine_->GetSession(tenant_, "s")->last_use, before) << "prefetch counts as a use";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().promoted_blocks, 3u);
  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, PromotionStopsWhenTheGpuTierIsFull) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);
  auto hold = Get("", b);  // Pin all of the GPU tier.
  ASSERT_TRUE(hold.ok());
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_TRUE(lease->blocks.empty()) << "no room to promote the first block";
  EXPECT_EQ(lease->id, 0u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(hold->id).ok());

  // Unpinned, b is colder than a (a was just acquired): b is demoted to make
  // room, and all of a is promoted. Nothing is lost.
  lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  ASSERT_EQ(lease->blocks.size(), 4u);
  EXPECT_EQ(lease->promoted, 4u);
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 4));
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 4));
  ExpectConsistent();
}

TEST_F(EngineTest, PromotionStopsWhereTheGpuTierCannotMakeRoom) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);
  const Chain b2{std::vector<TokenId>(b.tokens.begin(), b.tokens.begin() + 2 * kBt),
                 std::vector<BlockKey>(b.keys.begin(), b.keys.begin() + 2)};
  auto hold = Get("", b2);  // Pin half of the GPU tier.
  ASSERT_TRUE(hold.ok());
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  ASSERT_EQ(lease->blocks.size(), 2u) << "two GPU slots could be freed, not four";
  EXPECT_EQ(lease->promoted, 2u);
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->Release(hold->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(freed_.empty());
  ExpectConsistent();
}

// Regression (found by the chaos soak): making GPU room for a promotion may drop
// host-tier blocks of the coldest sessions, and those must not be the very blocks
// the acquire is about to lease. Here the prefix is only in the host tier, held
// by the coldest session, and the host tier is full.
TEST_F(EngineTest, MakingRoomForAPromotionNeverDropsThePrefixBeingAcquired) {
  Start(Options(4, 4));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);  // Both tiers full; "a" is the coldest session.
  auto lease = Get("", a);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_INVARIANTS();
  ExpectLeaseHolds(*lease, a);
  if (lease->id != 0) {
    ASSERT_TRUE(engine_->Release(lease->id).ok());
  }
  EXPECT_FALSE(WasFreed(a.keys[0], true)) << "the prefix being acquired was dropped";
  EXPECT_EQ(Matched(a), 4u);
  ExpectChainHolds(a, 4);
  ExpectChainHolds(b, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, DemoteMakesRoomInTheHostTierByDroppingColderBlocks) {
  Start(Options(8, 4));
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // b needs 3 host slots, 1 is free: the coldest host blocks (a's tail) make room.
  ASSERT_EQ(*engine_->Demote(tenant_, "b"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 3));
  EXPECT_EQ(Matched(a), 1u);
  EXPECT_TRUE(WasFreed(a.keys[2], true));
  EXPECT_TRUE(WasFreed(a.keys[1], true));
  EXPECT_EQ(engine_->stats().dropped_blocks, 2u);
  ExpectChainHolds(b, 3);
  ExpectChainHolds(a, 1);
  ExpectConsistent();
}

}  // namespace
}  // namespace kvtier::tiering
