// Reclaimer: making room in a tier — demoting the coldest sessions' GPU
// blocks, dropping the tails of the coldest sessions, the watermarks, room
// under a tenant's quota. Runs on an engine's state (Engine::Impl) assembled
// as Engine::Create does, over the real host backend; blocks and sessions are
// made through the table and Impl::SetChain, as requests make them.
#include "reclaim.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine_impl.h"
#include "engine_parts_test_support.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

class ReclaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = testing::UniqueShmPrefix("reclaim");
    backend_ = TestHostBackend(prefix_);
    ASSERT_NE(backend_, nullptr);
  }

  // No automatic pressure: the tests call the reclaimer themselves.
  EngineOptions Options(uint32_t gpu_slots, uint32_t host_slots) {
    EngineOptions o = TestEngineOptions(gpu_slots, host_slots, "reclaim", "/" + prefix_ + ".index");
    o.on_free = [this](const BlockKey& key, bool dropped) { freed_.push_back(Freed{key, dropped}); };
    return o;
  }
  EngineOptions WithGpuQuota(EngineOptions o, uint32_t quota) {
    TenantQuota q;
    q.tenant = tenant_;
    q.blocks[Tier::kGpu] = quota;
    o.quotas.push_back(q);
    return o;
  }

  // The engine's parts, as Engine::Create puts them together.
  void Start(const EngineOptions& o) {
    auto index = BlockIndex::Create(o.index_segment, kBt, o.gpu_slots + o.host_slots, o.profile.Fingerprint());
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    m_ = std::make_unique<Engine::Impl>(o, *backend_, std::move(index).value(), MakeLruPolicy());
    ASSERT_TRUE(m_->tenants.SetQuotas(o.quotas).ok());
    for (Tier t : kTiers) {
      auto pool = backend_->CreatePool(PoolSpec{t, o.profile.BlockBytes(), t == Tier::kGpu ? o.gpu_slots : o.host_slots,
                                                std::string("pool.") + TierName(t)});
      ASSERT_TRUE(pool.ok()) << pool.status().ToString();
      m_->pools[t] = std::move(pool).value();
    }
  }

  // Session `id` of `t` becomes `shared` (blocks it shares with others) plus
  // `blocks` new blocks in `tier`, used now: the warmest session.
  Session* PutAs(const Tenant& t, const std::string& id, uint32_t blocks, Tier tier = Tier::kGpu,
                 std::vector<uint32_t> shared = {}) {
    std::vector<uint32_t> recs = std::move(shared);
    for (uint32_t i = 0; i < blocks; ++i) {
      const uint64_t n = next_block_++;
      const uint32_t slot = m_->slots(tier).Allocate();
      recs.push_back(m_->blocks.Publish(PartKey(n), PartParent(n), PartTokens(n), m_->tenants.Get(t), {}, tier, slot));
    }
    ++m_->clock;
    m_->SetChain(t, id, recs);
    return m_->FindSession(t, id);
  }
  Session* Put(const std::string& id, uint32_t blocks, Tier tier = Tier::kGpu, std::vector<uint32_t> shared = {}) {
    return PutAs(tenant_, id, blocks, tier, std::move(shared));
  }

  Reclaimer& reclaim() { return m_->reclaim; }
  TenantAccount& account() { return m_->tenants.Get(tenant_); }
  const Record& rec(uint32_t r) const { return m_->blocks[r]; }
  uint32_t Free(Tier t) const { return m_->slots(t).free_count(); }
  bool Exists(const std::string& id) const { return m_->FindSession(tenant_, id) != nullptr; }
  // Pins (or unpins) a block as a read lease does.
  void Lease(uint32_t r, bool on = true) { m_->blocks[r].readers = on ? 1 : 0; }
  void WaitIdle() { ASSERT_TRUE(m_->mover.WaitIdle(kWait).ok()); }

  std::string prefix_;
  std::unique_ptr<Backend> backend_;
  std::vector<Freed> freed_;
  uint64_t next_block_ = 0;
  const Tenant tenant_ = Tenant::Make(TestProfile().Fingerprint(), "tenant");
  const Tenant other_ = Tenant::Make(TestProfile().Fingerprint(), "other tenant");
  std::unique_ptr<Engine::Impl> m_;  // Last: destroyed before the backend.
};

