// Engine: per-tenant quotas (EngineQuotaTest, engine_test_support.h) — what
// makes room under them, what counts against them — and tenants kept apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

// --- Per-tenant quotas ---------------------------------------------------------

TEST_F(EngineQuotaTest, AtItsGpuQuotaATenantsOwnColdestBlocksAreDemoted) {
  Start(QuotaOptions(4, 0));
  PutOther("big", 50, 6);
  Put("s1", MakeChain(1, 4));
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 4u);
  Put("s2", MakeChain(2, 4));
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 4u) << "moves count where they land";
  EXPECT_EQ(Usage(ns_, Tier::kHost), 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  auto s1 = engine_->GetSession(tenant_, "s1");
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(s1->blocks_in[Tier::kHost], 4u) << "the colder session made way";
  auto s2 = engine_->GetSession(tenant_, "s2");
  EXPECT_EQ(s2->blocks_in[Tier::kGpu], 4u);
  auto big = engine_->GetSession(other_, "big");
  EXPECT_EQ(big->blocks_in[Tier::kGpu], 6u) << "never another tenant's blocks";
  EXPECT_EQ(Usage(other_.ns, Tier::kGpu), 6u);
  EXPECT_TRUE(freed_.empty()) << "demoted, not lost";
  EXPECT_INVARIANTS();
}

TEST_F(EngineQuotaTest, AtItsHostQuotaATenantsOwnHostBlocksAreDropped) {
  Start(QuotaOptions(2, 2));
  PutOther("big", 50, 6);
  const Chain c1 = MakeChain(1, 2), c2 = MakeChain(2, 2), c3 = MakeChain(3, 2);
  Put("s1", c1);
  Put("s2", c2);  // s1 -> host.
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  Put("s3", c3);  // s2 -> host, which is at quota: s1 is dropped.
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 2u);
  EXPECT_EQ(Usage(ns_, Tier::kHost), 2u);
  EXPECT_EQ(FreedCount(true), 2u);
  EXPECT_TRUE(WasFreed(c1.keys[0], true) && WasFreed(c1.keys[1], true));
  EXPECT_EQ(Matched(c2), 2u);
  EXPECT_EQ(Matched(c3), 2u);
  EXPECT_EQ(Usage(other_.ns, Tier::kGpu), 6u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineQuotaTest, WhenNothingCanMakeRoomTheErrorNamesTheQuota) {
  Start(QuotaOptions(2, 0));
  const Chain c1 = MakeChain(1, 2);
  Put("s1", c1);
  auto lease = Get("", c1, false);  // Leased blocks never move.
  ASSERT_TRUE(lease.ok());
  const Chain c2 = MakeChain(2, 2);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_FALSE(w.ok()) << "the slots would take the tenant past its quota";
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("allocate of 2 blocks: tenant 'tenant' holds 2 gpu blocks, its quota is 2"),
            std::string::npos)
      << w.status().message();
  EXPECT_EQ(Matched(c1), 2u) << "nothing was lost";
  EXPECT_EQ(engine_->stats().allocation_failures, 1u);
  // More than the whole quota at once can never fit.
  auto w3 = engine_->Allocate(tenant_, 3);
  ASSERT_FALSE(w3.ok());
  EXPECT_NE(w3.status().message().find("allocate of 3 blocks"), std::string::npos) << w3.status().message();
  // Once the lease ends, s1 can make way.
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  Put("s2", c2);
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 2u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  EXPECT_INVARIANTS();
}

