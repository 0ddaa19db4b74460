// Engine: the write path (Allocate, Commit), the read path (Match, Acquire),
// the shared index clients probe, and the checks on requests and options.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

// --- Write and read paths --------------------------------------------------------

TEST_F(EngineTest, AllocateCommitAcquireRoundTrip) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  auto w = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->slots.size(), 3u);
  EXPECT_NE(w->id, 0u);
  std::vector<uint32_t> sorted = w->slots;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "distinct slots";
  for (uint32_t s : w->slots) EXPECT_LT(s, 8u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u);
  EXPECT_EQ(engine_->stats().write_leases, 1u);
  EXPECT_INVARIANTS();

  for (uint32_t i = 0; i < 3; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
  auto r = engine_->Commit(w->id, tenant_, "chat", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stored, 3u);
  EXPECT_EQ(r->duplicates, 0u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 3u) << "committed slots belong to the blocks now";
  EXPECT_EQ(st.write_leases, 0u);
  EXPECT_EQ(st.blocks, 3u);
  EXPECT_EQ(st.sessions, 1u);
  EXPECT_EQ(st.committed_blocks, 3u);
  EXPECT_EQ(Matched(c), 3u);
  ExpectConsistent();

  auto lease = Get("chat", c);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_NE(lease->id, 0u);
  EXPECT_EQ(lease->matched, 3u);
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  ASSERT_EQ(lease->blocks.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lease->blocks[i].tier, Tier::kGpu);
    EXPECT_EQ(lease->blocks[i].slot, w->slots[i]) << "the block lives where it was written";
  }
  ExpectLeaseHolds(*lease, c);
  st = engine_->stats();
  EXPECT_EQ(st.read_leases, 1u);
  EXPECT_EQ(st.hit_blocks, 3u);
  EXPECT_EQ(st.miss_blocks, 0u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().read_leases, 0u);
  EXPECT_EQ(engine_->stats().blocks, 3u) << "the session still holds them";
  EXPECT_TRUE(freed_.empty());
  ExpectConsistent();
}

TEST_F(EngineTest, MatchFindsTheLongestVerifiedPrefix) {
  Start(Options(16, 8));
  const Chain c = MakeChain(1, 3);
  Put("a", c);
  const Chain longer = MakeChain(2, 2, &c);  // c's 3 blocks + 2 more.
  EXPECT_EQ(Matched(longer), 3u);
  EXPECT_EQ(Matched(c), 3u);

  Chain changed = c;  // Right keys, but a token of block 1 differs: verified only up to block 0.
  changed.tokens[kBt + 1] += 1;
  EXPECT_EQ(engine_->Match(ns_, changed.keys, changed.tokens), 1u);
  const Namespace other = Namespace::Make(TestProfile().Fingerprint(), "other tenant");
  EXPECT_EQ(engine_->Match(other, c.keys, c.tokens), 0u) << "tenants never see each other's blocks";
  std::vector<BlockKey> other_keys(3);
  ComputeKeys(other, BlockKey{}, c.tokens, kBt, other_keys);
  EXPECT_EQ(engine_->Match(other, other_keys, c.tokens), 0u);
  // Fewer tokens than keys: only whole blocks with tokens count.
  EXPECT_EQ(engine_->Match(ns_, c.keys, c.tokens_from(0).first(2 * kBt + 1)), 2u);
  // Match has no side effects.
  EXPECT_EQ(engine_->stats().hit_blocks, 0u);
  EXPECT_EQ(engine_->stats().miss_blocks, 0u);
  EXPECT_EQ(engine_->stats().read_leases, 0u);

  auto lease = Get("b", longer);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 3u);
  EXPECT_EQ(lease->blocks.size(), 3u);
  ExpectLeaseHolds(*lease, longer);
  EXPECT_EQ(engine_->stats().hit_blocks, 3u);
  EXPECT_EQ(engine_->stats().miss_blocks, 2u);
  auto b = engine_->GetSession(tenant_, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->blocks, 3u) << "the session's chain becomes the matched prefix";
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, ARequestsCallsSharingAPrefixMatchWalkThePrefixOnce) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  PutInHostTier("a", c);  // Promoting them needs GPU room: AcquireNeedsRoom matches too.
  Put("filler", MakeChain(9, 6));  // 6 of the 8 GPU slots: fewer free than keys.
  const uint64_t before = engine_->stats().prefix_walks;
  PrefixMatch match;
  EXPECT_EQ(engine_->Match(ns_, c.keys, c.tokens, {}, &match), 3u);
  EXPECT_EQ(match.matched, 3u);
  (void)engine_->AcquireNeedsRoom(ns_, c.keys, c.tokens, {}, &match);
  engine_->Poll();
  auto lease = engine_->Acquire(tenant_, "b", c.keys, c.tokens, /*promote=*/false, nullptr, &match);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 3u);
  ExpectLeaseHolds(*lease, c);
  EXPECT_EQ(engine_->stats().prefix_walks - before, 1u) << "one walk for Match, AcquireNeedsRoom and Acquire";
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  // Without it, each call walks the prefix again.
  const uint64_t walks = engine_->stats().prefix_walks;
  (void)engine_->Match(ns_, c.keys, c.tokens);
  lease = Get("b", c, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(engine_->stats().prefix_walks - walks, 2u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, APrefixMatchIsMatchedAgainOnceABlockChanged) {
  Start(Options(16, 8));
  const Chain c = MakeChain(1, 3);
  const Chain longer = MakeChain(2, 2, &c);
  Put("a", c);
  PrefixMatch match;
  EXPECT_EQ(engine_->Match(ns_, longer.keys, longer.tokens, {}, &match), 3u);
  // Blocks committed since: the Acquire finds them, not the 3 matched before.
  Put("a", longer, 3);
  auto lease = engine_->Acquire(tenant_, "b", longer.keys, longer.tokens, true, nullptr, &match);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 5u);
  ExpectLeaseHolds(*lease, longer);
  ASSERT_TRUE(engine_->Release(lease->id).ok());

  // Blocks freed since: never leased from the old match (their records may hold other blocks by now).
  PrefixMatch stale;
  EXPECT_EQ(engine_->Match(ns_, longer.keys, longer.tokens, {}, &stale), 5u);
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  ASSERT_EQ(Matched(longer), 0u);
  Put("other", MakeChain(7, 5));  // Reuses the freed records.
  lease = engine_->Acquire(tenant_, "c", longer.keys, longer.tokens, true, nullptr, &stale);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 0u);
  EXPECT_EQ(lease->id, 0u);
  EXPECT_EQ(stale.matched, 0u);
  ExpectConsistent();
}

