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
