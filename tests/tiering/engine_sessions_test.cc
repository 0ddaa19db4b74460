// Engine: sessions — chains sharing prefixes, their limits, priorities and
// their deadlines — and the sessions of several tenants: fair eviction and
// paged listings.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

// --- Sessions -----------------------------------------------------------------------

TEST_F(EngineTest, SessionsShareASystemPromptPrefix) {
  Start(Options(16, 8));
  const Chain system = MakeChain(100, 2);
  const Chain a = MakeChain(1, 2, &system);
  const Chain b = MakeChain(2, 2, &system);
  Put("a", a);
  // Session b: its first turn finds the system prompt cached and prefills the rest.
  auto lease = Get("b", b);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 2u);
  ExpectLeaseHolds(*lease, b);
  const CommitResult r = Put("b", b, 2);
  EXPECT_EQ(r.stored, 2u);
  EXPECT_EQ(r.duplicates, 0u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.blocks, 6u);
  EXPECT_EQ(st.used[Tier::kGpu], 6u);
  auto info_b = engine_->GetSession(tenant_, "b");
  ASSERT_TRUE(info_b.ok());
  EXPECT_EQ(info_b->chain, b.keys);
  ExpectConsistent();

  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(engine_->stats().blocks, 4u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 4u);
  EXPECT_EQ(freed_.size(), 2u);
  EXPECT_TRUE(WasFreed(a.keys[2], false));
  EXPECT_TRUE(WasFreed(a.keys[3], false));
  EXPECT_EQ(Matched(a), 2u) << "the shared system prompt outlives session a";
  EXPECT_EQ(Matched(b), 4u);
  ExpectChainHolds(b, 4);
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound);
  ExpectConsistent();

  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  st = engine_->stats();
  EXPECT_EQ(st.blocks, 0u);
  EXPECT_EQ(st.used[Tier::kGpu], 0u);
  EXPECT_EQ(st.sessions, 0u);
  EXPECT_EQ(st.evicted_sessions, 2u);
  EXPECT_EQ(FreedCount(false), 6u);
  EXPECT_EQ(FreedCount(true), 0u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, CommitExtendsOrCutsTheSession) {
  Start(Options(16, 8));
  const Chain turn1 = MakeChain(1, 2);
  Put("s", turn1);
  // Next turn: the session's cached prefix plus two new blocks.
  const Chain turn2 = MakeChain(2, 2, &turn1);
  EXPECT_EQ(Put("s", turn2, 2).stored, 2u);
  auto info = engine_->GetSession(tenant_, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->chain, turn2.keys);
  EXPECT_EQ(info->tokens, 4u * kBt);

  // An edit of the conversation after block 1: the session is cut to 1 block and
  // continues differently; the cut blocks lose their only holder.
  Chain edit_prefix;
  edit_prefix.tokens.assign(turn1.tokens.begin(), turn1.tokens.begin() + kBt);
  const Chain edited = MakeChain(3, 2, &edit_prefix);
  ASSERT_EQ(edited.keys[0], turn1.keys[0]);
  EXPECT_EQ(Put("s", edited, 1).stored, 2u);
  info = engine_->GetSession(tenant_, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->chain, edited.keys);
  EXPECT_TRUE(WasFreed(turn2.keys[1], false));
  EXPECT_TRUE(WasFreed(turn2.keys[2], false));
  EXPECT_TRUE(WasFreed(turn2.keys[3], false));
  EXPECT_EQ(Matched(turn2), 1u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u);
  ExpectChainHolds(edited, 3);
  ExpectConsistent();
}