// --- Demotion ------------------------------------------------------------------------

TEST_F(ReclaimTest, DemoteColdestTakesTheColdestSessionsBlocksFirst) {
  Start(Options(8, 8));
  Session* a = Put("a", 2);
  Session* b = Put("b", 2);
  EXPECT_EQ(reclaim().DemoteColdest(3), 3u);
  EXPECT_EQ(m_->mover.demoting(), 3u);
  EXPECT_EQ(rec(a->chain[0]).state, BlockState::kDemoting);
  EXPECT_EQ(rec(a->chain[1]).state, BlockState::kDemoting);
  EXPECT_EQ(rec(b->chain[0]).state, BlockState::kDemoting) << "then the next coldest, from its first block";
  EXPECT_TRUE(rec(b->chain[1]).ReadyIn(Tier::kGpu));
  EXPECT_EQ(m_->mover.copies_in_flight(), 3u) << "submitted, not only scheduled";
  WaitIdle();
  EXPECT_TRUE(rec(a->chain[1]).ReadyIn(Tier::kHost));
  EXPECT_TRUE(rec(b->chain[0]).ReadyIn(Tier::kHost));
  EXPECT_EQ(Free(Tier::kGpu), 7u);
  EXPECT_EQ(Free(Tier::kHost), 5u);
  EXPECT_TRUE(freed_.empty()) << "demotion loses nothing";
}

TEST_F(ReclaimTest, DemoteColdestLeavesLeasedBlocksAndStopsWhenTheHostTierIsFull) {
  Start(Options(8, 2));
  Session* a = Put("a", 4);
  Lease(a->chain[0]);
  EXPECT_EQ(reclaim().DemoteColdest(4), 2u);
  EXPECT_TRUE(rec(a->chain[0]).ReadyIn(Tier::kGpu)) << "leased";
  EXPECT_EQ(rec(a->chain[1]).state, BlockState::kDemoting);
  EXPECT_EQ(rec(a->chain[2]).state, BlockState::kDemoting);
  EXPECT_TRUE(rec(a->chain[3]).ReadyIn(Tier::kGpu)) << "no host slot left for it";
  EXPECT_EQ(Free(Tier::kHost), 0u);
  WaitIdle();
  Lease(a->chain[0], false);
  EXPECT_TRUE(freed_.empty());
}

// A block used by a warmer session since this session's last use is demoted
// in that session's turn, not with the colder one.
TEST_F(ReclaimTest, ASharedBlockIsDemotedInTheTurnOfItsWarmestSession) {
  Start(Options(8, 8));
  Session* a = Put("a", 2);
  const uint32_t shared = a->chain[0];
  Session* b = Put("b", 1, Tier::kGpu, {shared});
  EXPECT_EQ(rec(shared).refs, 2u);
  EXPECT_EQ(reclaim().DemoteColdest(1), 1u);
  EXPECT_EQ(rec(a->chain[1]).state, BlockState::kDemoting) << "a's own block";
  EXPECT_TRUE(rec(shared).ReadyIn(Tier::kGpu)) << "b used it since a did";
  WaitIdle();
  EXPECT_EQ(reclaim().DemoteColdest(2), 2u);
  EXPECT_EQ(rec(shared).state, BlockState::kDemoting);
  EXPECT_EQ(rec(b->chain[1]).state, BlockState::kDemoting);
  WaitIdle();
  EXPECT_EQ(Free(Tier::kGpu), 8u);
}

