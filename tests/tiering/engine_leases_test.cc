// Engine: leases — what a read lease pins, and how leases expire with the
// lease timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

// --- Leases ------------------------------------------------------------------------

TEST_F(EngineTest, LeasedBlocksAreNeverDemotedOrFreed) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("s", c);
  auto lease = Get("", c);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->blocks.size(), 3u);

  auto demoted = engine_->Demote(tenant_, "s");
  ASSERT_TRUE(demoted.ok());
  EXPECT_EQ(*demoted, 0u) << "leased blocks are skipped";
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);

  // Evicting the only session while a reader holds the blocks keeps them alive.
  ASSERT_TRUE(engine_->Evict(tenant_, "s").ok());
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u);
  EXPECT_INVARIANTS();
  // Pressure cannot take them either.
  auto w = engine_->Allocate(tenant_, 6);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  engine_->Tick();
  ExpectLeaseHolds(*lease, c);

  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(freed_.size(), 3u);
  EXPECT_EQ(FreedCount(false), 3u) << "the last holder let go: not a drop";
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().blocks, 0u);
  EXPECT_EQ(Matched(c), 0u);
  EXPECT_EQ(engine_->Release(lease->id).code(), StatusCode::kNotFound) << "a lease ends once";
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, TwoReadersOfOneBlock) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 2);
  Put("s", c);
  auto l1 = Get("", c);
  auto l2 = Get("", c);
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_NE(l1->id, l2->id);
  EXPECT_EQ(engine_->stats().read_leases, 2u);
  ASSERT_TRUE(engine_->Evict(tenant_, "s").ok());
  ASSERT_TRUE(engine_->Release(l1->id).ok());
  EXPECT_TRUE(freed_.empty()) << "the second reader still holds them";
  ExpectLeaseHolds(*l2, c);
  ASSERT_TRUE(engine_->Release(l2->id).ok());
  EXPECT_EQ(freed_.size(), 2u);
  EXPECT_INVARIANTS();
}

// --- Lease lifetimes -----------------------------------------------------------

constexpr milliseconds kLeaseTimeout{1000};

EngineOptions WithLeaseTimeout(EngineOptions o) {
  o.lease_timeout = kLeaseTimeout;
  return o;
}

std::chrono::steady_clock::time_point Later(milliseconds by) { return std::chrono::steady_clock::now() + by; }