TEST_F(EngineTest, AcquireOfNothingLeasesNothing) {
  Start(Options(8, 8));
  const Chain c = MakeChain(9, 2);
  auto lease = Get("", c);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->id, 0u);
  EXPECT_EQ(lease->matched, 0u);
  EXPECT_TRUE(lease->blocks.empty());
  EXPECT_TRUE(lease->fence.IsNull());
  EXPECT_EQ(engine_->stats().sessions, 0u) << "no session name, no session";
  auto named = Get("new", c);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->id, 0u);
  EXPECT_EQ(engine_->GetSession(tenant_, "new").status().code(), StatusCode::kNotFound)
      << "a session comes into being with its first block, not with an acquire that matches nothing";
  EXPECT_EQ(engine_->stats().sessions, 0u);
  EXPECT_EQ(engine_->stats().miss_blocks, 4u);
  // An existing session's chain still becomes what matched: nothing.
  Put("s", MakeChain(3, 2));
  auto miss = Get("s", c);
  ASSERT_TRUE(miss.ok());
  auto info = engine_->GetSession(tenant_, "s");
  ASSERT_TRUE(info.ok()) << "an existing session stays";
  EXPECT_EQ(info->blocks, 0u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, AnAcquireThatMatchesNothingIsNoNewSessionUnderTheTenantsLimit) {
  EngineOptions o = Options(8, 8);
  o.max_sessions_per_tenant = 1;
  Start(o);
  const Chain a = MakeChain(1, 2), other = MakeChain(2, 2);
  Put("a", a);
  auto miss = Get("b", other);
  ASSERT_TRUE(miss.ok()) << "a miss creates nothing, so the limit does not apply: " << miss.status().ToString();
  EXPECT_EQ(miss->matched, 0u);
  auto hit = Get("b", a);
  ASSERT_FALSE(hit.ok()) << "a hit would make a second session";
  EXPECT_EQ(hit.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->stats().hit_blocks, 0u) << "a refused acquire counts nothing";
  auto again = Get("a", a);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(engine_->Release(again->id).ok());
  EXPECT_EQ(engine_->stats().sessions, 1u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, DuplicateCommitKeepsTheFirstCopyAndFreesTheSlot) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("a", c);
  ASSERT_EQ(engine_->stats().used[Tier::kGpu], 3u);

  // A second worker prefilled the same prompt concurrently and commits it too,
  // with other bytes in its slots.
  auto w = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w.ok());
  for (uint32_t s : w->slots)
    std::memset(engine_->pool(Tier::kGpu).slot_data(s), 0xee, engine_->profile().BlockBytes());
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 6u);
  auto r = engine_->Commit(w->id, tenant_, "b", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stored, 0u);
  EXPECT_EQ(r->duplicates, 3u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u) << "duplicate slots are freed at commit";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 3u);
  EXPECT_EQ(st.blocks, 3u);
  EXPECT_EQ(st.duplicate_blocks, 3u);
  EXPECT_EQ(st.committed_blocks, 3u);
  auto b = engine_->GetSession(tenant_, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->chain, c.keys) << "the duplicate session shares the first copy";
  ExpectChainHolds(c, 3);

  // Partly new: 3 duplicates and 2 new blocks.
  const Chain longer = MakeChain(2, 2, &c);
  const CommitResult r2 = Put("c", longer);
  EXPECT_EQ(r2.stored, 2u);
  EXPECT_EQ(r2.duplicates, 3u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  ExpectChainHolds(longer, 5);
  // Evicting the first writer keeps the blocks for the others.
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(Matched(longer), 5u);
  EXPECT_TRUE(freed_.empty());
  ExpectConsistent();
}

