// GpuShare: who waits for GPU room, the fair share while someone does (the GPU
// slots over the active tenants), who is over it, and the marking epochs.
#include "gpu_share.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "engine_test_support.h"
#include "tenant_ledger.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using Clock = GpuShare::Clock;

constexpr milliseconds kWindow{100};

Clock::time_point T0() { return Clock::time_point{} + std::chrono::hours(1); }

class GpuShareTest : public ::testing::Test {
 protected:
  // Tenant `name`, holding `blocks` GPU blocks and `leased` write-lease slots.
  TenantAccount& Account(const std::string& name, uint32_t blocks = 0, uint32_t leased = 0) {
    TenantAccount& a = ledger_.Get(Tenant::Make(TestProfile().Fingerprint(), name));
    a.blocks[Tier::kGpu] = blocks;
    a.leased = leased;
    return a;
  }

  TenantLedger ledger_;
  GpuShare share_{10, kWindow};
};

TEST_F(GpuShareTest, NothingIsContendedBeforeAnyoneWaits) {
  TenantAccount& a = Account("a", 10);
  EXPECT_FALSE(share_.contended(T0()));
  EXPECT_FALSE(share_.Applies(a, T0()));
  EXPECT_FALSE(share_.Over(a, T0()));
  EXPECT_EQ(share_.Room(a, T0()), kNoQuota);
  EXPECT_EQ(share_.epoch(), 0u) << "0 is never an epoch";
  EXPECT_TRUE(share_.marked().empty());
}

// A tenant below its share that finds no slot waits: the share is the GPU
// slots over the active tenants, and whoever holds more is over it.
TEST_F(GpuShareTest, AWaiterBelowItsShareMakesTheOthersGiveWay) {
  TenantAccount& a = Account("a", 8);
  TenantAccount& b = Account("b", 1);
  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0()));
  EXPECT_TRUE(b.waited);
  EXPECT_EQ(b.waited_at, T0());
  EXPECT_FALSE(a.waited);
  EXPECT_TRUE(share_.contended(T0()));
  EXPECT_EQ(share_.active(), 2u);
  EXPECT_EQ(share_.share(), 5u);
  EXPECT_EQ(share_.epoch(), 1u);
  EXPECT_TRUE(share_.Over(a, T0()));
  EXPECT_EQ(share_.Room(a, T0()), 0u) << "8 held, not a wrapped 5 - 8";
  EXPECT_FALSE(share_.Over(b, T0()));
  EXPECT_EQ(share_.Room(b, T0()), 4u);
}

// Write-lease slots count as held: a tenant whose leases fill its share is
// not below it.
TEST_F(GpuShareTest, ATenantAtItsShareIsNoWaiter) {
  Account("a", 5);
  TenantAccount& b = Account("b", 3, /*leased=*/2);
  EXPECT_FALSE(share_.NoteWaiting(b, ledger_, T0()));
  EXPECT_FALSE(b.waited);
  EXPECT_FALSE(share_.contended(T0()));
  EXPECT_EQ(share_.epoch(), 0u);
  EXPECT_EQ(share_.Room(b, T0()), kNoQuota);
}

// Alone, a tenant's share is the whole tier: holding it all, it waits on nobody.
TEST_F(GpuShareTest, ATenantAloneNeverWaitsOnAnyone) {
  TenantAccount& a = Account("a", 10);
  Account("idle");  // Holds nothing and never waited: not active.
  EXPECT_FALSE(share_.NoteWaiting(a, ledger_, T0()));
  EXPECT_FALSE(share_.contended(T0()));
}

// Active: holding GPU blocks or write-lease slots, or waiting within the
// window; the waiter itself always counts.
TEST_F(GpuShareTest, TheShareCountsTheActiveTenants) {
  GpuShare share(12, kWindow);
  Account("blocks", 6);
  Account("leases", 0, /*leased=*/2);
  Account("idle");
  TenantAccount& recent = Account("recent waiter");
  recent.waited = true;
  recent.waited_at = T0() - kWindow + nanoseconds(1);
  TenantAccount& old = Account("old waiter");
  old.waited = true;
  old.waited_at = T0() - kWindow;
  TenantAccount& w = Account("waiter");
  ASSERT_TRUE(share.NoteWaiting(w, ledger_, T0()));
  EXPECT_EQ(share.active(), 4u) << "blocks, leases, recent waiter, waiter";
  EXPECT_EQ(share.share(), 3u);
}

// More active tenants than slots: each may still hold one, never zero.
TEST_F(GpuShareTest, TheShareIsNeverZero) {
  GpuShare share(2, kWindow);
  TenantAccount& a = Account("a", 1);
  Account("b", 1);
  TenantAccount& c = Account("c");
  ASSERT_TRUE(share.NoteWaiting(c, ledger_, T0()));
  EXPECT_EQ(share.active(), 3u);
  EXPECT_EQ(share.share(), 1u);
  EXPECT_FALSE(share.Over(a, T0())) << "at its share, not over it";
  EXPECT_EQ(share.Room(a, T0()), 0u);
  EXPECT_EQ(share.Room(c, T0()), 1u);
}

