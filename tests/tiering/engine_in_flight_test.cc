// Engine: copies held in flight (ManualBackend lands them when the test says):
// what waits for them, what stays readable, and what a refused copy leaves.
#include <gtest/gtest.h>

#include <chrono>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

// Every test here runs an engine on ManualBackend with one session, "a", and
// moves its blocks between the tiers; these say each step once.
class EngineInFlightTest : public EngineTest {
 protected:
  // Starts an engine of `o` on ManualBackend and commits a chain of `blocks`
  // blocks to session "a" (all in the GPU tier).
  Chain StartWith(uint32_t blocks, const EngineOptions& o) {
    Start(o, /*manual=*/true);
    const Chain a = MakeChain(1, blocks);
    Put("a", a);
    return a;
  }
  Chain StartWith(uint32_t blocks, uint32_t gpu_slots = 8, uint32_t host_slots = 8) {
    return StartWith(blocks, Options(gpu_slots, host_slots));
  }
  // Demotes session "a": true when every block of `a` started moving.
  bool Demoting(const Chain& a) {
    auto n = engine_->Demote(tenant_, "a");
    if (!n.ok()) {
      ADD_FAILURE() << n.status().ToString();
      return false;
    }
    EXPECT_EQ(*n, a.blocks()) << "blocks demoted";
    return *n == a.blocks();
  }
  // Starts a promotion of every block of "a" (Prefetch): true when it did.
  bool Promoting(const Chain& a) {
    auto n = engine_->Prefetch(tenant_, "a");
    if (!n.ok()) {
      ADD_FAILURE() << n.status().ToString();
      return false;
    }
    EXPECT_EQ(*n, a.blocks()) << "blocks promoted";
    return *n == a.blocks();
  }
  // Lands every queued copy; returns how many the engine applied.
  uint32_t Land() {
    manual_->RunAll();
    return engine_->Poll();
  }
  // Demotes "a" and lands the copies: true when all of it is in the host tier.
  bool InHostTier(const Chain& a) {
    if (!Demoting(a)) return false;
    Land();
    EXPECT_EQ(Tiers("a"), All(Tier::kHost, a.blocks()));
    return Tiers("a") == All(Tier::kHost, a.blocks());
  }
  // The slots used in each tier, as the engine counts them.
  void ExpectUsed(uint32_t gpu, uint32_t host) {
    EXPECT_EQ(engine_->stats().used[Tier::kGpu], gpu) << "gpu slots used";
    EXPECT_EQ(engine_->stats().used[Tier::kHost], host) << "host slots used";
  }
};

// --- With copies held in flight -------------------------------------------------------

TEST_F(EngineInFlightTest, AllocateWaitsForInFlightDemotionsInsteadOfDropping) {
  const Chain a = StartWith(4, /*gpu_slots=*/4);
  manual_->complete_on_wait = true;
  ASSERT_TRUE(Demoting(a));
  EXPECT_EQ(engine_->stats().copies_in_flight, 4u);
  EXPECT_EQ(manual_->queued_ops(), 4u);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_GE(manual_->wait_calls, 1);
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectChainHolds(a, 4);
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, AllocateNeverDropsMovingBlocks) {
  const Chain a = StartWith(4, /*gpu_slots=*/4);
  ASSERT_TRUE(Demoting(a));
  // The copies do not finish: the blocks are neither free nor droppable.
  auto w = engine_->Allocate(tenant_, 2);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(freed_.empty());
  EXPECT_INVARIANTS();
  manual_->RunAll();
  w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(freed_.empty());
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectChainHolds(a, 4);
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, MovingBlocksStayReadableInTheirSourceTier) {
  const Chain a = StartWith(2);
  ASSERT_TRUE(Demoting(a));
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->moving, 2u);
  EXPECT_EQ(info->tiers, All(Tier::kGpu, 2));
  IndexEntry e;
  ASSERT_TRUE(view_.Find(a.keys[0], BlockKey{}, NamespaceTag(ns_), a.block(0), &e));
  EXPECT_EQ(e.tier, Tier::kGpu);
  EXPECT_TRUE(e.moving) << "clients see the copy in flight";
  ExpectUsed(/*gpu=*/2, /*host=*/2);  // A moving block holds a slot in each tier.
  EXPECT_EQ(engine_->Poll(), 0u);
  ExpectChainHolds(a, 2);  // Read at the source while the copy is pending.
  EXPECT_INVARIANTS();
  EXPECT_EQ(Land(), 2u);
  ASSERT_TRUE(view_.Find(a.keys[0], BlockKey{}, NamespaceTag(ns_), a.block(0), &e));
  EXPECT_EQ(e.tier, Tier::kHost);
  EXPECT_FALSE(e.moving);
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, ALeaseTakenDuringDemotionKeepsTheBlockInTheGpuTier) {
  const Chain a = StartWith(3);
  ASSERT_TRUE(Demoting(a));
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kGpu);
  ExpectLeaseHolds(*lease, a);
  Land();
  // The demotion landed, but the block was leased meanwhile: the GPU copy stays.
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(engine_->stats().demoted_blocks, 0u);
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
  // Once released, it can be demoted again.
  ASSERT_TRUE(InHostTier(a));
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, EvictDuringDemotionFreesBothSlotsWhenTheCopyLands) {
  const Chain a = StartWith(2);
  ASSERT_TRUE(Demoting(a));
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(FreedCount(false), 2u);
  EXPECT_EQ(Matched(a), 0u) << "gone from the index at once";
  ExpectUsed(/*gpu=*/2, /*host=*/2);
  EXPECT_INVARIANTS();
  Land();
  ExpectUsed(/*gpu=*/0, /*host=*/0);
  EXPECT_INVARIANTS();
  // The same blocks can be cached again.
  Put("a", a);
  ExpectChainHolds(a, 2);
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, EvictDuringPromotionFreesBothSlotsWhenTheCopyLands) {
  const Chain a = StartWith(2);
  ASSERT_TRUE(InHostTier(a));
  ASSERT_TRUE(Promoting(a));
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(FreedCount(false), 2u);
  EXPECT_INVARIANTS();
  Land();
  ExpectUsed(/*gpu=*/0, /*host=*/0);
  EXPECT_INVARIANTS();
}