TEST_F(EngineTest, CommitMustContinueTheSessionItNames) {
  Start(Options(16, 8));
  const Chain turn1 = MakeChain(1, 2);
  Put("s", turn1);
  const Chain turn2 = MakeChain(2, 2, &turn1);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok());
  // A gap: the session holds 2 blocks, the commit claims to start at block 3.
  auto r = engine_->Commit(w->id, tenant_, "s", turn2.keys[2], 3, turn2.tokens_from(2), w->slots);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  // A parent that is not the session's block start_block - 1.
  r = engine_->Commit(w->id, tenant_, "s", turn2.keys[0], 2, turn2.tokens_from(2), w->slots);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  // A session that does not exist holds no blocks.
  r = engine_->Commit(w->id, tenant_, "other", turn2.keys[1], 2, turn2.tokens_from(2), w->slots);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  // Block 0 chains from the null key only.
  r = engine_->Commit(w->id, tenant_, "new", turn2.keys[1], 0, turn2.tokens_from(2), w->slots);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  // Nothing was consumed: the right commit still works.
  r = engine_->Commit(w->id, tenant_, "s", turn2.keys[1], 2, turn2.tokens_from(2), w->slots);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stored, 2u);
  EXPECT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, ListAndDescribeSessions) {
  Start(Options(16, 8));
  const Chain x = MakeChain(1, 2), y = MakeChain(2, 3);
  Put("zeta", x);
  Put("alpha", y);
  ASSERT_TRUE(engine_->SetPriority(tenant_, "zeta", 7).ok());
  const auto list = engine_->ListSessions();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].id, "alpha");
  EXPECT_EQ(list[1].id, "zeta");
  EXPECT_EQ(list[0].blocks, 3u);
  EXPECT_EQ(list[0].tokens, 3u * kBt);
  EXPECT_EQ(list[0].blocks_in[Tier::kGpu], 3u);
  EXPECT_EQ(list[0].blocks_in[Tier::kHost], 0u);
  EXPECT_EQ(list[0].ns, ns_);
  EXPECT_EQ(list[0].tenant, "tenant");
  EXPECT_TRUE(list[0].chain.empty()) << "chains only from GetSession";
  EXPECT_EQ(list[1].priority, 7);
  EXPECT_GT(list[0].last_use, list[1].last_use) << "alpha was used last";
  auto info = engine_->GetSession(tenant_, "alpha");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->chain, y.keys);
  EXPECT_EQ(info->tiers, All(Tier::kGpu, 3));
  EXPECT_EQ(info->moving, 0u);
}

TEST_F(EngineTest, TooManySessionsEvictsTheColdest) {
  EngineOptions o = Options(16, 8);
  o.max_sessions = 2;
  Start(o);
  const Chain a = MakeChain(1, 1), b = MakeChain(2, 1), c = MakeChain(3, 1);
  Put("a", a);
  Put("b", b);
  auto touch = Get("a", a);  // a is now warmer than b.
  ASSERT_TRUE(touch.ok());
  ASSERT_TRUE(engine_->Release(touch->id).ok());
  Put("c", c);
  EXPECT_EQ(engine_->stats().sessions, 2u);
  EXPECT_EQ(engine_->stats().evicted_sessions, 1u);
  EXPECT_EQ(engine_->GetSession(tenant_, "b").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetSession(tenant_, "a").ok());
  EXPECT_TRUE(engine_->GetSession(tenant_, "c").ok());
  EXPECT_EQ(Matched(b), 0u);
  EXPECT_TRUE(WasFreed(b.keys[0], false));
  ExpectConsistent();
}

TEST_F(EngineTest, ANewSessionNeverEvictsThePrefixItAcquires) {
  // At the session limit, a new session's acquire evicts the coldest session. If
  // that session alone held the prefix being acquired, the prefix must survive
  // and pass to the new session.
  EngineOptions o = Options(16, 8);
  o.max_sessions = 1;
  Start(o);
  const Chain a = MakeChain(1, 3);
  Put("old", a);
  auto lease = Get("new", a);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 3u);
  ASSERT_EQ(lease->blocks.size(), 3u);
  ExpectLeaseHolds(*lease, a);
  EXPECT_EQ(engine_->GetSession(tenant_, "old").status().code(), StatusCode::kNotFound);
  auto info = engine_->GetSession(tenant_, "new");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->chain, a.keys);
  EXPECT_TRUE(freed_.empty());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(Matched(a), 3u);
  ExpectConsistent();
}