TEST_F(EngineTest, CommitPartOfALeaseKeepsTheRestReserved) {
  Start(Options(8, 8));
  const Chain c = MakeChain(3, 2);
  auto w = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w.ok());
  for (uint32_t i = 0; i < 2; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i + 1]), c.keys[i]);
  const uint32_t slots[] = {w->slots[1], w->slots[2]};
  auto r = engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, slots);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 4u);
  EXPECT_EQ(engine_->stats().write_leases, 1u);
  EXPECT_INVARIANTS();
  // A committed slot cannot be committed again through the lease.
  const Chain d = MakeChain(4, 1);
  const uint32_t again[] = {w->slots[1]};
  EXPECT_EQ(engine_->Commit(w->id, tenant_, "s2", BlockKey{}, 0, d.tokens, again).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 2u) << "the uncommitted slots come free on release";
  ExpectChainHolds(c, 2);
  ExpectConsistent();
}

// Two models of one tenant (equal geometry): blocks are keyed in each model's
// namespace and checked against the model, so neither is served the other's,
// while quotas and sessions stay the tenant's.
TEST_F(EngineTest, ModelsOfOneTenantNeverShareBlocks) {
  Start(Options(16, 16));
  const Tenant a{ns_, tenant_.name, ModelId{BlockKey{1, 1}}};
  const Tenant b{ns_, tenant_.name, ModelId{BlockKey{2, 2}}};
  std::vector<TokenId> tokens(3 * kBt);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i + 11);
  auto keys_of = [&](const Tenant& t) {
    std::vector<BlockKey> k(3);
    ComputeKeys(t.KeyNs(), BlockKey{}, tokens, kBt, k);
    return k;
  };
  auto w = engine_->Allocate(a, 3);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(engine_->Commit(w->id, a, "chat-a", BlockKey{}, 0, tokens, w->slots).ok());
  ASSERT_TRUE(engine_->Release(w->id).ok());
  EXPECT_EQ(engine_->Match(ns_, keys_of(a), tokens, a.model), 3u);
  EXPECT_EQ(engine_->Match(ns_, keys_of(b), tokens, b.model), 0u) << "another model's keys";
  EXPECT_EQ(engine_->Match(ns_, keys_of(a), tokens, b.model), 0u) << "a's keys, asked as b";
  EXPECT_EQ(engine_->Match(ns_, keys_of(a), tokens), 0u) << "a's keys, asked with no model";
  auto lease = engine_->Acquire(b, "", keys_of(a), tokens);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  // b commits the same tokens: new blocks of its own, not duplicates.
  auto wb = engine_->Allocate(b, 3);
  ASSERT_TRUE(wb.ok());
  auto rb = engine_->Commit(wb->id, b, "chat-b", BlockKey{}, 0, tokens, wb->slots);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->stored, 3u);
  EXPECT_EQ(rb->duplicates, 0u);
  ASSERT_TRUE(engine_->Release(wb->id).ok());
  EXPECT_EQ(engine_->GetSession(a, "chat-a")->model, a.model);
  EXPECT_EQ(engine_->GetSession(b, "chat-b")->model, b.model);
  EXPECT_EQ(engine_->tenant_usage(ns_).blocks[Tier::kGpu], 6u) << "one tenant's account for both models";
  EXPECT_EQ(engine_->tenant_usage(ns_).sessions, 2u);
  EXPECT_INVARIANTS();
}

// --- Shared index and segments -------------------------------------------------------