TEST_F(EngineInFlightTest, AcquireJoinsAPromotionAlreadyInFlight) {
  const Chain a = StartWith(2);
  ASSERT_TRUE(InHostTier(a));
  ASSERT_TRUE(Promoting(a));
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 2u);
  EXPECT_FALSE(lease->fence.IsNull()) << "the lease waits for the prefetch's copy";
  EXPECT_FALSE(backend_->IsComplete(lease->fence));
  manual_->RunAll();
  ExpectLeaseHolds(*lease, a);
  engine_->Poll();
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, RefusedCopiesLeaveBlocksWhereTheyAre) {
  const Chain a = StartWith(3);
  manual_->refuse_submits = 1;
  ASSERT_TRUE(engine_->Demote(tenant_, "a").ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ExpectConsistent();
  ExpectChainHolds(a, 3);

  ASSERT_TRUE(InHostTier(a));
  manual_->refuse_submits = 1;
  ASSERT_TRUE(engine_->Prefetch(tenant_, "a").ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, ARefusedPromotionLeasesTheBlocksWhereTheyAre) {
  const Chain a = StartWith(3);
  ASSERT_TRUE(InHostTier(a));
  manual_->refuse_submits = 1;
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 3u);
  ASSERT_EQ(lease->blocks.size(), 3u);
  EXPECT_EQ(lease->promoted, 0u) << "nothing is being promoted";
  for (const BlockLocation& loc : lease->blocks) {
    EXPECT_EQ(loc.tier, Tier::kHost) << "the lease must not point at a GPU slot that holds nothing";
  }
  ExpectLeaseHolds(*lease, a);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineInFlightTest, WaitIdleTimesOutWhileCopiesAreStuck) {
  const Chain a = StartWith(2);
  ASSERT_TRUE(Demoting(a));
  EXPECT_EQ(engine_->WaitIdle(milliseconds(1)).code(), StatusCode::kTimeout);
  manual_->RunAll();
  EXPECT_TRUE(engine_->WaitIdle(milliseconds(1)).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 2));
}

TEST_F(EngineInFlightTest, CopiesAreBatchedByMaxCopyBatch) {
  EngineOptions o = Options(16, 16);
  o.max_copy_batch = 3;
  const Chain a = StartWith(8, o);
  ASSERT_TRUE(Demoting(a));
  EXPECT_EQ(engine_->stats().copies_in_flight, 8u);
  // Batches of 3, 3, 2 land one at a time, in order.
  manual_->complete_on_wait = true;
  ASSERT_TRUE(manual_->Wait(Fence{1, CopyDirection::kGpuToHost}, milliseconds(0)).ok());
  EXPECT_EQ(engine_->Poll(), 3u);
  ASSERT_TRUE(manual_->Wait(Fence{2, CopyDirection::kGpuToHost}, milliseconds(0)).ok());
  EXPECT_EQ(engine_->Poll(), 3u);
  EXPECT_FALSE(manual_->IsComplete(Fence{3, CopyDirection::kGpuToHost}));
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 8));
  ExpectChainHolds(a, 8);
  ExpectConsistent();
}

}  // namespace
}  // namespace kvtier::tiering
