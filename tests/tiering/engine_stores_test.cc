// Engine: the stores below the host tier — blocks offered to them
// (EngineOptions::on_spill), blocks fetched from them and imported, and the
// keys a session keeps of blocks dropped into them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

// --- The stores below the host tier: blocks offered to them, blocks imported ----------

struct Spilled {
  BlockKey key, parent;
  Namespace key_ns;
  std::vector<TokenId> tokens;
  std::vector<std::byte> payload;
  bool dropped;
};

class EngineStoreTest : public EngineTest {
 protected:
  EngineOptions SpillOptions(uint32_t gpu_slots, uint32_t host_slots) {
    EngineOptions o = Options(gpu_slots, host_slots);
    o.on_spill = [this](const HostBlock& b) {
      spilled_.push_back(Spilled{b.key,
                                 b.parent,
                                 b.key_ns,
                                 {b.tokens.begin(), b.tokens.end()},
                                 {b.payload.begin(), b.payload.end()},
                                 b.dropped});
    };
    return o;
  }
  // The bytes of block `i` of `c`, as a store would hand them back.
  std::vector<std::byte> Payload(const Chain& c, uint32_t i) const {
    std::vector<std::byte> p(engine_->profile().BlockBytes());
    FillBlock(p.data(), c.keys[i]);
    return p;
  }
  void ExpectSpilledIs(const Spilled& s, const Chain& c, uint32_t i) const {
    EXPECT_EQ(s.key, c.keys[i]);
    EXPECT_EQ(s.parent, i == 0 ? BlockKey{} : c.keys[i - 1]);
    EXPECT_EQ(s.key_ns, ns_);
    EXPECT_EQ(s.tokens, std::vector<TokenId>(c.block(i).begin(), c.block(i).end()));
    EXPECT_EQ(s.payload, Payload(c, i));
  }
  std::vector<Spilled> spilled_;
};

TEST_F(EngineStoreTest, BlocksLandingInTheHostTierAreOfferedOnceWithTheirBytes) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("s", c);
  EXPECT_TRUE(spilled_.empty()) << "blocks in the GPU tier are not offered";
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  ASSERT_EQ(spilled_.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(spilled_[i].dropped);
    ExpectSpilledIs(spilled_[i], c, i);
  }
  // Promoted and demoted again: the stores have it already.
  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(spilled_.size(), 3u);
  EXPECT_EQ(engine_->stats().spilled_blocks, 3u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineStoreTest, BlocksPressureDropsFromTheHostTierAreOfferedBeforeTheirSlotIsReused) {
  Start(SpillOptions(4, 2));
  const Chain a = MakeChain(1, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  spilled_.clear();
  // b's demotion needs the host tier's two slots: a's blocks are dropped, tail first.
  const Chain b = MakeChain(2, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("b", b));
  std::vector<const Spilled*> dropped;
  for (const Spilled& s : spilled_) {
    if (s.dropped) dropped.push_back(&s);
  }
  ASSERT_EQ(dropped.size(), 2u);
  ExpectSpilledIs(*dropped[0], a, 1);
  ExpectSpilledIs(*dropped[1], a, 0);
  EXPECT_INVARIANTS();
}

TEST_F(EngineStoreTest, FetchedBlocksAreServedAndPromotedByTheAcquireThatBroughtThem) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(3, 4);
  std::vector<std::vector<std::byte>> bytes;
  for (uint32_t i = 0; i < 4; ++i) bytes.push_back(Payload(c, i));
  FetchedBlocks fetched{0, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, true, &fetched);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_EQ(lease->imported, 4u);
  EXPECT_EQ(lease->promoted, 4u);
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 4));
  EXPECT_EQ(engine_->stats().imported_blocks, 4u);
  EXPECT_EQ(engine_->stats().hit_blocks, 0u) << "imported blocks are no cache hits";
  // They came from a store: demoting them does not offer them back.
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(spilled_.empty());
  ExpectConsistent();
}

TEST_F(EngineStoreTest, HitsAreCountedByTheTierTheyWereFoundIn) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(10, 3);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("s", c));
  auto lease = Get("s", c);  // Found in the host tier, promoted.
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  lease = Get("s", c);  // Found in the GPU tier.
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.hit_blocks_in[Tier::kHost], 3u);
  EXPECT_EQ(st.hit_blocks_in[Tier::kGpu], 3u);
  EXPECT_EQ(st.hit_blocks, 6u);
}

TEST_F(EngineStoreTest, FetchedBlocksContinueTheCachedPrefixUntilTheHostTierIsFull) {
  Start(SpillOptions(8, 2));
  const Chain c = MakeChain(4, 5);
  Chain head = c;
  head.tokens.resize(2 * kBt);
  head.keys.resize(2);
  Put("s", head);  // Blocks 0 and 1, in the GPU tier.
  std::vector<std::vector<std::byte>> bytes;
  for (uint32_t i = 1; i < 5; ++i) bytes.push_back(Payload(c, i));
  // A fetch that started when only block 0 was cached: block 1 is skipped,
  // and the host tier's two slots take blocks 2 and 3.
  FetchedBlocks fetched{1, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, /*promote=*/false, &fetched);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_EQ(lease->imported, 2u);
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(Tiers("s"), (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kHost, Tier::kHost}));
  ExpectConsistent();
}

