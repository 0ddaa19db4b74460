// Mover: copies of blocks between the tiers, submitted in batches and applied
// when their fence completes. Runs on the real host backend (its copy thread
// moves the bytes); ManualBackend stands in where a copy must stay stuck or be
// refused.
#include "mover.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine_parts_test_support.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

class MoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = testing::UniqueShmPrefix("mover");
    host_ = TestHostBackend(prefix_);
    ASSERT_NE(host_, nullptr);
  }

  // The table, both pools and the mover, on the host backend or (manual) on a ManualBackend.
  void Start(uint32_t gpu_slots, uint32_t host_slots, bool manual = false) {
    if (manual) manual_ = std::make_unique<ManualBackend>();
    Backend& backend = manual ? static_cast<Backend&>(*manual_) : *host_;
    auto index = BlockIndex::Create("/" + prefix_ + ".index", kBt, gpu_slots + host_slots, TestProfile().Fingerprint());
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    table_.emplace(std::move(index).value(), gpu_slots, host_slots);
    for (Tier t : kTiers) {
      auto pool = backend.CreatePool(PoolSpec{t, TestProfile().BlockBytes(), t == Tier::kGpu ? gpu_slots : host_slots,
                                              std::string("pool.") + TierName(t)});
      ASSERT_TRUE(pool.ok()) << pool.status().ToString();
      pools_[t] = std::move(pool).value();
    }
    mover_ = std::make_unique<Mover>(backend, pools_, *table_);
    mover_->OnLanded([this](uint32_t r) { landed_.push_back(r); });
  }

  // Publishes block `n` in a fresh slot of `tier`, its bytes written there.
  uint32_t Publish(uint64_t n, Tier tier) {
    const uint32_t slot = table_->slots(tier).Allocate();
    std::byte* p = pools_[tier]->slot_data(slot);
    for (size_t i = 0; i < pools_[tier]->slot_bytes(); ++i) p[i] = ByteOf(PartKey(n), i);
    return table_->Publish(PartKey(n), PartParent(n), PartTokens(n), tenant_, {}, tier, slot);
  }
  // Record `r`'s slot in its tier holds the block's bytes.
  bool Intact(uint32_t r) const {
    const Record& rec = (*table_)[r];
    const std::byte* p = pools_[rec.tier]->slot_data(rec.slot);
    for (size_t i = 0; i < pools_[rec.tier]->slot_bytes(); ++i) {
      if (p[i] != ByteOf(rec.key, i)) return false;
    }
    return true;
  }
  // Where clients read that `r` is: its tier, and whether it is moving.
  std::pair<Tier, bool> Published(uint32_t r) const {
    const auto s = IndexSlotOf(table_->index(), (*table_)[r].key);
    EXPECT_TRUE(s.has_value());
    return s ? std::pair{static_cast<Tier>(s->tier), s->moving != 0} : std::pair{Tier::kGpu, false};
  }
  const SlotAllocator& slots(Tier t) const { return table_->slots(t); }

  std::string prefix_;
  std::unique_ptr<Backend> host_;
  std::unique_ptr<ManualBackend> manual_;
  PerTier<std::unique_ptr<Pool>> pools_;
  TenantAccount tenant_{Tenant::Make(TestProfile().Fingerprint(), "tenant"), {}, {}, {}, 0, 0, false, {}};
  std::optional<BlockTable> table_;
  std::unique_ptr<Mover> mover_;  // Last: destroyed first, while the pools and the table live.
  std::vector<uint32_t> landed_;
};