// Shares apply for `window` after the last wait, not a nanosecond longer.
TEST_F(GpuShareTest, SharesApplyForTheWindowAfterTheLastWait) {
  TenantAccount& a = Account("a", 8);
  TenantAccount& b = Account("b");
  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0()));
  EXPECT_TRUE(share_.Over(a, T0() + kWindow - nanoseconds(1)));
  EXPECT_FALSE(share_.contended(T0() + kWindow));
  EXPECT_FALSE(share_.Over(a, T0() + kWindow));
  EXPECT_EQ(share_.Room(a, T0() + kWindow), kNoQuota);
  // Another wait within the window extends it from then.
  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0() + milliseconds(60)));
  EXPECT_TRUE(share_.contended(T0() + kWindow));
  EXPECT_FALSE(share_.contended(T0() + milliseconds(60) + kWindow));
}

// Tenants with a GPU quota keep their quota alone: the share never applies to them.
TEST_F(GpuShareTest, ATenantWithAGpuQuotaIsNotHeldToTheShare) {
  TenantAccount& a = Account("a", 8);
  a.quota[Tier::kGpu] = 9;
  TenantAccount& host_quota = Account("host quota only", 1);
  host_quota.quota[Tier::kHost] = 4;
  TenantAccount& b = Account("b");
  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0()));
  EXPECT_FALSE(share_.Applies(a, T0()));
  EXPECT_FALSE(share_.Over(a, T0()));
  EXPECT_EQ(share_.Room(a, T0()), kNoQuota);
  EXPECT_TRUE(share_.Applies(host_quota, T0())) << "a host quota is no GPU quota";
}

// The marks of one wait stay for the whole wait; a wait that begins after the
// window ended begins a new epoch, without the old marks.
TEST_F(GpuShareTest, ANewWaitBeginsANewEpochAndForgetsTheMarks) {
  Account("a", 8);
  TenantAccount& b = Account("b");
  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0()));
  ASSERT_EQ(share_.epoch(), 1u);
  share_.marked().push_back(3);
  share_.marked().push_back(4);

  TenantAccount& c = Account("c");
  ASSERT_TRUE(share_.NoteWaiting(c, ledger_, T0() + milliseconds(50)));
  EXPECT_EQ(share_.epoch(), 1u) << "during the same wait";
  EXPECT_EQ(share_.marked().size(), 2u);
  EXPECT_EQ(share_.active(), 3u) << "a, b (waited within the window) and c";
  EXPECT_EQ(share_.share(), 3u) << "recomputed at each wait";

  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0() + milliseconds(50) + kWindow));
  EXPECT_EQ(share_.epoch(), 2u);
  EXPECT_TRUE(share_.marked().empty());
  EXPECT_EQ(share_.active(), 2u) << "c's wait is past the window";
}

// A refused wait changes nothing: no new epoch, no new share.
TEST_F(GpuShareTest, ARefusedWaitChangesNothing) {
  Account("a", 8);
  TenantAccount& b = Account("b");
  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0()));
  share_.marked().push_back(1);
  TenantAccount& full = Account("full", 5);
  EXPECT_FALSE(share_.NoteWaiting(full, ledger_, T0() + milliseconds(10))) << "share 3 of 3 active; it holds 5";
  EXPECT_FALSE(full.waited);
  EXPECT_EQ(share_.share(), 5u);
  EXPECT_EQ(share_.active(), 2u);
  EXPECT_EQ(share_.epoch(), 1u);
  EXPECT_EQ(share_.marked().size(), 1u);
  EXPECT_FALSE(share_.contended(T0() + kWindow)) << "the refused wait did not extend the window";
}

// A window of zero turns the share off: nobody waits, and a window set to
// zero during a wait ends it.
TEST_F(GpuShareTest, AZeroWindowTurnsTheShareOff) {
  TenantAccount& a = Account("a", 8);
  TenantAccount& b = Account("b");
  GpuShare off(10, milliseconds(0));
  EXPECT_FALSE(off.NoteWaiting(b, ledger_, T0()));
  EXPECT_FALSE(b.waited);
  EXPECT_EQ(off.epoch(), 0u);

  ASSERT_TRUE(share_.NoteWaiting(b, ledger_, T0()));
  ASSERT_TRUE(share_.Over(a, T0()));
  share_.set_window(milliseconds(0));
  EXPECT_FALSE(share_.contended(T0()));
  EXPECT_FALSE(share_.Over(a, T0()));
  EXPECT_EQ(share_.Room(b, T0()), kNoQuota);
}

}  // namespace
}  // namespace kvtier::tiering
