// Engine: clients' GPU work — nothing is reused, served or moved before the
// work a client reports is done (emulated events of ManualBackend).
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

// --- Clients' GPU work: nothing is reused, served or moved before it is done ------

class EngineGpuWorkTest : public EngineTest {
 protected:
  // The work of client `client` ending in emulated event `event`.
  GpuWork Work(uint8_t event, uint64_t client = 7) {
    wire::IpcEventHandle h{};
    h[0] = event;
    auto w = manual_->WatchClientEvent(client, h);
    EXPECT_TRUE(w.ok());
    return GpuWork{w.ok() ? *w : 0, client};
  }
  void Finish(uint8_t event, Backend::WorkState state = Backend::WorkState::kDone) { manual_->events[event] = state; }

  // Writes `c` into a fresh write lease and commits it with writer work `writer`.
  WriteLease Written(const std::string& session, const Chain& c, GpuWork writer) {
    auto w = engine_->Allocate(tenant_, c.blocks());
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return {};
    for (uint32_t i = 0; i < c.blocks(); ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
    auto r = engine_->Commit(w->id, tenant_, session, BlockKey{}, 0, c.tokens, w->slots, writer);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *w;
  }
};

// A write lease released with work still running keeps its slots until the
// work is done: they are not handed to the next writer before.
TEST_F(EngineGpuWorkTest, ReleasedWriteSlotsAreReusedOnlyAfterTheWork) {
  Start(Options(4, 4), /*manual=*/true);
  auto w = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(engine_->Release(w->id, Work(1)).ok());
  EXPECT_EQ(engine_->stats().write_leases, 0u) << "gone for its holder";
  EXPECT_EQ(engine_->stats().gpu_work_pending, 1u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 4u) << "the slots wait for the work";
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 4u) << "and stay on the tenant's count";
  EXPECT_EQ(engine_->Allocate(tenant_, 1).status().code(), StatusCode::kResourceExhausted);
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 4u);
  EXPECT_INVARIANTS();

  Finish(1);
  EXPECT_EQ(engine_->Poll(), 4u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().gpu_work_pending, 0u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  EXPECT_EQ(manual_->open_watches(), 0u) << "the watch ended with the work";
  EXPECT_TRUE(engine_->Allocate(tenant_, 4).ok());
  EXPECT_INVARIANTS();
}

// A read lease released with work still reading keeps its blocks pinned: an
// evicted session's blocks are freed, and others demoted, only after it.
TEST_F(EngineGpuWorkTest, ReleasedReadLeasePinsItsBlocksUntilTheWork) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 3);
  Put("a", a);
  auto lease = Get("", a);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id, Work(2)).ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(FreedCount(false), 0u) << "still read by the client's GPU";
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u);
  EXPECT_INVARIANTS();
  Finish(2);
  engine_->Poll();
  EXPECT_EQ(FreedCount(false), 3u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(manual_->open_watches(), 0u);
  EXPECT_INVARIANTS();

  // Pinned blocks are not demoted either.
  Put("b", MakeChain(2, 2));
  auto lb = Get("b", MakeChain(2, 2));
  ASSERT_TRUE(lb.ok());
  ASSERT_TRUE(engine_->Release(lb->id, Work(3)).ok());
  EXPECT_EQ(engine_->Demote(tenant_, "b").value(), 0u);
  Finish(3);
  engine_->Poll();
  EXPECT_EQ(engine_->Demote(tenant_, "b").value(), 2u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_INVARIANTS();
}

// Blocks committed with their writer's work still running are neither served
// nor demoted, and a duplicate's slot is not reused, until the work is done.
TEST_F(EngineGpuWorkTest, CommittedBlocksWaitForTheirWriter) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain c = MakeChain(1, 3);
  WriteLease w = Written("s", c, Work(4));
  EXPECT_EQ(engine_->GetSession(tenant_, "s")->blocks, 3u) << "committed at once";
  auto early = Get("", c);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->matched, 0u) << "not served while the writer may still write";
  EXPECT_EQ(engine_->Demote(tenant_, "s").value(), 0u) << "not copied to the host tier either";
  // A second writer of the same blocks: duplicates, whose slots wait for it.
  auto w2 = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w2.ok());
  auto dup = engine_->Commit(w2->id, tenant_, "t", BlockKey{}, 0, c.tokens, w2->slots, Work(5));
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(dup->duplicates, 3u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 6u);
  EXPECT_INVARIANTS();

  Finish(5);
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u) << "the duplicates' slots are free";
  EXPECT_EQ(Get("", c)->matched, 0u) << "the first writer is still at it";
  Finish(4);
  auto late = Get("", c);  // Acquire sees the work done itself, without a Poll.
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->matched, 3u);
  ExpectLeaseHolds(*late, c);
  ASSERT_TRUE(engine_->Release(late->id).ok());
  EXPECT_EQ(engine_->Demote(tenant_, "s").value(), 3u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(manual_->open_watches(), 0u);
  ExpectConsistent();
  ASSERT_TRUE(engine_->Release(w.id).ok());
  ASSERT_TRUE(engine_->Release(w2->id).ok());
}