// A scheduled demotion takes its host slot and says "moving" at once, is
// submitted by Flush, and switches tier only when applied; until then the block
// stays readable where it was.
TEST_F(MoverTest, ADemotionLandsWhenAppliedWithItsBytes) {
  Start(4, 4);
  std::vector<uint32_t> recs;
  for (uint64_t n = 0; n < 3; ++n) recs.push_back(Publish(n, Tier::kGpu));
  for (uint32_t r : recs) mover_->Schedule(r, CopyDirection::kGpuToHost);
  EXPECT_EQ(mover_->demoting(), 3u);
  EXPECT_EQ(slots(Tier::kHost).used(), 3u);
  EXPECT_FALSE(mover_->in_flight()) << "nothing submitted before Flush";
  EXPECT_EQ(mover_->copies_in_flight(), 0u);
  std::map<uint32_t, uint32_t> dst;
  for (uint32_t r : recs) {
    EXPECT_EQ((*table_)[r].state, BlockState::kDemoting);
    EXPECT_EQ(Published(r), std::pair(Tier::kGpu, true));
    dst[r] = (*table_)[r].dst_slot;
  }
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 3u);
  EXPECT_EQ(tenant_.Blocks(Tier::kHost), 3u) << "counted where they land";

  mover_->Flush(CopyDirection::kGpuToHost, 8);
  EXPECT_TRUE(mover_->in_flight());
  EXPECT_EQ(mover_->copies_in_flight(), 3u);
  for (uint32_t r : recs) {
    EXPECT_NE((*table_)[r].move_seq, 0u);
    EXPECT_EQ((*table_)[r].move_seq, (*table_)[recs[0]].move_seq) << "one batch";
    EXPECT_EQ((*table_)[r].tier, Tier::kGpu) << "readable in its source until applied";
    EXPECT_TRUE(Intact(r));
  }

  ASSERT_TRUE(mover_->WaitIdle(kWait).ok());
  for (uint32_t r : recs) {
    const Record& rec = (*table_)[r];
    EXPECT_EQ(rec.state, BlockState::kReady);
    EXPECT_EQ(rec.tier, Tier::kHost);
    EXPECT_EQ(rec.slot, dst[r]);
    EXPECT_TRUE(Intact(r));
    EXPECT_EQ(Published(r), std::pair(Tier::kHost, false));
  }
  EXPECT_EQ(slots(Tier::kGpu).used(), 0u) << "the GPU slots came free";
  EXPECT_EQ(slots(Tier::kHost).used(), 3u);
  EXPECT_EQ(mover_->demoting(), 0u);
  EXPECT_EQ(mover_->demoted(), 3u);
  EXPECT_EQ(mover_->promoted(), 0u);
  EXPECT_FALSE(mover_->in_flight());
  EXPECT_EQ(mover_->copies_in_flight(), 0u);
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 0u);
  EXPECT_EQ(tenant_.blocks[Tier::kHost], 3u);
  EXPECT_EQ(tenant_.moving_to[Tier::kHost], 0u);
  EXPECT_EQ(landed_, recs);
}

TEST_F(MoverTest, APromotionBringsTheBlockBackWithItsBytes) {
  Start(4, 4);
  const uint32_t a = Publish(0, Tier::kHost), b = Publish(1, Tier::kHost);
  mover_->Schedule(a, CopyDirection::kHostToGpu);
  mover_->Schedule(b, CopyDirection::kHostToGpu);
  EXPECT_EQ((*table_)[a].state, BlockState::kPromoting);
  EXPECT_EQ(mover_->demoting(), 0u) << "counts demotions only";
  EXPECT_EQ(slots(Tier::kGpu).used(), 2u);
  mover_->FlushAll(8);
  ASSERT_TRUE(mover_->WaitIdle(kWait).ok());
  for (uint32_t r : {a, b}) {
    EXPECT_EQ((*table_)[r].tier, Tier::kGpu);
    EXPECT_EQ((*table_)[r].state, BlockState::kReady);
    EXPECT_TRUE(Intact(r));
    EXPECT_EQ(Published(r), std::pair(Tier::kGpu, false));
  }
  EXPECT_EQ(slots(Tier::kHost).used(), 0u);
  EXPECT_EQ(mover_->promoted(), 2u);
  EXPECT_EQ(mover_->demoted(), 0u);
  EXPECT_TRUE(landed_.empty()) << "OnLanded is told of demotions only";
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 2u);
  EXPECT_EQ(tenant_.blocks[Tier::kHost], 0u);
}

TEST_F(MoverTest, FlushSubmitsAtMostMaxBatchBlocksPerFence) {
  Start(8, 8);
  std::vector<uint32_t> recs;
  for (uint64_t n = 0; n < 5; ++n) recs.push_back(Publish(n, Tier::kGpu));
  for (uint32_t r : recs) mover_->Schedule(r, CopyDirection::kGpuToHost);
  mover_->Flush(CopyDirection::kGpuToHost, 2);
  std::map<uint64_t, int> per_fence;
  for (uint32_t r : recs) ++per_fence[(*table_)[r].move_seq];
  EXPECT_EQ(per_fence.size(), 3u);
  std::vector<int> sizes;
  for (const auto& [seq, n] : per_fence) sizes.push_back(n);
  EXPECT_EQ(sizes, (std::vector<int>{2, 2, 1})) << "in scheduling order";
  ASSERT_TRUE(mover_->WaitIdle(kWait).ok());
  const CopyStats st = host_->copy_stats(CopyDirection::kGpuToHost);
  EXPECT_EQ(st.batches, 3u);
  EXPECT_EQ(st.blocks, 5u);
  EXPECT_EQ(mover_->demoted(), 5u);
}