// limits.max_session_blocks: a commit that would make a session longer is
// refused whole (nothing of it published); up to the cap works as before.
TEST_F(EngineTest, ASessionHoldsAtMostMaxSessionBlocks) {
  EngineOptions o = Options(16, 16);
  o.max_session_blocks = 3;
  Start(o);
  const Chain c = MakeChain(1, 4);
  auto w = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w.ok());
  auto r = engine_->Commit(w->id, tenant_, "long", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("limits.max_session_blocks (3)"), std::string::npos) << r.status().message();
  EXPECT_EQ(Matched(c), 0u) << "nothing of it was published";
  auto ok = engine_->Commit(w->id, tenant_, "long", BlockKey{}, 0, c.tokens_from(0).first(3 * kBt),
                            std::span<const uint32_t>(w->slots).first(3));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->stored, 3u);
  auto more = engine_->Commit(w->id, tenant_, "long", c.keys[2], 3, c.block(3),
                              std::span<const uint32_t>(w->slots).subspan(3, 1));
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted) << "the fourth block, on its own";
  ASSERT_TRUE(engine_->Release(w->id).ok());
  auto lease = Get("long", c);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 3u);
  EXPECT_EQ(engine_->GetSession(tenant_, "long")->blocks, 3u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_INVARIANTS();
}

// A client that is done with a session (a vLLM request that finished) ends
// it: what it computed stays cached, and the session no longer holds a place
// under the tenant's session limit.
TEST_F(EngineTest, AnEndedSessionKeepsItsBlocksAndMakesRoomUnderTheTenantsLimit) {
  EngineOptions o = Options(16, 8);
  o.max_sessions_per_tenant = 2;
  Start(o);
  const Chain a = MakeChain(1, 2), b = MakeChain(2, 2), c = MakeChain(3, 2);
  auto refused = [&](const std::string& session, const Chain& chain) {
    auto w = engine_->Allocate(tenant_, chain.blocks());
    EXPECT_TRUE(w.ok());
    if (!w.ok()) return false;
    const auto code = engine_->Commit(w->id, tenant_, session, BlockKey{}, 0, chain.tokens, w->slots).status().code();
    EXPECT_TRUE(engine_->Release(w->id).ok());
    return code == StatusCode::kResourceExhausted;
  };
  Put("a", a);
  Put("b", b);
  EXPECT_TRUE(refused("c", c)) << "at the limit with both sessions open: a third is refused, as before";

  auto kept = engine_->EndSession(tenant_, "a");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, 2u);
  EXPECT_EQ(Matched(a), 2u) << "an ended session's blocks stay cached";
  EXPECT_TRUE(freed_.empty());
  ASSERT_TRUE(engine_->EndSession(tenant_, "b").ok());
  EXPECT_EQ(engine_->stats().ended_sessions, 2u);
  EXPECT_INVARIANTS();

  // A new session takes the place of the coldest ended one (a), whose blocks go.
  Put("c", c);
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Matched(a), 0u);
  EXPECT_EQ(Matched(b), 2u);
  EXPECT_EQ(Matched(c), 2u);
  EXPECT_TRUE(WasFreed(a.keys[1], false));
  EXPECT_EQ(engine_->stats().sessions, 2u);
  EXPECT_INVARIANTS();

  // Naming b again takes it back: no ended session is left to give up.
  auto lease = Get("b", b);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_TRUE(refused("d", a));
  EXPECT_EQ(Matched(b), 2u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, EndingASessionAnotherContinuesRemovesItAndFreesNothing) {
  Start(Options(16, 8));
  const Chain turn1 = MakeChain(1, 2);
  const Chain turn2 = MakeChain(2, 2, &turn1);
  Put("turn1", turn1);
  auto lease = Get("turn2", turn1);  // The next turn's request adopts the cached prefix...
  ASSERT_TRUE(lease.ok());
  Put("turn2", turn2, 2);  // ...and extends it.
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  auto kept = engine_->EndSession(tenant_, "turn1");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, 0u) << "turn2 holds all of turn1's chain";
  EXPECT_EQ(engine_->GetSession(tenant_, "turn1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Matched(turn2), 4u);
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().evicted_sessions, 0u) << "ending is not evicting";
  EXPECT_EQ(*engine_->EndSession(tenant_, "turn2"), 4u);
  EXPECT_EQ(engine_->EndSession(tenant_, "nobody").status().code(), StatusCode::kNotFound);
  EXPECT_INVARIANTS();
}