// A write lease older than the timeout is revoked: its slots go back to the
// pool (and off its tenant's quota), its commit fails with a clear error, and
// its release says it expired, once.
TEST_F(EngineQuotaTest, AnExpiredWriteLeaseGivesItsSlotsBackAndItsCommitFails) {
  Start(WithLeaseTimeout(QuotaOptions(4, 0)));
  auto w = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const Chain c = MakeChain(1, 4);
  for (uint32_t i = 0; i < 4; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
  EXPECT_EQ(engine_->ExpireLeases(std::chrono::steady_clock::now()).leases(), 0u) << "not old enough";
  EXPECT_FALSE(engine_->Allocate(tenant_, 1).ok()) << "the quota is full of leased slots";

  const LeaseExpiry expired = engine_->ExpireLeases(Later(kLeaseTimeout));
  EXPECT_EQ(expired.write, 1u);
  EXPECT_EQ(expired.read, 0u);
  EXPECT_EQ(expired.slots, 4u);
  EXPECT_FALSE(expired.more);
  EXPECT_TRUE(engine_->LeaseExpired(w->id));
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 0u) << "the slots are free again";
  EXPECT_EQ(st.write_leases, 0u);
  EXPECT_EQ(st.leased_slots, 0u);
  EXPECT_EQ(st.expired_write_leases, 1u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  EXPECT_INVARIANTS();

  // The slots now belong to a new lease, which writes and commits its own blocks.
  const Chain mine = MakeChain(2, 4);
  Put("other-writer", mine);
  auto r = engine_->Commit(w->id, tenant_, "late", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("write lease " + std::to_string(w->id) + " expired after"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("limits.lease_timeout_ms: 1000"), std::string::npos) << r.status().message();
  EXPECT_EQ(Matched(c), 0u) << "nothing of the expired lease was published";
  ExpectChainHolds(mine, 4);
  EXPECT_EQ(engine_->GetSession(tenant_, "late").status().code(), StatusCode::kNotFound);

  const Status released = engine_->Release(w->id);
  EXPECT_EQ(released.code(), StatusCode::kNotFound);
  EXPECT_NE(released.message().find("expired"), std::string::npos) << released.message();
  EXPECT_FALSE(engine_->LeaseExpired(w->id)) << "released: forgotten";
  const Status again = engine_->Release(w->id);
  EXPECT_NE(again.message().find("does not exist"), std::string::npos) << again.message();
  ExpectConsistent();
}

// A read lease older than the timeout is revoked: its pins end, so its blocks
// may be demoted, and freed once no session holds them.
TEST_F(EngineTest, AnExpiredReadLeaseUnpinsItsBlocks) {
  Start(WithLeaseTimeout(Options(8, 8)));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  auto la = Get("", a);
  auto lb = Get("", b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(engine_->Demote(tenant_, "a").value(), 0u) << "leased blocks never move";
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  EXPECT_EQ(Matched(b), 3u) << "the lease still holds b's blocks";

  const LeaseExpiry expired = engine_->ExpireLeases(Later(kLeaseTimeout));
  EXPECT_EQ(expired.read, 2u);
  EXPECT_EQ(expired.records, 7u);
  EXPECT_EQ(engine_->stats().read_leases, 0u);
  EXPECT_EQ(engine_->stats().expired_read_leases, 2u);
  EXPECT_EQ(Matched(b), 0u) << "no one held b's blocks any more";
  EXPECT_EQ(FreedCount(false), 3u);
  EXPECT_EQ(FreedCount(true), 0u) << "released, not dropped";
  EXPECT_EQ(engine_->Demote(tenant_, "a").value(), 4u) << "unpinned, a's blocks may move";
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  ExpectChainHolds(a, 4);

  const Status released = engine_->Release(la->id);
  EXPECT_EQ(released.code(), StatusCode::kNotFound);
  EXPECT_NE(released.message().find("read lease " + std::to_string(la->id) + " expired after"), std::string::npos)
      << released.message();
  EXPECT_NE(released.message().find("may be another block's"), std::string::npos) << released.message();
  EXPECT_TRUE(engine_->LeaseExpired(lb->id));
  ExpectConsistent();
}

// Leases expire oldest first; one that is younger than the timeout stays. The
// timeout may change (Retune): 0 means never.
TEST_F(EngineTest, LeasesExpireOldestFirstAndTheTimeoutMayChange) {
  Start(Options(8, 8));
  auto old_lease = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(old_lease.ok());
  std::this_thread::sleep_for(milliseconds(5));
  const auto between = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(milliseconds(5));
  auto young = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(young.ok());
  EXPECT_GE(engine_->stats().oldest_lease_ms, 10u);
  EXPECT_EQ(engine_->ExpireLeases(Later(std::chrono::hours(24 * 365))).leases(), 0u) << "no timeout: never";

  EngineOptions o = engine_->options();
  o.lease_timeout = kLeaseTimeout;
  ASSERT_TRUE(engine_->Retune(o).ok());
  const LeaseExpiry first = engine_->ExpireLeases(between + kLeaseTimeout);
  EXPECT_EQ(first.write, 1u);
  EXPECT_TRUE(engine_->LeaseExpired(old_lease->id));
  EXPECT_FALSE(engine_->LeaseExpired(young->id));
  EXPECT_EQ(engine_->stats().write_leases, 1u);
  EXPECT_LT(engine_->stats().oldest_lease_ms, 10'000u) << "the young lease is the oldest now";
  EXPECT_EQ(engine_->ExpireLeases(Later(kLeaseTimeout)).write, 1u);
  EXPECT_EQ(engine_->stats().oldest_lease_ms, 0u) << "none is held";
  o.lease_timeout = milliseconds(-1);
  EXPECT_EQ(engine_->Retune(o).code(), StatusCode::kInvalidArgument);
  EXPECT_INVARIANTS();
}

// One call gives back about kLeaseExpiryWork slots at most; the rest wait for
// the next call (the daemon's next tick), so a tick never stalls on a backlog.
TEST_F(EngineTest, LeaseExpiryIsBoundedPerCall) {
  constexpr uint32_t kPerLease = kLeaseExpiryWork / 2;
  Start(WithLeaseTimeout(Options(4 * kPerLease, 8)));
  std::vector<LeaseId> ids;
  for (int i = 0; i < 4; ++i) {
    auto w = engine_->Allocate(tenant_, kPerLease);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ids.push_back(w->id);
  }
  const auto when = Later(kLeaseTimeout);
  const LeaseExpiry first = engine_->ExpireLeases(when);
  EXPECT_EQ(first.write, 2u);
  EXPECT_EQ(first.slots, 2 * kPerLease);
  EXPECT_TRUE(first.more);
  EXPECT_TRUE(engine_->LeaseExpired(ids[0]) && engine_->LeaseExpired(ids[1]));
  EXPECT_FALSE(engine_->LeaseExpired(ids[2]) || engine_->LeaseExpired(ids[3]));
  EXPECT_INVARIANTS();
  const LeaseExpiry second = engine_->ExpireLeases(when);
  EXPECT_EQ(second.write, 2u);
  EXPECT_FALSE(second.more);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  for (LeaseId id : ids) EXPECT_EQ(engine_->Release(id).code(), StatusCode::kNotFound);
  EXPECT_INVARIANTS();
}

}  // namespace
}  // namespace kvtier::tiering