// A fetch that came after its Acquire stopped waiting: placed into the
// session, unleased, without counting a lookup; not where the session moved on.
TEST_F(EngineStoreTest, ALateFetchLandsInItsSessionUnlessTheSessionMovedOn) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(5, 4);
  Chain head = c;
  head.tokens.resize(kBt);
  head.keys.resize(1);
  Put("s", head);  // Block 0 cached, in the session; the fetch continues from it.
  std::vector<std::vector<std::byte>> bytes;
  for (uint32_t i = 1; i < 4; ++i) bytes.push_back(Payload(c, i));
  const FetchedBlocks fetched{1, {bytes.begin(), bytes.end()}};
  const uint64_t hits = engine_->stats().hit_blocks, misses = engine_->stats().miss_blocks;
  auto placed = engine_->ImportLate(tenant_, "s", c.keys, c.tokens, fetched);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(*placed, 3u);
  EXPECT_EQ(Tiers("s"), (std::vector<Tier>{Tier::kGpu, Tier::kHost, Tier::kHost, Tier::kHost}));
  EXPECT_EQ(engine_->stats().read_leases, 0u);
  EXPECT_EQ(engine_->stats().hit_blocks, hits);
  EXPECT_EQ(engine_->stats().miss_blocks, misses);
  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());

  // A cold session (nothing cached): made with the blocks.
  const Chain d = MakeChain(6, 2);
  std::vector<std::vector<std::byte>> dbytes{Payload(d, 0), Payload(d, 1)};
  EXPECT_EQ(*engine_->ImportLate(tenant_, "cold", d.keys, d.tokens, FetchedBlocks{0, {dbytes.begin(), dbytes.end()}}),
            2u);
  EXPECT_EQ(Tiers("cold"), All(Tier::kHost, 2));

  // A session whose chain moved on to other tokens since: left alone, nothing placed.
  const Chain e = MakeChain(7, 3), other = MakeChain(8, 1);
  Put("moved", other);
  std::vector<std::vector<std::byte>> ebytes{Payload(e, 0), Payload(e, 1), Payload(e, 2)};
  EXPECT_EQ(*engine_->ImportLate(tenant_, "moved", e.keys, e.tokens, FetchedBlocks{0, {ebytes.begin(), ebytes.end()}}),
            0u);
  EXPECT_EQ(Tiers("moved"), All(Tier::kGpu, 1));
  EXPECT_EQ(engine_->Match(tenant_.ns, e.keys, e.tokens), 0u) << "no unheld block left behind";
  // No session named: nothing would hold them.
  EXPECT_EQ(*engine_->ImportLate(tenant_, "", e.keys, e.tokens, FetchedBlocks{0, {ebytes.begin(), ebytes.end()}}),
            0u);
  ExpectConsistent();
}

TEST_F(EngineStoreTest, FetchedBlocksThatDoNotFitTheRequestOrThePoolAreLeftOut) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(5, 3);
  std::vector<std::vector<std::byte>> bytes{Payload(c, 0), Payload(c, 1), Payload(c, 2)};
  // Fetched for a longer prefix than is cached: they do not continue it.
  FetchedBlocks late{1, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, true, &late);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  // Blocks of another size than the pool's slots.
  std::vector<std::byte> short_block(10);
  FetchedBlocks wrong{0, {std::span<const std::byte>(short_block)}};
  lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, true, &wrong);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  // Bytes for other tokens than the request's are published under the keys
  // their tokens give, which are not the requested ones: nothing is served.
  const Chain other = MakeChain(6, 3);
  FetchedBlocks forged{0, {bytes.begin(), bytes.end()}};
  lease = engine_->Acquire(tenant_, "s", c.keys, other.tokens, true, &forged);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(engine_->stats().imported_blocks, 0u);
  ExpectConsistent();
}

TEST_F(EngineStoreTest, CommittedBlocksAreCopiedAndOfferedOnceTheirWriterIsDone) {
  EngineOptions o = SpillOptions(8, 8);
  o.spill_committed = true;
  Start(o, /*manual=*/true);
  const Chain c = MakeChain(7, 3);
  // Written by the client's GPU: nothing is copied before its event completes.
  auto w = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w.ok());
  for (uint32_t i = 0; i < 3; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
  wire::IpcEventHandle event{};
  event[0] = 9;
  auto watch = manual_->WatchClientEvent(1, event);
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, w->slots, GpuWork{*watch, 1}).ok());
  ASSERT_TRUE(engine_->Release(w->id).ok());
  engine_->Poll();
  manual_->RunAll();
  engine_->Poll();
  EXPECT_TRUE(spilled_.empty()) << "a block is copied only once its writer is done";
  manual_->events[9] = Backend::WorkState::kDone;
  engine_->Poll();  // The writer is done: the copies are submitted...
  EXPECT_TRUE(spilled_.empty());
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 3u) << "...each into a host slot of its own";
  EXPECT_INVARIANTS();
  manual_->RunAll();
  engine_->Poll();  // ...and offered when they land.
  ASSERT_EQ(spilled_.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(spilled_[i].dropped);
    ExpectSpilledIs(spilled_[i], c, i);
  }
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 3)) << "the blocks stay where they are";
  // Landing in the host tier later offers them no second time.
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(spilled_.size(), 3u);
  ExpectConsistent();
}