// --- Priorities and their deadlines --------------------------------------------------

TEST_F(EngineTest, PriorityTtlRevertsToZeroAtItsDeadline) {
  Start(Options(16, 16));
  for (const char* s : {"a", "b", "c", "d"}) Put(s, MakeChain(static_cast<uint32_t>(s[0]), 1));
  const auto now = std::chrono::steady_clock::now();
  const auto later = [&](std::chrono::milliseconds d) { return now + d; };

  ASSERT_TRUE(engine_->SetPriority(tenant_, "a", 5, milliseconds(1000)).ok());
  EXPECT_EQ(engine_->ExpirePriorities(later(milliseconds(0))), 0u);
  EXPECT_EQ(engine_->GetSession(tenant_, "a")->priority, 5);
  EXPECT_EQ(engine_->ExpirePriorities(later(milliseconds(5000))), 1u);
  EXPECT_EQ(engine_->GetSession(tenant_, "a")->priority, 0);
  EXPECT_EQ(engine_->stats().expired_priorities, 1u);

  // A later pin without a ttl cancels the deadline; one with a ttl replaces it.
  ASSERT_TRUE(engine_->SetPriority(tenant_, "b", 4, milliseconds(1000)).ok());
  ASSERT_TRUE(engine_->SetPriority(tenant_, "b", 6).ok());
  ASSERT_TRUE(engine_->SetPriority(tenant_, "c", 3, milliseconds(1000)).ok());
  ASSERT_TRUE(engine_->SetPriority(tenant_, "c", 3, std::chrono::hours(1)).ok());
  // A session that is gone leaves nothing to revert.
  ASSERT_TRUE(engine_->SetPriority(tenant_, "d", 2, milliseconds(1000)).ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "d").ok());
  EXPECT_EQ(engine_->ExpirePriorities(later(milliseconds(5000))), 0u);
  EXPECT_EQ(engine_->GetSession(tenant_, "b")->priority, 6);
  EXPECT_EQ(engine_->GetSession(tenant_, "c")->priority, 3);
  EXPECT_EQ(engine_->ExpirePriorities(later(std::chrono::hours(2))), 1u);
  EXPECT_EQ(engine_->GetSession(tenant_, "c")->priority, 0);
  EXPECT_EQ(engine_->GetSession(tenant_, "b")->priority, 6);
  EXPECT_EQ(engine_->stats().expired_priorities, 2u);

  // Tick uses the real clock.
  ASSERT_TRUE(engine_->SetPriority(tenant_, "a", 7, milliseconds(1)).ok());
  std::this_thread::sleep_for(milliseconds(5));
  engine_->Tick();
  EXPECT_EQ(engine_->GetSession(tenant_, "a")->priority, 0);

  EXPECT_EQ(engine_->SetPriority(tenant_, "a", 1, milliseconds(-1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->SetPriority(tenant_, "a", 1, kMaxPriorityTtl + milliseconds(1)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->SetPriority(tenant_, "a", 1, kMaxPriorityTtl).ok());
  EXPECT_INVARIANTS();
}

// Setting a ttl again and again replaces one deadline: the queue of deadlines
// stays bounded by the sessions, and what a gone session queued goes too.
TEST_F(EngineTest, RepeatedPriorityTtlsKeepTheDeadlineQueueBounded) {
  Start(Options(16, 16));
  for (const char* s : {"a", "b"}) Put(s, MakeChain(static_cast<uint32_t>(s[0]), 1));
  for (int i = 0; i < 20000; ++i) {
    ASSERT_TRUE(engine_->SetPriority(tenant_, i % 2 ? "a" : "b", 1 + i % 5, milliseconds(1000 + i)).ok());
    ASSERT_LE(EngineInspector::PendingDeadlines(*engine_), 2u * 2 + 64) << "after " << i << " calls";
  }
  // Only the latest deadline of each counts.
  const auto now = std::chrono::steady_clock::now();
  EXPECT_EQ(engine_->ExpirePriorities(now + milliseconds(500)), 0u);
  EXPECT_EQ(engine_->ExpirePriorities(now + milliseconds(30000)), 2u);
  EXPECT_EQ(EngineInspector::PendingDeadlines(*engine_), 0u);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(engine_->SetPriority(tenant_, "a", 3, milliseconds(100000 + i)).ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  EXPECT_LE(EngineInspector::PendingDeadlines(*engine_), 64u) << "evicting the sessions frees their deadlines";
  EXPECT_INVARIANTS();
}

// --- Sessions of several tenants: fair eviction, paged listings -----------------------

class EngineTenantSessionTest : public EngineTest {
 protected:
  static Tenant Named(const std::string& name) { return Tenant::Make(TestProfile().Fingerprint(), name); }
  // Chain `seed` of `blocks` blocks, keyed in `t`'s namespace.
  static Chain ChainOf(const Tenant& t, uint32_t seed, uint32_t blocks) {
    Chain c;
    for (uint32_t i = 0; i < blocks * kBt; ++i) c.tokens.push_back(seed * 100003u + i);
    c.keys.resize(blocks);
    ComputeKeys(t.ns, BlockKey{}, c.tokens, kBt, c.keys);
    return c;
  }
  void PutAs(const Tenant& t, const std::string& session, const Chain& c) {
    auto w = engine_->Allocate(t, c.blocks());
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (uint32_t i = 0; i < c.blocks(); ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
    auto r = engine_->Commit(w->id, t, session, BlockKey{}, 0, c.tokens, w->slots);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(engine_->Release(w->id).ok());
  }
  // Acquires `c` under `session` of `t` and releases the lease: the session now holds c's cached prefix.
  Status AcquireAs(const Tenant& t, const std::string& session, const Chain& c) {
    auto lease = engine_->Acquire(t, session, c.keys, c.tokens, false);
    if (!lease.ok()) return lease.status();
    return lease->id == 0 ? Status::Ok() : engine_->Release(lease->id);
  }
  uint32_t SessionsOf(const Tenant& t) const { return engine_->tenant_usage(t.ns).sessions; }
  // The victim's session holds its whole chain with the bytes it was committed with.
  void ExpectIntact(const Tenant& t, const std::string& session, const Chain& c) {
    auto info = engine_->GetSession(t, session);
    ASSERT_TRUE(info.ok()) << session << ": " << info.status().ToString();
    EXPECT_EQ(info->chain, c.keys);
    auto lease = engine_->Acquire(t, session, c.keys, c.tokens, false);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    ASSERT_EQ(lease->blocks.size(), c.blocks());
    for (uint32_t i = 0; i < c.blocks(); ++i) EXPECT_TRUE(Holds(lease->blocks[i], c.keys[i])) << "block " << i;
    ASSERT_TRUE(engine_->Release(lease->id).ok());
  }
  // Every session, page by page (checking each page's bounds); fails on a repeat.
  std::vector<SessionInfo> AllPages(const std::optional<Namespace>& only, const SessionPageLimits& limits) {
    std::vector<SessionInfo> all;
    std::optional<SessionCursor> after;
    for (int pages = 0;; ++pages) {
      EXPECT_LT(pages, 1000) << "paging never ends";
      if (pages >= 1000) break;
      SessionPage page = engine_->ListSessions(only, after, limits);
      EXPECT_LE(page.sessions.size(), std::max<size_t>(1, limits.sessions));
      EXPECT_TRUE(!page.more || !page.sessions.empty()) << "a page that says more lists something";
      for (SessionInfo& s : page.sessions) all.push_back(std::move(s));
      if (!page.more) break;
      after = SessionCursor{all.back().ns, all.back().id};
    }
    return all;
  }
};

TEST_F(EngineTenantSessionTest, AFloodOfSessionsEvictsOnlyTheFloodersOwn) {
  EngineOptions o = Options(32, 32);
  o.max_sessions = 8;
  Start(o);
  const Tenant victim = Named("victim"), flooder = Named("flooder");
  const Chain chat = ChainOf(victim, 1, 3), seed = ChainOf(flooder, 2, 1);
  PutAs(victim, "chat", chat);
  PutAs(flooder, "seed", seed);
  // The flooder names a new session per acquire of its one cached block, warming each as it goes.
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(AcquireAs(flooder, "s" + std::to_string(i), seed).ok());
  EXPECT_EQ(engine_->stats().sessions, 8u);
  EXPECT_EQ(SessionsOf(victim), 1u) << "the victim is below its share and keeps its session";
  EXPECT_EQ(SessionsOf(flooder), 7u);
  ExpectIntact(victim, "chat", chat);
  for (const BlockKey& k : chat.keys) EXPECT_FALSE(WasFreed(k, false) || WasFreed(k, true));
  // A third tenant, below its share, takes its room from the tenant holding the most.
  const Tenant third = Named("third");
  const Chain mine = ChainOf(third, 3, 2);
  PutAs(third, "mine", mine);
  EXPECT_EQ(SessionsOf(third), 1u);
  EXPECT_EQ(SessionsOf(flooder), 6u);
  ExpectIntact(victim, "chat", chat);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTenantSessionTest, ATenantAtItsShareMakesRoomFromItsOwnColdest) {
  EngineOptions o = Options(32, 32);
  o.max_sessions = 4;
  Start(o);
  const Tenant a = Named("a"), b = Named("b");
  const Chain ca = ChainOf(a, 1, 1), cb = ChainOf(b, 2, 1);
  PutAs(a, "a0", ca);
  ASSERT_TRUE(AcquireAs(a, "a1", ca).ok());  // a's sessions are the coldest of all.
  PutAs(b, "b0", cb);
  ASSERT_TRUE(AcquireAs(b, "b1", cb).ok());
  ASSERT_TRUE(AcquireAs(b, "b2", cb).ok());  // b holds 2, its share of 4: its own b0 goes.
  EXPECT_EQ(SessionsOf(a), 2u);
  EXPECT_EQ(SessionsOf(b), 2u);
  EXPECT_EQ(engine_->GetSession(b, "b0").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetSession(a, "a0").ok()) << "the coldest session of all was a's, below nothing";
  EXPECT_EQ(engine_->stats().evicted_sessions, 1u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTenantSessionTest, OneTenantAloneEvictsItsColdestAsBefore) {
  EngineOptions o = Options(32, 32);
  o.max_sessions = 3;
  Start(o);
  const Tenant a = Named("a");
  const Chain c = ChainOf(a, 1, 1);
  PutAs(a, "s0", c);
  for (int i = 1; i < 6; ++i) ASSERT_TRUE(AcquireAs(a, "s" + std::to_string(i), c).ok());
  EXPECT_EQ(SessionsOf(a), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(engine_->GetSession(a, "s" + std::to_string(i)).ok()) << i;
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(engine_->GetSession(a, "s" + std::to_string(i)).ok()) << i;
  EXPECT_INVARIANTS();
}

TEST_F(EngineTenantSessionTest, ListingsPageInKeyOrderWithinTheirBounds) {
  Start(Options(64, 64));
  const Tenant tenants[3] = {Named("t0"), Named("t1"), Named("t2")};
  std::set<std::pair<std::string, std::string>> made;
  for (int t = 0; t < 3; ++t) {
    const Chain c = ChainOf(tenants[t], 10 + t, 3);
    PutAs(tenants[t], "first", c);
    made.insert({tenants[t].name, "first"});
    for (int i = 0; i < 6; ++i) {
      const std::string id = "s" + std::to_string(i);
      ASSERT_TRUE(AcquireAs(tenants[t], id, c).ok());
      made.insert({tenants[t].name, id});
    }
  }
  auto key = [](const SessionInfo& s) { return std::make_tuple(s.ns.id.hi, s.ns.id.lo, s.id); };
  auto check = [&](const std::vector<SessionInfo>& got, size_t want) {
    EXPECT_EQ(got.size(), want);
    std::set<std::pair<std::string, std::string>> seen;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(seen.insert({got[i].tenant, got[i].id}).second) << "listed twice: " << got[i].id;
      if (i > 0) {
        EXPECT_LT(key(got[i - 1]), key(got[i])) << "out of key order at " << i;
      }
      EXPECT_EQ(got[i].blocks, 3u);
      EXPECT_EQ(got[i].blocks_in[Tier::kGpu], 3u);
    }
    return seen;
  };
  SessionPageLimits limits;
  limits.sessions = 4;
  EXPECT_EQ(check(AllPages(std::nullopt, limits), 21), made);
  // One tenant's pages walk its range alone.
  const auto one = check(AllPages(tenants[1].ns, limits), 7);
  for (const auto& [tenant, id] : one) EXPECT_EQ(tenant, "t1");
  // The block and byte budgets end a page early, but never before its first session.
  SessionPageLimits tight;
  tight.chain_blocks = 1;
  SessionPage page = engine_->ListSessions(std::nullopt, std::nullopt, tight);
  EXPECT_EQ(page.sessions.size(), 1u);
  EXPECT_TRUE(page.more);
  tight = SessionPageLimits{};
  tight.chain_blocks = 7;  // Two 3-block sessions.
  EXPECT_EQ(engine_->ListSessions(std::nullopt, std::nullopt, tight).sessions.size(), 2u);
  tight = SessionPageLimits{};
  tight.row_bytes = 100;
  tight.bytes = 250;  // Two rows of 100 + "t0" + "s0".
  EXPECT_EQ(engine_->ListSessions(std::nullopt, std::nullopt, tight).sessions.size(), 2u);
  tight.bytes = 1;
  check(AllPages(std::nullopt, tight), 21);
  // A cursor whose session is gone still resumes right after it.
  page = engine_->ListSessions(tenants[2].ns, std::nullopt, limits);
  ASSERT_EQ(page.sessions.size(), 4u);
  ASSERT_TRUE(engine_->Evict(tenants[2], page.sessions.back().id).ok());
  SessionPage rest =
      engine_->ListSessions(tenants[2].ns, SessionCursor{tenants[2].ns, page.sessions.back().id}, limits);
  EXPECT_EQ(rest.sessions.size(), 3u);
  EXPECT_FALSE(rest.more);
  for (const SessionInfo& s : rest.sessions) EXPECT_GT(s.id, page.sessions.back().id);
  // A cursor in another tenant's range starts at this tenant's first session or past its last.
  const SessionCursor before{Namespace{}, ""}, beyond{Namespace{BlockKey{~0ull, ~0ull}}, "~"};
  EXPECT_EQ(engine_->ListSessions(tenants[0].ns, before, limits).sessions.size(), 4u);
  EXPECT_TRUE(engine_->ListSessions(tenants[0].ns, beyond, limits).sessions.empty());
  EXPECT_INVARIANTS();
}

TEST_F(EngineTenantSessionTest, EvictingATenantsSessionsLeavesTheOthers) {
  Start(Options(32, 32));
  const Tenant a = Named("a"), b = Named("b");
  const Chain ca = ChainOf(a, 1, 2), cb = ChainOf(b, 2, 2);
  PutAs(a, "x", ca);
  ASSERT_TRUE(AcquireAs(a, "y", ca).ok());
  PutAs(b, "x", cb);
  EXPECT_EQ(engine_->EvictSessions(a.ns), 2u);
  EXPECT_EQ(SessionsOf(a), 0u);
  EXPECT_EQ(engine_->Match(a.ns, ca.keys, ca.tokens), 0u) << "its blocks went with its last session";
  ExpectIntact(b, "x", cb);
  EXPECT_EQ(engine_->EvictSessions(std::nullopt), 1u);
  EXPECT_EQ(engine_->stats().sessions, 0u);
  EXPECT_INVARIANTS();
}

}  // namespace
}  // namespace kvtier::tiering