// MakeGpuRoom counts the slots that demotions in flight will free: asked
// again before they land, it schedules nothing more.
TEST_F(ReclaimTest, MakeGpuRoomCountsTheDemotionsInFlight) {
  Start(Options(4, 8));
  Put("a", 4);
  reclaim().MakeGpuRoom(2);
  EXPECT_EQ(m_->mover.demoting(), 2u);
  reclaim().MakeGpuRoom(2);
  EXPECT_EQ(m_->mover.demoting(), 2u) << "two are coming already";
  reclaim().MakeGpuRoom(3);
  EXPECT_EQ(m_->mover.demoting(), 3u);
  reclaim().WaitForGpuRoom(3, kWait);
  EXPECT_EQ(Free(Tier::kGpu), 3u);
  EXPECT_TRUE(freed_.empty()) << "never loses a block";
  WaitIdle();
}

// --- Drops ---------------------------------------------------------------------------

TEST_F(ReclaimTest, DropFromTierCutsTheTailsOfTheColdestSessions) {
  Start(Options(8, 8));
  Session* a = Put("a", 3);
  Session* b = Put("b", 2);
  const BlockKey a1 = rec(a->chain[1]).key, a2 = rec(a->chain[2]).key;
  EXPECT_EQ(reclaim().DropFromTier(Tier::kGpu, 2), 2u);
  EXPECT_EQ(a->chain.size(), 1u);
  EXPECT_EQ(b->chain.size(), 2u);
  ASSERT_EQ(freed_.size(), 2u);
  EXPECT_EQ(freed_[0].key, a2) << "the last block first";
  EXPECT_EQ(freed_[1].key, a1);
  EXPECT_TRUE(freed_[0].dropped && freed_[1].dropped);
  EXPECT_EQ(m_->stats.dropped_blocks, 2u);
  EXPECT_EQ(m_->blocks.index().Find(a2), kNoRecord);
  EXPECT_EQ(Free(Tier::kGpu), 5u);
  EXPECT_EQ(reclaim().DropFromTier(Tier::kHost, 1), 0u) << "nothing in the host tier";
}

// A session whose last block is leased keeps its chain; `keep` is never cut;
// a session cut to nothing is gone (emptied, not counted as evicted).
TEST_F(ReclaimTest, DropFromTierPassesLeasedTailsAndTheKeptSession) {
  Start(Options(8, 8));
  Session* a = Put("a", 2);
  Session* b = Put("b", 2);
  Put("c", 2);
  Lease(a->chain.back());
  EXPECT_EQ(reclaim().DropFromTier(Tier::kGpu, 2, nullptr, /*keep=*/b), 2u);
  EXPECT_EQ(a->chain.size(), 2u);
  EXPECT_EQ(b->chain.size(), 2u);
  EXPECT_FALSE(Exists("c"));
  EXPECT_EQ(account().sessions, 2u);
  EXPECT_EQ(m_->stats.evicted_sessions, 0u);
  EXPECT_EQ(reclaim().DropFromTier(Tier::kGpu, 4, nullptr, b), 0u) << "only a's leased tail left";
  Lease(a->chain.back(), false);
}

// Droppable predicts DropFromTier and changes nothing: a block comes free only
// when the last chain holding it is cut.
TEST_F(ReclaimTest, DroppableCountsWhatDropFromTierWouldFree) {
  Start(Options(8, 8));
  Session* a = Put("a", 3);
  Session* b = Put("b", 1, Tier::kGpu, {a->chain[0], a->chain[1]});
  EXPECT_EQ(reclaim().Droppable(Tier::kGpu, 10), 4u);
  EXPECT_EQ(reclaim().Droppable(Tier::kGpu, 2), 2u) << "at most `need`";
  EXPECT_EQ(reclaim().Droppable(Tier::kGpu, 10, nullptr, /*keep=*/b), 1u) << "b still holds the shared blocks";
  EXPECT_EQ(reclaim().Droppable(Tier::kHost, 10), 0u);
  EXPECT_EQ(reclaim().Droppable(Tier::kGpu, 10, &m_->tenants.Get(other_)), 0u) << "another tenant's";
  EXPECT_EQ(a->chain.size(), 3u);
  EXPECT_EQ(Free(Tier::kGpu), 4u);
  EXPECT_TRUE(freed_.empty());

  EXPECT_EQ(reclaim().DropFromTier(Tier::kGpu, 10, nullptr, b), 1u);
  EXPECT_FALSE(Exists("a")) << "cut to nothing";
  EXPECT_EQ(b->chain.size(), 3u);
  EXPECT_EQ(Free(Tier::kGpu), 5u);
}