// The slots of uncommitted write leases count against the GPU quota: a tenant
// with a quota of 4 cannot hold more than 4 slots however it splits them, while
// another tenant still allocates; a commit moves the charge to its blocks, a
// release gives it back.
TEST_F(EngineQuotaTest, WriteLeasesCountAgainstTheGpuQuota) {
  Start(QuotaOptions(4, 0));
  auto w1 = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  auto w2 = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 4u);
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 0u) << "gpu_blocks counts blocks; the slots are leased";
  auto w3 = engine_->Allocate(tenant_, 1);
  ASSERT_FALSE(w3.ok());
  EXPECT_EQ(w3.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w3.status().message().find("tenant 'tenant' holds 4 gpu blocks (4 of them slots of uncommitted write "
                                       "leases), its quota is 4 (tenants: gpu_blocks)"),
            std::string::npos)
      << w3.status().message();
  auto theirs = engine_->Allocate(other_, 20);
  ASSERT_TRUE(theirs.ok()) << "another tenant's room is not this one's: " << theirs.status().ToString();
  EXPECT_EQ(engine_->stats().leased_slots, 24u);
  EXPECT_INVARIANTS();

  // Committing 2 of w1's 3 slots: 2 blocks and 1 leased slot; the quota is still full.
  const Chain c = MakeChain(1, 2);
  for (uint32_t i = 0; i < 2; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w1->slots[i]), c.keys[i]);
  auto r = engine_->Commit(w1->id, tenant_, "s", BlockKey{}, 0, c.tokens, std::span(w1->slots).first(2));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 2u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 2u);
  EXPECT_INVARIANTS();
  // At the quota, one slot more comes from s's coldest block, demoted.
  auto w5 = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w5.ok()) << w5.status().ToString();
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 1u);
  EXPECT_EQ(Usage(ns_, Tier::kHost), 1u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // Releasing w1 (its last slot), w2 and w5 leaves room for 3 under the quota.
  ASSERT_TRUE(engine_->Release(w1->id).ok());
  ASSERT_TRUE(engine_->Release(w2->id).ok());
  ASSERT_TRUE(engine_->Release(w5->id).ok());
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  auto w4 = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w4.ok()) << w4.status().ToString();
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 1u) << "room was there: nothing more moved";
  ExpectChainHolds(c, 2);
  ASSERT_TRUE(engine_->Release(w4->id).ok());
  ASSERT_TRUE(engine_->Release(theirs->id).ok());
  EXPECT_EQ(engine_->stats().leased_slots, 0u);
  EXPECT_INVARIANTS();
}

// At its quota, an allocation makes room from the tenant's own cold blocks as
// a commit does: they are demoted (never lost, never another tenant's).
TEST_F(EngineQuotaTest, AllocatePastTheQuotaDemotesTheTenantsOwnColdBlocks) {
  Start(QuotaOptions(4, 0));
  PutOther("big", 50, 6);
  const Chain c1 = MakeChain(1, 4);
  Put("s1", c1);
  auto w = engine_->TryAllocate(tenant_, 3);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->has_value()) << "the tier has free slots; only the quota needed room";
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 1u) << "moves count where they land";
  EXPECT_EQ(Usage(ns_, Tier::kHost), 3u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  auto big = engine_->GetSession(other_, "big");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->blocks_in[Tier::kGpu], 6u) << "never another tenant's blocks";
  EXPECT_TRUE(freed_.empty()) << "demoted, not lost";
  ExpectChainHolds(c1, 4);
  ASSERT_TRUE(engine_->Release((*w)->id).ok());
  EXPECT_INVARIANTS();
}

// When the tenant's cold blocks cannot be demoted (the backend refuses the
// copies), an allocation drops them, but only if that makes enough room: a
// refused allocation loses nothing.
TEST_F(EngineQuotaTest, AllocatePastTheQuotaDropsOwnBlocksOnlyWhenThatMakesEnoughRoom) {
  Start(QuotaOptions(4, 0), /*manual=*/true);
  PutOther("big", 50, 6);
  const Chain c1 = MakeChain(1, 4);
  Put("s1", c1);
  auto pin = Get("", MakeChain(1, 2));  // s1's first two blocks are leased.
  ASSERT_TRUE(pin.ok());
  manual_->refuse_submits = 100;
  auto w = engine_->Allocate(tenant_, 3);
  ASSERT_FALSE(w.ok()) << "only s1's two unleased tail blocks could go";
  EXPECT_NE(w.status().message().find("its other blocks are leased, moving"), std::string::npos)
      << w.status().message();
  EXPECT_TRUE(freed_.empty()) << "a refused allocation drops nothing";
  EXPECT_EQ(Matched(c1), 4u);
  auto w2 = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  EXPECT_EQ(FreedCount(true), 2u);
  EXPECT_TRUE(WasFreed(c1.keys[2], true) && WasFreed(c1.keys[3], true)) << "s1's tail made way";
  EXPECT_EQ(Matched(c1), 2u);
  auto big = engine_->GetSession(other_, "big");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->blocks, 6u) << "never another tenant's blocks";
  EXPECT_EQ(Usage(ns_, Tier::kGpu) + engine_->tenant_usage(ns_).leased, 4u);
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ASSERT_TRUE(engine_->Release(w2->id).ok());
  EXPECT_INVARIANTS();
}

