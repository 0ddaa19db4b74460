// TenantLedger and TenantAccount: what a tenant holds per tier while blocks are
// published, moved and freed, the room its quota leaves, and the session limit.
#include "tenant_ledger.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

Tenant Named(const std::string& name) { return Tenant::Make(TestProfile().Fingerprint(), name); }

TEST(TenantAccountTest, WithoutAQuotaTheRoomIsUnbounded) {
  TenantAccount a;
  for (Tier t : kTiers) {
    EXPECT_FALSE(a.has_quota(t));
    EXPECT_EQ(a.Blocks(t), 0u);
    EXPECT_EQ(a.Held(t), 0u);
    EXPECT_EQ(a.Room(t), kNoQuota);
  }
  for (int i = 0; i < 5; ++i) a.Published(Tier::kGpu);
  EXPECT_EQ(a.Blocks(Tier::kGpu), 5u);
  EXPECT_EQ(a.Room(Tier::kGpu), kNoQuota) << "a quota of 0 is no quota";
}

// Write-lease slots count against the GPU quota (a commit turns them into
// blocks), never against the host one.
TEST(TenantAccountTest, LeasedSlotsCountAgainstTheGpuQuotaOnly) {
  TenantAccount a;
  a.quota[Tier::kGpu] = 5;
  a.quota[Tier::kHost] = 5;
  for (int i = 0; i < 3; ++i) a.Published(Tier::kGpu);
  EXPECT_EQ(a.Room(Tier::kGpu), 2u);
  a.Leased(2);
  EXPECT_EQ(a.Blocks(Tier::kGpu), 3u);
  EXPECT_EQ(a.Held(Tier::kGpu), 5u);
  EXPECT_EQ(a.Room(Tier::kGpu), 0u);
  EXPECT_EQ(a.Held(Tier::kHost), 0u);
  EXPECT_EQ(a.Room(Tier::kHost), 5u);
  a.Unleased(2);
  EXPECT_EQ(a.leased, 0u);
  EXPECT_EQ(a.Room(Tier::kGpu), 2u);
}

// Above its quota (lowered after the blocks came) a tenant has no room, not a
// huge one: the subtraction must not wrap.
TEST(TenantAccountTest, RoomIsZeroAboveTheQuota) {
  TenantAccount a;
  for (int i = 0; i < 4; ++i) a.Published(Tier::kHost);
  a.quota[Tier::kHost] = 2;
  EXPECT_EQ(a.Held(Tier::kHost), 4u);
  EXPECT_EQ(a.Room(Tier::kHost), 0u);
}

// A move in flight counts in its source (`blocks`) and, for room checks, where
// it lands (Blocks): a demotion being copied already takes host room.
TEST(TenantAccountTest, AMoveCountsWhereItLandsUntilItEnds) {
  TenantAccount a;
  a.quota[Tier::kHost] = 2;
  for (int i = 0; i < 3; ++i) a.Published(Tier::kGpu);
  a.MoveStarted(Tier::kGpu);
  a.MoveStarted(Tier::kGpu);
  EXPECT_EQ(a.blocks[Tier::kGpu], 3u) << "still in the source tier";
  EXPECT_EQ(a.moving_to[Tier::kHost], 2u);
  EXPECT_EQ(a.Blocks(Tier::kGpu), 1u);
  EXPECT_EQ(a.Blocks(Tier::kHost), 2u);
  EXPECT_EQ(a.Room(Tier::kHost), 0u);

  a.MoveEnded(Tier::kGpu, /*landed=*/true);
  EXPECT_EQ(a.blocks[Tier::kGpu], 2u);
  EXPECT_EQ(a.blocks[Tier::kHost], 1u);
  EXPECT_EQ(a.moving_to[Tier::kHost], 1u);
  EXPECT_EQ(a.Blocks(Tier::kGpu), 1u) << "Blocks() counted it where it landed already";
  EXPECT_EQ(a.Blocks(Tier::kHost), 2u);

  a.MoveEnded(Tier::kGpu, /*landed=*/false);  // Cancelled: the block stays in the GPU tier.
  EXPECT_EQ(a.blocks[Tier::kGpu], 2u);
  EXPECT_EQ(a.blocks[Tier::kHost], 1u);
  EXPECT_EQ(a.moving_to[Tier::kHost], 0u);
  EXPECT_EQ(a.Blocks(Tier::kGpu), 2u);
  EXPECT_EQ(a.Room(Tier::kHost), 1u);
}

// A block freed while moving leaves both its source count and its move.
TEST(TenantAccountTest, UnpublishingAMovingBlockEndsItsMove) {
  TenantAccount a;
  a.Published(Tier::kHost);
  a.Published(Tier::kHost);
  a.MoveStarted(Tier::kHost);  // A promotion.
  EXPECT_EQ(a.Blocks(Tier::kGpu), 1u);
  a.Unpublished(Tier::kHost, /*moving=*/true);
  EXPECT_EQ(a.blocks[Tier::kHost], 1u);
  EXPECT_EQ(a.moving_to[Tier::kGpu], 0u);
  EXPECT_EQ(a.Blocks(Tier::kGpu), 0u);
  EXPECT_EQ(a.Blocks(Tier::kHost), 1u);
  a.Unpublished(Tier::kHost, /*moving=*/false);
  EXPECT_EQ(a.Blocks(Tier::kHost), 0u);
}