TEST_F(ReclaimTest, MakeHostRoomForDropsColderHostBlocks) {
  Start(Options(8, 2));
  Put("old", 2, Tier::kHost);
  Session* s = Put("s", 2);
  EXPECT_EQ(Free(Tier::kHost), 0u);
  reclaim().MakeHostRoomFor(s, 2);
  EXPECT_EQ(Free(Tier::kHost), 2u);
  EXPECT_FALSE(Exists("old"));
  EXPECT_EQ(freed_.size(), 2u);
  EXPECT_EQ(s->chain.size(), 2u) << "its GPU blocks stay for the demotion";
}

// --- Watermarks ----------------------------------------------------------------------

TEST_F(ReclaimTest, AboveTheGpuHighWatermarkTheColdestAreDemotedToTheLowOne) {
  EngineOptions o = Options(10, 16);
  o.gpu_high_watermark = 0.8;
  o.gpu_low_watermark = 0.5;
  Start(o);
  Put("a", 3);
  Put("b", 3);
  Put("c", 2);
  reclaim().EnforceWatermarks();
  EXPECT_EQ(m_->mover.demoting(), 0u) << "8 of 10 is at the high watermark, not above";
  Put("d", 1);
  reclaim().EnforceWatermarks();
  EXPECT_EQ(m_->mover.demoting(), 4u) << "9 down to 5";
  reclaim().EnforceWatermarks();
  EXPECT_EQ(m_->mover.demoting(), 4u) << "the demotions in flight count as done";
  WaitIdle();
  EXPECT_EQ(m_->slots(Tier::kGpu).used(), 5u);
  EXPECT_EQ(m_->slots(Tier::kHost).used(), 4u);
  EXPECT_TRUE(freed_.empty());
}

TEST_F(ReclaimTest, AboveTheHostHighWatermarkTheColdestAreDroppedToTheLowOne) {
  EngineOptions o = Options(4, 10);
  o.host_high_watermark = 0.8;
  o.host_low_watermark = 0.5;
  Start(o);
  Put("a", 3, Tier::kHost);
  Put("b", 3, Tier::kHost);
  Put("c", 3, Tier::kHost);
  reclaim().EnforceWatermarks();
  EXPECT_EQ(m_->slots(Tier::kHost).used(), 5u);
  EXPECT_EQ(freed_.size(), 4u);
  EXPECT_EQ(m_->stats.dropped_blocks, 4u);
  EXPECT_FALSE(Exists("a"));
  EXPECT_EQ(m_->FindSession(tenant_, "b")->chain.size(), 2u);
  EXPECT_EQ(m_->FindSession(tenant_, "c")->chain.size(), 3u);
}

// --- Quotas --------------------------------------------------------------------------

// At its GPU quota, a tenant's own coldest blocks make room, never another tenant's.
TEST_F(ReclaimTest, MakeQuotaRoomDemotesTheTenantsOwnColdestBlocks) {
  Start(WithGpuQuota(Options(16, 16), 4));
  Session* x = PutAs(other_, "x", 3);
  Session* s1 = Put("s1", 2);
  Put("s2", 2);
  ASSERT_EQ(account().Room(Tier::kGpu), 0u);
  EXPECT_TRUE(reclaim().MakeQuotaRoom(account(), 2, nullptr, "commit of 2 new blocks").ok());
  EXPECT_EQ(rec(s1->chain[0]).state, BlockState::kDemoting);
  EXPECT_EQ(rec(s1->chain[1]).state, BlockState::kDemoting);
  for (uint32_t r : x->chain) EXPECT_TRUE(rec(r).ReadyIn(Tier::kGpu)) << "the other tenant's, though colder";
  EXPECT_EQ(account().Room(Tier::kGpu), 2u) << "moves count where they land";
  EXPECT_TRUE(reclaim().MakeQuotaRoom(account(), 2, nullptr, "again").ok());
  EXPECT_EQ(m_->mover.demoting(), 2u) << "the room is there already";
  EXPECT_TRUE(reclaim().MakeQuotaRoom(m_->tenants.Get(other_), 100, nullptr, "no quota").ok());
  EXPECT_EQ(m_->mover.demoting(), 2u);
  WaitIdle();
  EXPECT_TRUE(freed_.empty());
}