// CheckInvariants recounts every tenant's leased slots from the write leases.
TEST_F(EngineQuotaTest, LeasedSlotsAreRecountedByCheckInvariants) {
  Start(QuotaOptions(8, 0));
  auto w = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_INVARIANTS();
  EngineInspector::SkewLeasedSlots(*engine_, ns_, +1);
  const Status skewed = EngineInspector::CheckInvariants(*engine_);
  ASSERT_FALSE(skewed.ok()) << "a leased count one over is caught";
  EXPECT_NE(skewed.message().find("tenant 'tenant' counts 4 leased slots, its write leases hold 3"), std::string::npos)
      << skewed.message();
  EngineInspector::SkewLeasedSlots(*engine_, ns_, -1);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EngineInspector::SkewLeasedSlots(*engine_, ns_, -1);
  EXPECT_FALSE(EngineInspector::CheckInvariants(*engine_).ok()) << "and one under";
  EngineInspector::SkewLeasedSlots(*engine_, ns_, +1);
  EXPECT_INVARIANTS();
}

TEST_F(EngineQuotaTest, ALeaseIsCommittedUnderItsOwnTenantOnly) {
  Start(QuotaOptions(8, 0));
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok());
  const Chain c = MakeChain(1, 2);
  auto r = engine_->Commit(w->id, other_, "s", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 2u) << "the lease and its charge stay";
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EXPECT_INVARIANTS();
}

// Sessions are named by tenant and id: two tenants may both have a "chat".
TEST_F(EngineQuotaTest, TwoTenantsWithTheSameSessionIdHaveTwoSessions) {
  Start(Options(32, 32));
  Put("chat", MakeChain(1, 3));
  PutOther("chat", 7, 2);
  auto mine = engine_->GetSession(tenant_, "chat");
  auto theirs = engine_->GetSession(other_, "chat");
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_EQ(mine->blocks, 3u);
  EXPECT_EQ(theirs->blocks, 2u);
  EXPECT_EQ(theirs->tenant, "other tenant");
  const std::vector<SessionInfo> all = engine_->ListSessions();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].tenant, "other tenant") << "ordered by tenant, then id";
  EXPECT_EQ(all[1].tenant, "tenant");
  ASSERT_TRUE(engine_->Evict(other_, "chat").ok());
  EXPECT_EQ(engine_->GetSession(other_, "chat").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetSession(tenant_, "chat").ok()) << "the other tenant's eviction left this one";
  EXPECT_INVARIANTS();
}