TEST(TenantLedgerTest, AnAccountIsMadeOnFirstUseAndKeptAtOneAddress) {
  TenantLedger ledger;
  const Tenant t = Named("a");
  EXPECT_EQ(ledger.Find(t.ns), nullptr);
  TenantAccount& a = ledger.Get(t);
  EXPECT_EQ(a.tenant.ns, t.ns);
  EXPECT_EQ(a.tenant.name, "a");
  EXPECT_EQ(ledger.Find(t.ns), &a);
  EXPECT_EQ(&ledger.Get(t), &a) << "one account per tenant";
  EXPECT_EQ(&ledger.Get(t.ns), &a);
  a.Published(Tier::kGpu);
  // Records and sessions point at accounts: however many tenants come after,
  // the account stays where it is, with what it counted.
  for (int i = 0; i < 1000; ++i) ledger.Get(Named("t" + std::to_string(i)));
  EXPECT_EQ(ledger.Find(t.ns), &a);
  EXPECT_EQ(a.blocks[Tier::kGpu], 1u);
  size_t accounts = 0;
  std::set<std::string> names;
  ledger.ForEach([&](const TenantAccount& acc) {
    ++accounts;
    names.insert(acc.tenant.name);
  });
  EXPECT_EQ(accounts, 1001u);
  EXPECT_EQ(names.size(), 1001u) << "each account visited once";
}

// A tenant first seen by its namespace alone (a block adopted at a warm
// restart) takes its name when it is first named; a name once set stays.
TEST(TenantLedgerTest, ATenantSeenByItsNamespaceTakesItsNameLater) {
  TenantLedger ledger;
  const Tenant t = Named("late");
  TenantAccount& a = ledger.Get(t.ns);
  EXPECT_EQ(a.tenant.ns, t.ns);
  EXPECT_TRUE(a.tenant.name.empty());
  EXPECT_EQ(&ledger.Get(t), &a);
  EXPECT_EQ(a.tenant.name, "late");
  Tenant renamed = t;
  renamed.name = "other name";
  EXPECT_EQ(&ledger.Get(renamed), &a);
  EXPECT_EQ(a.tenant.name, "late");
}

TEST(TenantLedgerTest, SetQuotasGivesEachTenantItsQuota) {
  TenantLedger ledger;
  TenantQuota qa{Named("a"), {}};
  qa.blocks[Tier::kGpu] = 10;
  TenantQuota qb{Named("b"), {}};
  qb.blocks[Tier::kHost] = 20;
  const std::vector<TenantQuota> quotas = {qa, qb};
  ASSERT_TRUE(ledger.SetQuotas(quotas).ok());
  const TenantAccount* a = ledger.Find(qa.tenant.ns);
  const TenantAccount* b = ledger.Find(qb.tenant.ns);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->tenant.name, "a");
  EXPECT_EQ(a->quota[Tier::kGpu], 10u);
  EXPECT_FALSE(a->has_quota(Tier::kHost));
  EXPECT_EQ(b->quota[Tier::kHost], 20u);
  EXPECT_EQ(b->Room(Tier::kHost), 20u);
  EXPECT_EQ(b->Room(Tier::kGpu), kNoQuota);
}

// Two quotas for one tenant are refused whole: no account is made or changed.
TEST(TenantLedgerTest, TwoQuotasForOneTenantAreRefused) {
  TenantLedger ledger;
  TenantQuota first{Named("a"), {}};
  first.blocks[Tier::kGpu] = 1;
  TenantQuota other{Named("b"), {}};
  other.blocks[Tier::kGpu] = 2;
  TenantQuota again{Named("a"), {}};
  again.blocks[Tier::kGpu] = 3;
  const std::vector<TenantQuota> quotas = {first, other, again};
  const Status st = ledger.SetQuotas(quotas);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("two quotas for tenant 'a'"), std::string::npos) << st.message();
  EXPECT_EQ(ledger.Find(first.tenant.ns), nullptr);
  EXPECT_EQ(ledger.Find(other.tenant.ns), nullptr);
}

TEST(TenantLedgerTest, ANewSessionPastTheLimitIsRefused) {
  TenantLedger ledger;
  TenantAccount& a = ledger.Get(Named("a"));
  EXPECT_TRUE(ledger.CheckNewSession(a, "s", 0).ok());
  a.sessions = 2;
  EXPECT_TRUE(ledger.CheckNewSession(a, "s", 0).ok()) << "0: no limit";
  EXPECT_TRUE(ledger.CheckNewSession(a, "s", 3).ok());
  const Status st = ledger.CheckNewSession(a, "chat-9", 2);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("session 'chat-9'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("holds 2 sessions"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("limits.max_sessions_per_tenant"), std::string::npos) << st.message();
  a.sessions = 3;
  EXPECT_EQ(ledger.CheckNewSession(a, "s", 2).code(), StatusCode::kResourceExhausted) << "above the limit too";
}

}  // namespace
}  // namespace kvtier::tiering
