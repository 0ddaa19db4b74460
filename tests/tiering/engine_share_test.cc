// Engine: the fair share of the GPU tier for tenants without a GPU quota
// (EngineOptions::gpu_share_window, tiering/src/gpu_share.h). A tenant that
// renews its read leases (acquires again, then releases the old lease) keeps
// its blocks pinned for ever; while another tenant waits for GPU room it must
// give way down to its share, and nobody waiting, it may use the whole tier.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

class EngineShareTest : public EngineQuotaTest {
 protected:
  static constexpr uint32_t kGpu = 8;  // Two tenants: a share of 4.

  // The test tenant commits `c` (filling the GPU tier) and leases all of it.
  ReadLease FillAndLease(const Chain& c) {
    Put("a", c);
    auto lease = Get("a", c);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    EXPECT_EQ(lease->blocks.size(), c.blocks());
    return std::move(lease).value();
  }
  // A renewal: a new lease of `c`, then the old one released.
  ReadLease Renew(const Chain& c, const ReadLease& old) {
    auto lease = Get("a", c);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    EXPECT_TRUE(engine_->Release(old.id).ok());
    return std::move(lease).value();
  }
  uint32_t InGpu(const ReadLease& lease) const {
    uint32_t n = 0;
    for (const BlockLocation& b : lease.blocks) n += b.tier == Tier::kGpu ? 1 : 0;
    return n;
  }
};

TEST_F(EngineShareTest, ARenewingReaderGivesWayToAWaitingTenant) {
  Start(Options(kGpu, 32));
  const Chain c = MakeChain(1, kGpu);
  ReadLease lease = FillAndLease(c);
  auto first = engine_->Allocate(other_, 1);
  ASSERT_FALSE(first.ok()) << "every GPU slot is pinned by the reader";
  EXPECT_EQ(first.status().code(), StatusCode::kResourceExhausted);

  // Before the fair share, the renewed lease pinned every block again, and
  // the other tenant's Allocate failed for as long as the reader lived.
  std::vector<WriteLease> got;
  int renewals = 0;
  while (got.empty() && renewals < 3) {
    lease = Renew(c, lease);
    ++renewals;
    ExpectLeaseHolds(lease, c);  // What the reader is served is always its bytes.
    EXPECT_GE(InGpu(lease), kGpu / 2) << "the reader keeps its share";
    if (auto w = engine_->Allocate(other_, 1); w.ok()) got.push_back(std::move(*w));
  }
  ASSERT_FALSE(got.empty()) << "the waiting tenant got no GPU slot in " << renewals << " renewals";
  EXPECT_GE(engine_->stats().share_limited, 1u);

  // It may then take up to its share, as the reader renews.
  for (int i = 0; i < 6 && got.size() < kGpu / 2; ++i) {
    if (auto w = engine_->Allocate(other_, 1); w.ok()) got.push_back(std::move(*w));
    lease = Renew(c, lease);
  }
  EXPECT_EQ(got.size(), kGpu / 2);
  EXPECT_EQ(engine_->tenant_usage(other_.ns).leased, kGpu / 2);
  // Past its share it is refused, naming the share, while the reader holds its own.
  auto past = engine_->Allocate(other_, 1);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(past.status().message().find("its fair share is 4 of the gpu tier's 8 slots"), std::string::npos)
      << past.status().message();
  // The reader's blocks past its share are leased in the host tier, not promoted back.
  lease = Renew(c, lease);
  EXPECT_EQ(lease.blocks.size(), kGpu) << "nothing was lost";
  EXPECT_EQ(InGpu(lease), kGpu / 2);
  ExpectLeaseHolds(lease, c);
  EXPECT_TRUE(freed_.empty());
  EXPECT_INVARIANTS();

  ASSERT_TRUE(engine_->Release(lease.id).ok());
  for (const WriteLease& w : got) ASSERT_TRUE(engine_->Release(w.id).ok());
  EXPECT_INVARIANTS();
}