// Quotas and usage belong to the whole namespace: two tenants whose 32-bit
// index tags collide still have a quota each.
TEST_F(EngineQuotaTest, TenantsWhoseIndexTagsCollideKeepTheirOwnQuotas) {
  std::unordered_map<uint32_t, std::string> seen;
  std::string a, b;
  for (uint32_t i = 0; a.empty(); ++i) {
    const std::string name = "t" + std::to_string(i);
    auto [it, added] = seen.try_emplace(NamespaceTag(Namespace::Make(TestProfile().Fingerprint(), name)), name);
    if (!added) std::tie(a, b) = std::pair(it->second, name);
  }
  const Tenant limited = Tenant::Make(TestProfile().Fingerprint(), a);
  const Tenant free = Tenant::Make(TestProfile().Fingerprint(), b);
  ASSERT_EQ(NamespaceTag(limited.ns), NamespaceTag(free.ns));
  EngineOptions o = Options(32, 32);
  TenantQuota q;
  q.tenant = limited;
  q.blocks[Tier::kGpu] = 2;
  o.quotas.push_back(q);
  Start(o);
  const Chain c = MakeChain(3, 6);
  std::vector<BlockKey> keys(6);
  ComputeKeys(free.ns, BlockKey{}, c.tokens, kBt, keys);
  auto w = engine_->Allocate(free, 6);
  ASSERT_TRUE(w.ok());
  auto r = engine_->Commit(w->id, free, "s", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_TRUE(r.ok()) << "the limited tenant's quota is not this one's: " << r.status().ToString();
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EXPECT_EQ(engine_->tenant_usage(free.ns).blocks[Tier::kGpu], 6u);
  EXPECT_EQ(engine_->tenant_usage(limited.ns).blocks[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->Match(free.ns, keys, c.tokens), 6u);
  EXPECT_EQ(engine_->Match(limited.ns, keys, c.tokens), 0u) << "another namespace's blocks never match";
  EXPECT_INVARIANTS();
}

TEST_F(EngineQuotaTest, PromotionStaysWithinTheGpuQuota) {
  Start(QuotaOptions(2, 0));
  const Chain c1 = MakeChain(1, 2), c2 = MakeChain(2, 2);
  Put("s1", c1);
  Put("s2", c2);  // s1 -> host.
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  auto lease = Get("s1", c1);  // s2 makes way for s1's promotion.
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 2u);
  ExpectLeaseHolds(*lease, c1);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Usage(ns_, Tier::kGpu), 2u);
  EXPECT_EQ(Usage(ns_, Tier::kHost), 2u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  // With s2's blocks leased in the GPU tier, s1 is read from the host tier instead.
  ASSERT_TRUE(engine_->Demote(tenant_, "s1").ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  auto l2 = Get("s2", c2);
  ASSERT_TRUE(l2.ok());
  auto l1 = Get("s1", c1);
  ASSERT_TRUE(l1.ok());
  EXPECT_EQ(l1->promoted, 0u);
  for (const auto& b : l1->blocks) EXPECT_EQ(b.tier, Tier::kHost);
  ExpectLeaseHolds(*l1, c1);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(l1->id).ok());
  ASSERT_TRUE(engine_->Release(l2->id).ok());
}

// Random commits, acquires, releases, demotes and evictions by a tenant under
// quota beside one without: the GPU quota holds after every successful commit
// and the host quota always, the
// counts match a recount (CheckInvariants), and the other tenant never loses a
// block to the first one's quota.
TEST_F(EngineQuotaTest, RandomChurnKeepsQuotasAndCounts) {
  Start(QuotaOptions(6, 10));
  std::mt19937 rng(7);
  PutOther("other", 900, 8);
  std::vector<ReadLease> leases;
  std::vector<LeaseId> writes;
  for (int step = 0; step < 400; ++step) {
    const std::string session = "s" + std::to_string(rng() % 6);
    switch (rng() % 5) {
      case 0:
      case 1: {
        // Sometimes a slot more than is committed, and sometimes the lease is
        // kept open for later steps: leased slots count against the quota.
        const Chain c = MakeChain(static_cast<uint32_t>(step + 1), 1 + rng() % 3);
        auto w = engine_->Allocate(tenant_, c.blocks() + rng() % 2);
        if (!w.ok()) {
          EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted) << w.status().ToString();
          EXPECT_NE(w.status().message().find("quota"), std::string::npos) << w.status().ToString();
          break;
        }
        EXPECT_LE(Usage(ns_, Tier::kGpu) + engine_->tenant_usage(ns_).leased, 6u) << "step " << step;
        auto r =
            engine_->Commit(w->id, tenant_, session, BlockKey{}, 0, c.tokens, std::span(w->slots).first(c.blocks()));
        if (rng() % 3 == 0) {
          writes.push_back(w->id);
        } else {
          ASSERT_TRUE(engine_->Release(w->id).ok());
        }
        if (r.ok()) {
          EXPECT_LE(Usage(ns_, Tier::kGpu) + engine_->tenant_usage(ns_).leased, 6u) << "step " << step;
        } else {
          EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
        }
        break;
      }
      case 2: {
        auto info = engine_->GetSession(tenant_, session);
        if (!info.ok()) break;
        std::vector<TokenId> tokens;
        for (const BlockKey& k : info->chain) {
          const auto& known = known_[k].tokens;
          tokens.insert(tokens.end(), known.begin(), known.end());
        }
        // A demotion cancelled because a reader leased its block meanwhile leaves
        // the tenant above its quota until its next commit (settled here first);
        // promotions never add to it.
        ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
        const uint32_t before = std::max(Usage(ns_, Tier::kGpu), 6u);
        auto l = engine_->Acquire(tenant_, session, info->chain, tokens, rng() % 2 == 0);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        if (l->id != 0) leases.push_back(*l);
        EXPECT_LE(Usage(ns_, Tier::kGpu), before) << "promotions stay within the quota, step " << step;
        break;
      }
      case 3:
        if (!leases.empty()) {
          ASSERT_TRUE(engine_->Release(leases.front().id).ok());
          leases.erase(leases.begin());
        }
        if (!writes.empty()) {
          ASSERT_TRUE(engine_->Release(writes.front()).ok());
          writes.erase(writes.begin());
        }
        break;
      default:
        if (rng() % 2 == 0) (void)engine_->Demote(tenant_, session); else (void)engine_->Evict(tenant_, session);
        break;
    }
    engine_->Poll();
    EXPECT_LE(Usage(ns_, Tier::kHost), 10u) << "step " << step;
    const Status st = EngineInspector::CheckInvariants(*engine_);
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.ToString();
  }
  auto other = engine_->GetSession(other_, "other");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->blocks, 8u);
  EXPECT_EQ(Usage(other_.ns, Tier::kGpu) + Usage(other_.ns, Tier::kHost), 8u);
  for (const ReadLease& l : leases) ASSERT_TRUE(engine_->Release(l.id).ok());
  for (LeaseId w : writes) ASSERT_TRUE(engine_->Release(w).ok());
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_INVARIANTS();
}

}  // namespace
}  // namespace kvtier::tiering