// A copy that landed changes nothing until Poll applies it; Poll returns the
// blocks it settled and never waits.
TEST_F(MoverTest, PollAppliesTheBatchesThatCompleted) {
  Start(4, 4);
  const uint32_t a = Publish(0, Tier::kGpu), b = Publish(1, Tier::kGpu);
  EXPECT_EQ(mover_->Poll(), 0u) << "nothing in flight";
  mover_->Schedule(a, CopyDirection::kGpuToHost);
  mover_->Schedule(b, CopyDirection::kGpuToHost);
  mover_->Flush(CopyDirection::kGpuToHost, 8);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (host_->copy_stats(CopyDirection::kGpuToHost).blocks < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_EQ(host_->copy_stats(CopyDirection::kGpuToHost).blocks, 2u) << "the copy thread never ran";
  EXPECT_EQ((*table_)[a].state, BlockState::kDemoting) << "landed, not applied";
  EXPECT_EQ((*table_)[a].tier, Tier::kGpu);
  EXPECT_EQ(slots(Tier::kGpu).used(), 2u);
  EXPECT_EQ(mover_->Poll(), 2u);
  EXPECT_EQ(mover_->Poll(), 0u);
  EXPECT_EQ((*table_)[a].tier, Tier::kHost);
  EXPECT_EQ((*table_)[b].tier, Tier::kHost);
  EXPECT_EQ(slots(Tier::kGpu).used(), 0u);
}

// A reader leased the block in the GPU tier while its demotion was copied: the
// GPU copy stays and the host slot comes free, as if it had never moved.
TEST_F(MoverTest, ADemotionOfABlockLeasedMeanwhileIsUndone) {
  Start(4, 4);
  const uint32_t r = Publish(0, Tier::kGpu);
  const uint32_t gpu_slot = (*table_)[r].slot;
  mover_->Schedule(r, CopyDirection::kGpuToHost);
  mover_->Flush(CopyDirection::kGpuToHost, 8);
  (*table_)[r].readers = 1;  // What an Acquire does to a block moving out of the GPU tier.
  ASSERT_TRUE(mover_->WaitIdle(kWait).ok());
  const Record& rec = (*table_)[r];
  EXPECT_EQ(rec.state, BlockState::kReady);
  EXPECT_EQ(rec.tier, Tier::kGpu);
  EXPECT_EQ(rec.slot, gpu_slot);
  EXPECT_TRUE(Intact(r));
  EXPECT_EQ(Published(r), std::pair(Tier::kGpu, false));
  EXPECT_EQ(slots(Tier::kHost).used(), 0u);
  EXPECT_EQ(mover_->demoting(), 0u);
  EXPECT_EQ(mover_->demoted(), 0u);
  EXPECT_TRUE(landed_.empty());
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 1u);
  EXPECT_EQ(tenant_.moving_to[Tier::kHost], 0u);
  (*table_)[r].readers = 0;
}

// A block freed while it moves (doomed) gives back both its slots and its
// record once its copy is done, whichever way it was going.
TEST_F(MoverTest, ABlockFreedWhileMovingFreesBothSlotsWhenItsCopyIsDone) {
  Start(4, 4);
  const uint32_t down = Publish(0, Tier::kGpu), up = Publish(1, Tier::kHost);
  mover_->Schedule(down, CopyDirection::kGpuToHost);
  mover_->Schedule(up, CopyDirection::kHostToGpu);
  mover_->FlushAll(8);
  table_->Unpublish(down);
  table_->Unpublish(up);
  EXPECT_TRUE((*table_)[down].doomed);
  EXPECT_TRUE((*table_)[up].doomed);
  EXPECT_EQ(slots(Tier::kGpu).used(), 2u) << "the copies still use them";
  EXPECT_EQ(slots(Tier::kHost).used(), 2u);
  EXPECT_EQ(table_->live(), 2u);
  ASSERT_TRUE(mover_->WaitIdle(kWait).ok());
  EXPECT_EQ(slots(Tier::kGpu).used(), 0u);
  EXPECT_EQ(slots(Tier::kHost).used(), 0u);
  EXPECT_EQ(table_->live(), 0u);
  EXPECT_EQ(table_->index().size(), 0u);
  EXPECT_EQ(mover_->demoting(), 0u);
  EXPECT_TRUE(landed_.empty()) << "a doomed block is not offered";
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 0u);
  EXPECT_EQ(tenant_.blocks[Tier::kHost], 0u);
  EXPECT_EQ(tenant_.moving_to[Tier::kGpu], 0u);
  EXPECT_EQ(tenant_.moving_to[Tier::kHost], 0u);
}