TEST_F(EngineStoreTest, WithTheHostTierFullCommittedBlocksAreOfferedWhenTheyLandThere) {
  EngineOptions o = SpillOptions(8, 2);
  o.spill_committed = true;
  Start(o);
  const Chain a = MakeChain(8, 2);
  Put("a", a);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  for (int i = 0; i < 1000 && spilled_.size() < 2; ++i) {
    engine_->Poll();
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_EQ(spilled_.size(), 2u);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);  // The host tier is full now.
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  const Chain b = MakeChain(9, 2);
  Put("b", b);
  engine_->Poll();
  EXPECT_EQ(spilled_.size(), 2u) << "no host slot to copy b into: nothing evicted for it";
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 2));
  ExpectConsistent();
}

// a's two blocks dropped from the host tier by b's demotion (4 GPU, 2 host slots).
class EngineStoreBelowTest : public EngineStoreTest {
 protected:
  void DropA(const EngineOptions& o) {
    Start(o);
    Put("a", a_);
    ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
    ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
    Put("b", b_);
    ASSERT_EQ(*engine_->Demote(tenant_, "b"), 2u);
    ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  }
  std::vector<std::vector<std::byte>> Payloads(const Chain& c, uint32_t n) const {
    std::vector<std::vector<std::byte>> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(Payload(c, i));
    return out;
  }
  Chain a_ = MakeChain(20, 2), b_ = MakeChain(21, 2);
};

TEST_F(EngineStoreBelowTest, ASessionKeepsTheKeysOfBlocksDroppedIntoTheStores) {
  DropA(SpillOptions(4, 2));
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok()) << "a session whose blocks all went into the stores lives on: " << info.status().ToString();
  EXPECT_EQ(info->blocks, 0u);
  EXPECT_TRUE(info->chain.empty());
  EXPECT_EQ(info->blocks_below, 2u);
  EXPECT_EQ(info->below, a_.keys);
  EXPECT_EQ(info->below_local, (std::vector<std::optional<Tier>>{std::nullopt, std::nullopt}));
  bool listed = false;
  for (const SessionInfo& s : engine_->ListSessions()) {
    if (s.id == "a") {
      listed = true;
      EXPECT_EQ(s.blocks_below, 2u);
      EXPECT_TRUE(s.below.empty()) << "listings carry no keys";
    }
  }
  EXPECT_TRUE(listed);
  ExpectConsistent();
}

TEST_F(EngineStoreBelowTest, WithoutStoresADroppedSessionIsGone) {
  EngineOptions o = Options(4, 2);
  DropA(o);
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound);
}

TEST_F(EngineStoreBelowTest, BlocksBroughtBackFromTheStoresLeaveTheListBelow) {
  DropA(SpillOptions(4, 2));
  // The first block fetched back: the second is still below it.
  const auto bytes = Payloads(a_, 1);
  FetchedBlocks fetched{0, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "a", a_.keys, a_.tokens, /*promote=*/false, &fetched);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 1u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->blocks, 1u);
  EXPECT_EQ(info->below, std::vector<BlockKey>{a_.keys[1]});
  // Recomputed and committed again: the chain holds both, nothing is below.
  Put("a", a_, 1);
  info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->blocks, 2u);
  EXPECT_TRUE(info->below.empty());
  ExpectConsistent();
}

TEST_F(EngineStoreBelowTest, AChainThatGoesAnotherWayForgetsTheBlocksBelow) {
  DropA(SpillOptions(4, 2));
  const Chain other = MakeChain(22, 1);
  Put("a", other);
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->chain, other.keys);
  EXPECT_TRUE(info->below.empty()) << "a's old blocks do not continue the new chain";
  ExpectConsistent();
}

TEST_F(EngineStoreBelowTest, ASessionWithOnlyBlocksBelowMakesRoomUnderTheTenantsSessionLimit) {
  EngineOptions o = SpillOptions(4, 2);
  o.max_sessions_per_tenant = 2;
  DropA(o);  // a holds no block now, b two.
  Put("c", MakeChain(23, 1));
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetSession(tenant_, "b").ok());
  EXPECT_TRUE(engine_->GetSession(tenant_, "c").ok());
  // No such session left: the limit holds.
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok());
  const Chain d = MakeChain(24, 1);
  EXPECT_EQ(engine_->Commit(w->id, tenant_, "d", BlockKey{}, 0, d.tokens, w->slots).status().code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

}  // namespace
}  // namespace kvtier::tiering
