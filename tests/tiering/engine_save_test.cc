// Engine::Save: a commit that names its prefix by its last key (adopting the
// cached chain that ends there) and is granted its lease again with slots for
// the next save, as a worker saving while it decodes calls it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

TEST_F(EngineTest, ASaveAdoptsTheCachedPrefixByItsLastKeyAndRefillsItsLease) {
  Start(Options(16, 8));
  const Chain c = MakeChain(1, 3);
  Put("a", c);
  const Chain more = MakeChain(2, 2, &c);  // c's 3 blocks, then 2 more.

  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[0]), more.keys[3]);
  auto r = engine_->Save(w->id, tenant_, "b", c.keys[2], 3, more.block(3), w->slots,
                         SaveOptions{.adopt = true, .refill = 2});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->committed.stored, 1u);
  EXPECT_EQ(r->adopted, 3u) << "session b took a's three blocks as its own, named by the last key alone";
  EXPECT_EQ(r->last, more.keys[3]);
  ASSERT_NE(r->lease.id, 0u);
  EXPECT_NE(r->lease.id, w->id) << "granted again under a new id";
  EXPECT_EQ(r->lease.slots.size(), 2u);
  EXPECT_FALSE(engine_->Release(w->id).ok()) << "the old id is gone";
  EXPECT_EQ(engine_->stats().write_leases, 1u);
  EXPECT_INVARIANTS();
  ExpectConsistent();

  // The next save continues the session it now holds: nothing to adopt.
  const WriteLease next = r->lease;
  FillBlock(engine_->pool(Tier::kGpu).slot_data(next.slots[0]), more.keys[4]);
  r = engine_->Save(next.id, tenant_, "b", more.keys[3], 4, more.block(4), std::vector<uint32_t>{next.slots[0]},
                    SaveOptions{.adopt = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->adopted, 0u);
  EXPECT_EQ(r->last, more.keys[4]);
  ASSERT_EQ(r->lease.slots, std::vector<uint32_t>{next.slots[1]}) << "refill 0: only what it held";
  ASSERT_TRUE(engine_->Release(r->lease.id).ok());
  EXPECT_EQ(engine_->stats().write_leases, 0u);

  auto lease = Get("b", more);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 5u);
  ExpectLeaseHolds(*lease, more);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(Matched(c), 3u) << "session a keeps its chain";
  EXPECT_INVARIANTS();
  ExpectConsistent();
}

TEST_F(EngineTest, ASaveThatUsesUpItsLeaseWithoutRefillEndsIt) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 2);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (uint32_t i = 0; i < 2; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
  auto r = engine_->Save(w->id, tenant_, "a", BlockKey{}, 0, c.tokens, w->slots, SaveOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->committed.stored, 2u);
  EXPECT_EQ(r->lease.id, 0u);
  EXPECT_EQ(engine_->stats().write_leases, 0u);
  EXPECT_EQ(Matched(c), 2u);
  EXPECT_INVARIANTS();
  ExpectConsistent();
}

// Adopting walks the index back from the parent: only a whole chain of the
// saver's own tenant and model, exactly start_block blocks long, is taken, and
// a refused save changes nothing (its lease stays live, as a commit's).
TEST_F(EngineTest, ASaveAdoptsOnlyAWholeChainOfItsOwnTenantAndChangesNothingWhenRefused) {
  Start(Options(16, 8));
  const Chain c = MakeChain(1, 3);
  Put("a", c);
  const Chain more = MakeChain(2, 1, &c);
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[0]), more.keys[3]);
  const SaveOptions adopt{.adopt = true, .refill = 4};
  const auto save = [&](const Tenant& t, const BlockKey& parent, uint32_t start) {
    return engine_->Save(w->id, t, "b", parent, start, more.block(3), w->slots, adopt).status();
  };
  // The parent is block 2, not block 1 or 3 of the chain.
  EXPECT_EQ(save(tenant_, c.keys[2], 2).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(save(tenant_, c.keys[2], 4).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(save(tenant_, c.keys[2], 1u << 30).code(), StatusCode::kInvalidArgument) << "bounded before any walk";
  // Another tenant's lease cannot name this tenant's chain.
  const Tenant other = Tenant::Make(TestProfile().Fingerprint(), "other tenant");
  auto ow = engine_->Allocate(other, 1);
  ASSERT_TRUE(ow.ok()) << ow.status().ToString();
  auto theirs = engine_->Save(ow->id, other, "b", c.keys[2], 3, more.block(3), ow->slots, adopt);
  EXPECT_EQ(theirs.status().code(), StatusCode::kFailedPrecondition) << theirs.status().ToString();
  ASSERT_TRUE(engine_->Release(ow->id).ok());
  // A chain part of which is gone is not adopted either.
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(Matched(c), 0u);
  const Status gone = save(tenant_, c.keys[2], 3);
  EXPECT_EQ(gone.code(), StatusCode::kFailedPrecondition) << gone.ToString();
  EXPECT_NE(gone.message().find("no longer cached"), std::string::npos) << gone.ToString();

  EXPECT_EQ(engine_->stats().sessions, 0u) << "no refused save made session b";
  EXPECT_EQ(engine_->stats().write_leases, 1u);
  ASSERT_TRUE(engine_->Release(w->id).ok()) << "the lease is still live";
  EXPECT_INVARIANTS();
  ExpectConsistent();
}

TEST_F(EngineQuotaTest, ARefillStaysWithinTheTenantsQuotaAndTakesOnlyFreeSlots) {
  Start(QuotaOptions(3, 32));
  const Chain c = MakeChain(1, 1);
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[0]), c.keys[0]);
  auto r = engine_->Save(w->id, tenant_, "a", BlockKey{}, 0, c.tokens, w->slots, SaveOptions{.refill = 16});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->lease.slots.size(), 2u) << "quota 3, one block held: room for two";
  EXPECT_EQ(engine_->tenant_usage(ns_).blocks[Tier::kGpu], 1u);
  ASSERT_TRUE(engine_->Release(r->lease.id).ok());
  EXPECT_INVARIANTS();
  ExpectConsistent();
}

}  // namespace
}  // namespace kvtier::tiering