// The backend refuses a batch: its blocks stay ready where they are and their
// destination slots come free; the other batches go ahead.
TEST_F(MoverTest, ARefusedBatchLeavesItsBlocksWhereTheyAre) {
  Start(4, 4, /*manual=*/true);
  std::vector<uint32_t> recs;
  for (uint64_t n = 0; n < 3; ++n) recs.push_back(Publish(n, Tier::kGpu));
  for (uint32_t r : recs) mover_->Schedule(r, CopyDirection::kGpuToHost);
  manual_->refuse_submits = 1;
  mover_->Flush(CopyDirection::kGpuToHost, 2);  // Batches {0, 1} (refused) and {2}.
  for (uint32_t r : {recs[0], recs[1]}) {
    EXPECT_EQ((*table_)[r].state, BlockState::kReady);
    EXPECT_EQ((*table_)[r].tier, Tier::kGpu);
    EXPECT_EQ(Published(r), std::pair(Tier::kGpu, false));
  }
  EXPECT_EQ((*table_)[recs[2]].state, BlockState::kDemoting);
  EXPECT_EQ(slots(Tier::kHost).used(), 1u);
  EXPECT_EQ(mover_->demoting(), 1u);
  EXPECT_EQ(mover_->copies_in_flight(), 1u);
  EXPECT_EQ(tenant_.moving_to[Tier::kHost], 1u);
  manual_->RunAll();
  EXPECT_EQ(mover_->Poll(), 1u);
  EXPECT_EQ((*table_)[recs[2]].tier, Tier::kHost);
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 2u);
  EXPECT_EQ(tenant_.blocks[Tier::kHost], 1u);
}

// WaitOldestDemotion waits for the oldest demotion batch alone and applies
// it; false when none is in flight or it did not complete.
TEST_F(MoverTest, WaitOldestDemotionAppliesTheOldestBatch) {
  Start(4, 4, /*manual=*/true);
  const uint32_t a = Publish(0, Tier::kGpu), b = Publish(1, Tier::kGpu);
  EXPECT_FALSE(mover_->WaitOldestDemotion(milliseconds(0))) << "none in flight";
  mover_->Schedule(a, CopyDirection::kGpuToHost);
  mover_->Schedule(b, CopyDirection::kGpuToHost);
  mover_->Flush(CopyDirection::kGpuToHost, 1);
  EXPECT_FALSE(mover_->WaitOldestDemotion(milliseconds(0))) << "its copy does not run";
  EXPECT_EQ(mover_->demoting(), 2u);
  manual_->complete_on_wait = true;  // Now Wait runs the copies it waits for.
  EXPECT_TRUE(mover_->WaitOldestDemotion(milliseconds(0)));
  EXPECT_EQ((*table_)[a].tier, Tier::kHost);
  EXPECT_EQ((*table_)[b].state, BlockState::kDemoting) << "a later batch";
  EXPECT_EQ(mover_->demoting(), 1u);
  EXPECT_TRUE(mover_->WaitOldestDemotion(milliseconds(0)));
  EXPECT_EQ((*table_)[b].tier, Tier::kHost);
  EXPECT_FALSE(mover_->WaitOldestDemotion(milliseconds(0)));
}

TEST_F(MoverTest, WaitIdleTimesOutWhileACopyIsStuck) {
  Start(4, 4, /*manual=*/true);
  const uint32_t r = Publish(0, Tier::kHost);
  EXPECT_TRUE(mover_->WaitIdle(milliseconds(0)).ok()) << "nothing to wait for";
  mover_->Schedule(r, CopyDirection::kHostToGpu);
  mover_->Flush(CopyDirection::kHostToGpu, 8);
  EXPECT_EQ(mover_->WaitIdle(milliseconds(1)).code(), StatusCode::kTimeout);
  EXPECT_EQ((*table_)[r].state, BlockState::kPromoting);
  EXPECT_TRUE(mover_->in_flight());
  manual_->RunAll();
  EXPECT_TRUE(mover_->WaitIdle(milliseconds(1)).ok());
  EXPECT_EQ((*table_)[r].tier, Tier::kGpu);
  EXPECT_TRUE(Intact(r));
}

}  // namespace
}  // namespace kvtier::tiering