TEST_F(EngineTest, ClientsProbeTheSharedIndex) {
  Start(Options(8, 8));
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  EXPECT_EQ(view_.header().profile_fingerprint, TestProfile().Fingerprint());
  EXPECT_EQ(view_.block_tokens(), kBt);
  std::vector<Tier> tiers(4);
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, a.keys, NamespaceTag(ns_), a.tokens, tiers), 4u);
  EXPECT_EQ(tiers, All(Tier::kGpu, 4));
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, a.keys, NamespaceTag(ns_), a.tokens, tiers), 4u);
  EXPECT_EQ(tiers, All(Tier::kHost, 4));
  const Chain longer = MakeChain(2, 2, &a);
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, longer.keys, NamespaceTag(ns_), longer.tokens), 4u);
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(view_.LongestPrefix(BlockKey{}, a.keys, NamespaceTag(ns_), a.tokens), 0u);
  EXPECT_EQ(LoadRelaxed(view_.header().entries), 0u);
}

TEST_F(EngineTest, SegmentsAreNamelessAndTheIndexIsReadOnlyToOthers) {
  Start(Options(8, 8));
  Put("a", MakeChain(1, 2));
  EXPECT_EQ(engine_->index_segment_name().rfind("memfd:", 0), 0u) << engine_->index_segment_name();
  EXPECT_FALSE(ShmSegment::MapPassed(engine_->index_fd(), /*writable=*/true, 1, "index").ok())
      << "clients cannot write the index the daemon trusts";
  EXPECT_GE(engine_->pool(Tier::kGpu).Export().fd, 0);
  EXPECT_GE(engine_->pool(Tier::kHost).Export().fd, 0);
  EXPECT_EQ(engine_->options().gpu_slots, 8u);
  EXPECT_EQ(engine_->profile().Fingerprint(), TestProfile().Fingerprint());
  EXPECT_EQ(engine_->pool(Tier::kGpu).slots(), 8u);
  EXPECT_EQ(engine_->pool(Tier::kHost).slot_bytes(), TestProfile().BlockBytes());
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);  // Still in flight, maybe, when the engine goes.
  engine_.reset();
  // The mapping a client made outlives the engine safely.
  EXPECT_EQ(LoadRelaxed(view_.header().magic), kIndexMagic);
}

// --- Errors --------------------------------------------------------------------------

TEST_F(EngineTest, CommitRejectsBadRequestsAndKeepsTheLease) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 2);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok());
  const std::vector<uint32_t> slots = w->slots;
  auto code = [](const Result<CommitResult>& r) { return r.ok() ? StatusCode::kOk : r.status().code(); };
  EXPECT_EQ(code(engine_->Commit(w->id + 100, tenant_, "s", BlockKey{}, 0, c.tokens, slots)), StatusCode::kNotFound);
  EXPECT_EQ(code(engine_->Commit(0, tenant_, "s", BlockKey{}, 0, c.tokens, slots)), StatusCode::kNotFound);
  EXPECT_EQ(code(engine_->Commit(w->id, tenant_, "", BlockKey{}, 0, c.tokens, slots)), StatusCode::kInvalidArgument);
  const std::span<const TokenId> ragged = std::span<const TokenId>(c.tokens).first(2 * kBt - 1);
  auto r = engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, ragged, std::span<const uint32_t>(slots).first(1));
  EXPECT_EQ(code(r), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("whole number"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(code(engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, std::span<const uint32_t>(slots).first(1))),
            StatusCode::kInvalidArgument)
      << "2 blocks of tokens, 1 slot";
  EXPECT_EQ(code(engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, {}, {})), StatusCode::kInvalidArgument);
  uint32_t foreign = 0;
  while (std::find(slots.begin(), slots.end(), foreign) != slots.end()) ++foreign;
  const uint32_t not_leased[] = {slots[0], foreign};
  EXPECT_EQ(code(engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, not_leased)), StatusCode::kInvalidArgument);
  const uint32_t twice[] = {slots[0], slots[0]};
  EXPECT_EQ(code(engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, twice)), StatusCode::kInvalidArgument);
  // A read lease is not a write lease.
  auto rl = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(rl.ok());
  const Chain one = MakeChain(2, 1);
  FillBlock(engine_->pool(Tier::kGpu).slot_data(rl->slots[0]), one.keys[0]);
  ASSERT_TRUE(engine_->Commit(rl->id, tenant_, "t", BlockKey{}, 0, one.tokens, rl->slots).ok());
  ASSERT_TRUE(engine_->Release(rl->id).ok());
  auto read = Get("", one);
  ASSERT_TRUE(read.ok());
  ASSERT_NE(read->id, 0u);
  EXPECT_EQ(
      code(engine_->Commit(read->id, tenant_, "s", BlockKey{}, 0, one.tokens, std::span<const uint32_t>(slots).first(1))),
      StatusCode::kNotFound);
  ASSERT_TRUE(engine_->Release(read->id).ok());

  EXPECT_EQ(engine_->stats().sessions, 1u) << "failed commits create no session";
  EXPECT_INVARIANTS();
  // The lease survived every failure intact.
  for (uint32_t i = 0; i < 2; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(slots[i]), c.keys[i]);
  auto ok = engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, slots);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->stored, 2u);
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectChainHolds(c, 2);
  ExpectConsistent();
}