// The same reader without sessions: it evicts them and renews leases taken
// without a session id, so its blocks are in no session chain. Before, marks
// were taken from chains alone: its blocks were never marked, and the other
// tenant's Allocate failed for as long as the reader renewed.
TEST_F(EngineShareTest, ASessionlessRenewingReaderGivesWayToAWaitingTenant) {
  Start(Options(kGpu, 32));
  const Chain c = MakeChain(1, kGpu);
  Put("a", c);
  auto first_lease = Get("", c);
  ASSERT_TRUE(first_lease.ok()) << first_lease.status().ToString();
  ReadLease lease = std::move(first_lease).value();
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(engine_->stats().sessions, 0u);
  EXPECT_EQ(InGpu(lease), kGpu) << "the lease alone holds every GPU block";
  ASSERT_FALSE(engine_->Allocate(other_, 1).ok()) << "every GPU slot is pinned by the reader";

  auto renew = [&](const ReadLease& old) {
    auto next = Get("", c);
    EXPECT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_TRUE(engine_->Release(old.id).ok());
    return std::move(next).value();
  };
  std::vector<WriteLease> got;
  int renewals = 0;
  while (got.empty() && renewals < 3) {
    lease = renew(lease);
    ++renewals;
    ExpectLeaseHolds(lease, c);
    // Marks take the ends of its prefix first: it keeps the beginning.
    EXPECT_GE(lease.blocks.size(), kGpu / 2) << "the reader keeps its share, from block 0";
    if (auto w = engine_->Allocate(other_, 1); w.ok()) got.push_back(std::move(*w));
  }
  ASSERT_FALSE(got.empty()) << "the waiting tenant got no GPU slot in " << renewals << " renewals";
  EXPECT_GE(engine_->stats().share_limited, 1u);
  // Up to its share, as the reader renews; the blocks the reader gave up were
  // held by no session, so they left the cache when its old lease ended.
  for (int i = 0; i < 6 && got.size() < kGpu / 2; ++i) {
    if (auto w = engine_->Allocate(other_, 1); w.ok()) got.push_back(std::move(*w));
    lease = renew(lease);
  }
  EXPECT_EQ(got.size(), kGpu / 2);
  EXPECT_EQ(lease.blocks.size(), kGpu / 2);
  ExpectLeaseHolds(lease, c);
  for (const Freed& f : freed_) EXPECT_FALSE(f.dropped) << "released, never dropped while leased";
  EXPECT_INVARIANTS();

  ASSERT_TRUE(engine_->Release(lease.id).ok());
  for (const WriteLease& w : got) ASSERT_TRUE(engine_->Release(w.id).ok());
  EXPECT_INVARIANTS();
}

// Sessionless leases of two prefixes: the marks take the ends of both before
// the beginning of either, so the reader keeps the start of each.
TEST_F(EngineShareTest, SessionlessMarksTakeTheEndsOfEveryPrefixFirst) {
  Start(Options(kGpu, 32));
  const Chain c1 = MakeChain(1, kGpu / 2);
  const Chain c2 = MakeChain(2, kGpu / 2);
  Put("a", c1);
  Put("b", c2);
  auto l1 = Get("", c1);
  auto l2 = Get("", c2);
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_EQ(engine_->EvictSessions(tenant_.ns), 2u);
  ASSERT_FALSE(engine_->Allocate(other_, 1).ok());
  for (int i = 0; i < 2; ++i) {
    auto n1 = Get("", c1);
    auto n2 = Get("", c2);
    ASSERT_TRUE(n1.ok() && n2.ok());
    ASSERT_TRUE(engine_->Release(l1->id).ok());
    ASSERT_TRUE(engine_->Release(l2->id).ok());
    l1 = std::move(n1);
    l2 = std::move(n2);
  }
  EXPECT_EQ(l1->blocks.size(), kGpu / 4) << "half of each prefix, its beginning";
  EXPECT_EQ(l2->blocks.size(), kGpu / 4);
  ExpectLeaseHolds(*l1, c1);
  ExpectLeaseHolds(*l2, c2);
  auto w = engine_->Allocate(other_, kGpu / 2);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(engine_->Release(l1->id).ok());
  ASSERT_TRUE(engine_->Release(l2->id).ok());
  if (w.ok()) ASSERT_TRUE(engine_->Release(w->id).ok());
  EXPECT_INVARIANTS();
}