// A writer that goes away (or whose event fails) before its work is done loses
// the blocks: out of every session and the index at once, never served, and
// their slots come free only when the work is over.
TEST_F(EngineGpuWorkTest, AGoneWritersUnfinishedBlocksAreDropped) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain c = MakeChain(1, 3);
  const Chain longer = MakeChain(2, 1, &c);
  Put("base", MakeChain(9, 1));
  WriteLease w = Written("s", c, Work(6, /*client=*/42));
  // Another session took the same blocks as duplicates, then went on.
  auto w2 = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE(engine_->Commit(w2->id, tenant_, "t", BlockKey{}, 0, longer.tokens, w2->slots).ok());
  EXPECT_EQ(engine_->ClientGone(/*client=*/41), 0u) << "another client's work";
  EXPECT_EQ(engine_->ClientGone(/*client=*/42), 3u);
  EXPECT_EQ(engine_->stats().unfinished_writes_dropped, 3u);
  EXPECT_EQ(engine_->GetSession(tenant_, "s").status().code(), StatusCode::kNotFound) << "emptied";
  EXPECT_EQ(engine_->GetSession(tenant_, "t").status().code(), StatusCode::kNotFound) << "cut before block 0";
  EXPECT_EQ(engine_->GetSession(tenant_, "base")->blocks, 1u) << "untouched";
  EXPECT_EQ(engine_->stats().blocks, 1u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u + 1u) << "the dropped blocks' slots wait for the work";
  EXPECT_INVARIANTS();
  Finish(6);
  EXPECT_EQ(Get("", c)->matched, 0u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 1u) << "base alone";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w.id).ok());
  ASSERT_TRUE(engine_->Release(w2->id).ok());

  // A failed event: the blocks it was writing are dropped at the next Poll.
  ASSERT_TRUE(engine_->EvictSessions(std::nullopt) > 0);
  WriteLease w3 = Written("u", c, Work(8));
  Finish(8, Backend::WorkState::kFailed);
  engine_->Poll();
  EXPECT_EQ(engine_->GetSession(tenant_, "u").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().unfinished_writes_dropped, 6u);
  EXPECT_EQ(manual_->open_watches(), 0u);
  ExpectConsistent();
  ASSERT_TRUE(engine_->Release(w3.id).ok());
}

// Work that never reports done is given back after the lease timeout, as a
// lease held that long would be; so is work of an engine that goes away.
TEST_F(EngineGpuWorkTest, WorkThatNeverEndsExpiresWithTheLeaseTimeout) {
  EngineOptions o = Options(4, 4);
  o.lease_timeout = milliseconds(30);
  Start(o, /*manual=*/true);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(engine_->Release(w->id, Work(9)).ok());
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 2u);
  std::this_thread::sleep_for(milliseconds(40));
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().expired_gpu_work, 1u);
  EXPECT_EQ(manual_->open_watches(), 0u);
  ASSERT_TRUE(engine_->Release(engine_->Allocate(tenant_, 1)->id, Work(10)).ok());
  EXPECT_EQ(manual_->open_watches(), 1u);
  EXPECT_INVARIANTS();
  engine_.reset();
  EXPECT_EQ(manual_->open_watches(), 0u) << "the engine ends the watches it holds";
}

}  // namespace
}  // namespace kvtier::tiering