TEST_F(EngineTest, SessionCallsRejectUnknownSessionsAndBadPriorities) {
  Start(Options(8, 8));
  Put("known", MakeChain(1, 1));
  EXPECT_EQ(engine_->Evict(tenant_, "nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Demote(tenant_, "nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Prefetch(tenant_, "nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->SetPriority(tenant_, "nope", 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->GetSession(tenant_, "nope").status().code(), StatusCode::kNotFound);
  EXPECT_NE(engine_->Evict(tenant_, "nope").message().find("nope"), std::string::npos);
  EXPECT_EQ(engine_->SetPriority(tenant_, "known", -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->SetPriority(tenant_, "known", kMaxPriority + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->SetPriority(tenant_, "known", kMinPriority).ok());
  EXPECT_TRUE(engine_->SetPriority(tenant_, "known", kMaxPriority).ok());
  EXPECT_EQ(engine_->Release(0).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Release(12345).code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine_->Evict(tenant_, "known").ok());
  EXPECT_EQ(engine_->Evict(tenant_, "known").code(), StatusCode::kNotFound);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, RequestSizesAreChecked) {
  EngineOptions o = Options(8, 8);
  o.max_blocks_per_request = 4;
  Start(o);
  EXPECT_EQ(engine_->Allocate(tenant_, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Allocate(tenant_, 5).status().code(), StatusCode::kInvalidArgument);
  const Chain c = MakeChain(1, 5);
  EXPECT_EQ(Get("", c).status().code(), StatusCode::kInvalidArgument) << "5 blocks > max_blocks_per_request";
  const Chain d = MakeChain(2, 2);
  EXPECT_EQ(engine_->Acquire(tenant_, "", d.keys, std::span<const TokenId>(d.tokens).first(kBt), true).status().code(),
            StatusCode::kInvalidArgument)
      << "2 keys need 2 blocks of tokens";
  EXPECT_EQ(engine_->stats().hit_blocks + engine_->stats().miss_blocks, 0u);
}

TEST_F(EngineTest, CreateRejectsBadOptions) {
  struct Case {
    const char* what;
    void (*mutate)(EngineOptions&);
  };
  const Case cases[] = {
      {"profile", [](EngineOptions& o) { o.profile.layers = 0; }},
      {"gpu_slots", [](EngineOptions& o) { o.gpu_slots = 0; }},
      {"host_slots", [](EngineOptions& o) { o.host_slots = 0; }},
      {"too many slots", [](EngineOptions& o) { o.gpu_slots = 1u << 30; }},
      {"gpu low > high",
       [](EngineOptions& o) {
         o.gpu_high_watermark = 0.5;
         o.gpu_low_watermark = 0.6;
       }},
      {"gpu high > 1", [](EngineOptions& o) { o.gpu_high_watermark = 1.5; }},
      {"gpu low 0", [](EngineOptions& o) { o.gpu_low_watermark = 0; }},
      {"host low > high",
       [](EngineOptions& o) {
         o.host_high_watermark = 0.2;
         o.host_low_watermark = 0.3;
       }},
      {"host low negative", [](EngineOptions& o) { o.host_low_watermark = -0.1; }},
      {"max_copy_batch", [](EngineOptions& o) { o.max_copy_batch = 0; }},
      {"max_sessions", [](EngineOptions& o) { o.max_sessions = 0; }},
      {"index_segment", [](EngineOptions& o) { o.index_segment.clear(); }},
  };
  for (const Case& c : cases) {
    EngineOptions o = Options(8, 8);
    c.mutate(o);
    auto e = Engine::Create(o, *host_backend_);
    EXPECT_FALSE(e.ok()) << c.what;
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << c.what << ": " << e.status().ToString();
    }
  }
  // And the defaults, with the required names, are fine.
  EngineOptions good;
  good.profile = TestProfile();
  good.gpu_slots = 4;
  good.host_slots = 4;
  good.index_segment = "/" + prefix_ + ".good";
  auto e = Engine::Create(good, *host_backend_);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
}

}  // namespace
}  // namespace kvtier::tiering