// The window may change while serving (Retune; kvtierd's
// limits.gpu_share_window_ms reloads): 0 turns the share off, at once.
TEST_F(EngineShareTest, AWindowRetunedToZeroTurnsTheShareOff) {
  Start(Options(kGpu, 32));
  const Chain c = MakeChain(1, kGpu);
  ReadLease lease = FillAndLease(c);
  EngineOptions off = Options(kGpu, 32);
  off.gpu_share_window = milliseconds(0);
  ASSERT_TRUE(engine_->Retune(off).ok());
  ASSERT_FALSE(engine_->Allocate(other_, 1).ok());
  for (int i = 0; i < 3; ++i) {
    lease = Renew(c, lease);
    EXPECT_EQ(InGpu(lease), kGpu) << "no share: the reader keeps the tier";
    EXPECT_FALSE(engine_->Allocate(other_, 1).ok());
  }
  EXPECT_EQ(engine_->stats().share_limited, 0u);
  EngineOptions bad = Options(kGpu, 32);
  bad.gpu_share_window = milliseconds(-1);
  EXPECT_EQ(engine_->Retune(bad).code(), StatusCode::kInvalidArgument);
  // Back on: the next wait begins a share.
  ASSERT_TRUE(engine_->Retune(Options(kGpu, 32)).ok());
  ASSERT_FALSE(engine_->Allocate(other_, 1).ok());
  lease = Renew(c, lease);
  auto w = engine_->Allocate(other_, 1);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(engine_->Release(lease.id).ok());
  if (w.ok()) ASSERT_TRUE(engine_->Release(w->id).ok());
  EXPECT_INVARIANTS();
}

TEST_F(EngineShareTest, ATenantAloneKeepsTheWholeTier) {
  Start(Options(kGpu, 32));
  const Chain c = MakeChain(1, kGpu);
  ReadLease lease = FillAndLease(c);
  // Its own Allocate finds no room: it waits on no one but itself.
  EXPECT_FALSE(engine_->Allocate(tenant_, 1).ok());
  for (int i = 0; i < 3; ++i) {
    lease = Renew(c, lease);
    EXPECT_EQ(InGpu(lease), kGpu);
  }
  EXPECT_EQ(engine_->stats().share_limited, 0u);
  ASSERT_TRUE(engine_->Release(lease.id).ok());
  EXPECT_INVARIANTS();
}

TEST_F(EngineShareTest, OnceNobodyWaitsTheReaderGetsTheTierBack) {
  EngineOptions o = Options(kGpu, 32);
  o.gpu_share_window = milliseconds(300);
  Start(o);
  const Chain c = MakeChain(1, kGpu);
  ReadLease lease = FillAndLease(c);
  ASSERT_FALSE(engine_->Allocate(other_, 1).ok());
  lease = Renew(c, lease);
  auto w = engine_->Allocate(other_, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(engine_->Release(w->id).ok());
  lease = Renew(c, lease);
  EXPECT_LT(InGpu(lease), kGpu) << "while the other tenant may still be waiting";
  std::this_thread::sleep_for(milliseconds(400));  // Past the window: nobody waits.
  lease = Renew(c, lease);
  EXPECT_EQ(engine_->stats().share_limited, 2u) << "no limit since";
  // Host-tier blocks pinned by the older lease are read in place (they cannot
  // move while read): the next lease taken after it ends promotes them.
  ASSERT_TRUE(engine_->Release(lease.id).ok());
  auto all = Get("a", c);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(InGpu(*all), kGpu) << "work-conserving: promoted back into the free slots";
  ExpectLeaseHolds(*all, c);
  ASSERT_TRUE(engine_->Release(all->id).ok());
  EXPECT_INVARIANTS();
}

TEST_F(EngineShareTest, ATenantWithAGpuQuotaKeepsItsQuota) {
  EngineOptions o = Options(kGpu, 32);
  TenantQuota q;
  q.tenant = tenant_;
  q.blocks[Tier::kGpu] = kGpu;  // The whole tier is its quota.
  o.quotas.push_back(q);
  Start(o);
  const Chain c = MakeChain(1, kGpu);
  ReadLease lease = FillAndLease(c);
  ASSERT_FALSE(engine_->Allocate(other_, 1).ok());
  for (int i = 0; i < 3; ++i) {
    lease = Renew(c, lease);
    EXPECT_EQ(InGpu(lease), kGpu) << "its quota, not a share, limits it";
  }
  EXPECT_FALSE(engine_->Allocate(other_, 1).ok());
  ASSERT_TRUE(engine_->Release(lease.id).ok());
  EXPECT_INVARIANTS();
}

}  // namespace
}  // namespace kvtier::tiering