// With the host tier too full to take the demotions, the tenant's coldest
// GPU blocks are dropped, but only when that makes the whole room.
TEST_F(ReclaimTest, MakeQuotaRoomDropsOnlyWhenThatMakesEnoughRoom) {
  Start(WithGpuQuota(Options(16, 1), 4));
  Session* s = Put("s", 4);
  const Status refused = reclaim().MakeQuotaRoom(account(), 2, s, "commit of 2 new blocks");
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "commit of 2 new blocks: tenant 'tenant' holds 3 gpu blocks, its quota is 4 (tenants: gpu_blocks), and "
            "its other blocks are leased, moving or in use by this session");
  EXPECT_TRUE(freed_.empty()) << "the session's own blocks are not dropped for it";
  EXPECT_EQ(m_->mover.demoting(), 1u) << "the one demotion the host tier has room for";

  EXPECT_TRUE(reclaim().MakeQuotaRoom(account(), 2, nullptr, "allocate 2").ok());
  ASSERT_EQ(freed_.size(), 1u);
  EXPECT_TRUE(freed_[0].dropped);
  EXPECT_EQ(s->chain.size(), 3u) << "its last block was dropped";
  EXPECT_EQ(account().Room(Tier::kGpu), 2u);
  WaitIdle();
}

// Dropping some of its blocks would not make the room: none is dropped, so a
// refused request loses nothing.
TEST_F(ReclaimTest, MakeQuotaRoomDropsNothingWhenThatCannotMakeEnoughRoom) {
  Start(WithGpuQuota(Options(16, 1), 4));
  Session* a = Put("a", 2);
  Session* b = Put("b", 2);
  for (uint32_t r : b->chain) Lease(r);
  // One demotion fits the host tier; then only a's last block could go: room
  // for 2 of the 3 blocks asked for.
  const Status st = reclaim().MakeQuotaRoom(account(), 3, nullptr, "commit of 3 new blocks");
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reclaim().Droppable(Tier::kGpu, 3, &account()), 1u) << "a's last block";
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(a->chain.size(), 2u);
  EXPECT_EQ(m_->mover.demoting(), 1u);
  WaitIdle();
  for (uint32_t r : b->chain) Lease(r, false);
}

TEST_F(ReclaimTest, MakeQuotaRoomNamesTheQuotaWhenNothingCanMakeRoom) {
  Start(WithGpuQuota(Options(16, 16), 4));
  Session* s = Put("s", 3);
  for (uint32_t r : s->chain) Lease(r);
  account().Leased(1);  // A write lease's slot.
  const Status leased = reclaim().MakeQuotaRoom(account(), 2, nullptr, "commit of 2 new blocks");
  EXPECT_EQ(leased.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(leased.message(),
            "commit of 2 new blocks: tenant 'tenant' holds 4 gpu blocks (1 of them slots of uncommitted write "
            "leases), its quota is 4 (tenants: gpu_blocks), and its other blocks are leased, moving");
  // The request's own lease slot (credit) is not held against it.
  EXPECT_TRUE(reclaim().MakeQuotaRoom(account(), 1, nullptr, "commit", /*credit=*/1).ok());
  const Status past = reclaim().MakeQuotaRoom(account(), 5, nullptr, "allocate 5");
  EXPECT_EQ(past.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(past.message(),
            "allocate 5: tenant 'tenant' holds 4 gpu blocks (1 of them slots of uncommitted write leases), its quota "
            "is 4 (tenants: gpu_blocks)")
      << "more than the whole quota: nothing is tried";
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(m_->mover.demoting(), 0u);
  account().Unleased(1);
  for (uint32_t r : s->chain) Lease(r, false);
}

}  // namespace
}  // namespace kvtier::tiering
