// Randomized model-based test of the engine: thousands of random operations
// (commit, acquire, hold and release leases, demote, prefetch, evict, priority,
// watermark pressure) checked after every step against a simple reference model:
//  - the same hits: Engine::Match equals the longest prefix the model holds;
//  - every byte intact: each leased or matched block holds the payload derived
//    from its key, after any number of tier moves;
//  - no leased block moved or freed: a held lease's slots keep their bytes;
//  - freed blocks are reported (on_free) and were held by no lease;
//  - no leaked slot: at the end, with everything released, both tiers are empty.
// Seeded and reproducible: a failure prints the seed and step.
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_inspector.h"
#include "kvtier/block_key.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/tiering/host_backend.h"
#include "payload.h"

namespace kvtier::tiering {
namespace {

constexpr uint32_t kBlockTokens = 16;
constexpr int kConversations = 24;
constexpr int kMaxBlocks = 14;
constexpr int kSystemBlocks = 3;

using testing::FillPayload;
using testing::PayloadIntact;

struct Conversation {
  Tenant tenant;
  std::vector<TokenId> tokens;  // kMaxBlocks blocks.
  std::vector<BlockKey> keys;
};

struct HeldLease {
  LeaseId id;
  std::vector<BlockKey> keys;
  std::vector<BlockLocation> blocks;
};

class EngineModel {
 public:
  explicit EngineModel(uint32_t seed) : rng_(seed), seed_(seed) {}

  void SetUp() {
    const std::string prefix = "kvtier-model." + std::to_string(getpid()) + "." + std::to_string(seed_);
    HostBackendOptions bo;
    bo.name_prefix = prefix;
    auto b = CreateHostBackend(bo);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    EngineOptions o;
    o.profile = ModelProfile{"model-test", 2, 1, 8, DType::kF32, kBlockTokens};
    o.gpu_slots = 40;
    o.host_slots = 44;
    o.gpu_high_watermark = 0.85;
    o.gpu_low_watermark = 0.6;
    o.host_high_watermark = 0.9;
    o.host_low_watermark = 0.7;
    o.max_copy_batch = 5;  // Small batches: many fences in flight.
    o.max_sessions = 20;   // Fewer than the conversations: session eviction happens too.
    o.index_segment = "/" + prefix + ".index";
    o.on_free = [this](const BlockKey& key, bool) { freed_.push_back(key); };
    auto e = Engine::Create(o, *backend_);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    bytes_ = o.profile.BlockBytes();

    const uint64_t fp = o.profile.Fingerprint();
    const Tenant tenants[2] = {Tenant::Make(fp, "tenant-a"), Tenant::Make(fp, "tenant-b")};
    std::vector<TokenId> system(kSystemBlocks * kBlockTokens);
    for (auto& t : system) t = static_cast<TokenId>(rng_() % 50000);
    for (int c = 0; c < kConversations; ++c) {
      Conversation conv;
      conv.tenant = tenants[c % 5 == 4 ? 1 : 0];
      // Most conversations share a system prompt; conversation pairs share more.
      if (c % 3 != 0) conv.tokens = system;
      if (c % 2 == 1 && !convs_.empty()) {
        const auto& prev = convs_.back().tokens;
        conv.tokens.assign(prev.begin(), prev.begin() + std::min<size_t>(prev.size(), 5 * kBlockTokens));
      }
      while (conv.tokens.size() < kMaxBlocks * kBlockTokens) conv.tokens.push_back(static_cast<TokenId>(rng_() % 50000));
      conv.keys.resize(kMaxBlocks);
      ComputeKeys(conv.tenant.ns, BlockKey{}, conv.tokens, kBlockTokens, conv.keys);
      convs_.push_back(std::move(conv));
    }
  }

  uint32_t RefPrefix(const Conversation& c, uint32_t n) const {
    uint32_t i = 0;
    while (i < n && present_.count(KeyOf(c.keys[i]))) ++i;
    return i;
  }

  static std::pair<uint64_t, uint64_t> KeyOf(const BlockKey& k) { return {k.lo, k.hi}; }

  std::string Where() const { return "seed " + std::to_string(seed_) + " step " + std::to_string(step_); }

  std::span<const TokenId> TokensOf(const Conversation& c, uint32_t from, uint32_t to) const {
    return std::span<const TokenId>(c.tokens).subspan(size_t{from} * kBlockTokens, size_t{to - from} * kBlockTokens);
  }

  // Acquire `n` blocks of conversation `ci`; checks the hit length and bytes.
  void DoAcquire(int ci, uint32_t n, bool hold, bool promote, bool then_commit) {
    const Conversation& c = convs_[ci];
    const std::string sid = "conv-" + std::to_string(ci);
    const uint32_t expect = RefPrefix(c, n);
    auto lease = engine_->Acquire(c.tenant, sid, std::span(c.keys).first(n), TokensOf(c, 0, n), promote);
    ASSERT_TRUE(lease.ok()) << Where() << ": " << lease.status().ToString();
    // Read in place, promoted at release: the blocks move (or not) after the
    // reader, and nothing about what is cached changes.
    if (!promote && lease->id != 0 && rng_() % 2 == 0) ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
    ASSERT_EQ(lease->matched, expect) << Where() << ": acquire hit length differs from the model";
    ASSERT_LE(lease->blocks.size(), lease->matched);
    if (!lease->fence.IsNull()) {
      ASSERT_TRUE(backend_->Wait(lease->fence, std::chrono::seconds(10)).ok()) << Where();
    }
    HeldLease held{lease->id, {}, lease->blocks};
    for (size_t i = 0; i < lease->blocks.size(); ++i) {
      const BlockLocation& loc = lease->blocks[i];
      ASSERT_TRUE(PayloadIntact(c.keys[i], engine_->pool(loc.tier).slot_data(loc.slot), bytes_))
          << Where() << ": block " << i << " of " << sid << " corrupt in " << TierName(loc.tier) << " slot " << loc.slot;
      held.keys.push_back(c.keys[i]);
    }
    ++stats_.acquires;
    stats_.hit_blocks += lease->blocks.size();
    if (then_commit && n > lease->matched) {
      // Now and then a worker recomputes and commits the whole prompt (it did
      // not look first): the cached blocks come back as duplicates.
      const uint32_t start = rng_() % 6 == 0 ? 0 : lease->matched;
      const uint32_t fresh = n - start;
      auto w = engine_->Allocate(c.tenant, fresh);
      if (!w.ok()) {
        ASSERT_EQ(w.status().code(), StatusCode::kResourceExhausted) << Where() << ": " << w.status().ToString();
        ++stats_.alloc_failures;
      } else {
        for (uint32_t i = 0; i < fresh; ++i) {
          FillPayload(c.keys[start + i], engine_->pool(Tier::kGpu).slot_data(w->slots[i]), bytes_);
        }
        const BlockKey parent = start == 0 ? BlockKey{} : c.keys[start - 1];
        auto r = engine_->Commit(w->id, c.tenant, sid, parent, start, TokensOf(c, start, n), w->slots);
        ASSERT_TRUE(r.ok()) << Where() << ": " << r.status().ToString();
        ASSERT_EQ(r->stored + r->duplicates, fresh) << Where();
        ASSERT_TRUE(engine_->Release(w->id).ok());
        ApplyFrees();  // Blocks the commit replaced went first.
        for (uint32_t i = start; i < n; ++i) present_.insert(KeyOf(c.keys[i]));
        stats_.committed += r->stored;
        stats_.duplicates += r->duplicates;
      }
    }
    if (lease->id == 0) return;
    if (hold) {
      held_.push_back(std::move(held));
    } else {
      ASSERT_TRUE(engine_->Release(lease->id).ok()) << Where();
    }
  }

  void ApplyFrees() {
    for (const BlockKey& k : freed_) {
      ASSERT_EQ(present_.erase(KeyOf(k)), 1u) << Where() << ": freed a block the model does not hold";
      for (const HeldLease& h : held_) {
        for (const BlockKey& hk : h.keys) ASSERT_FALSE(hk == k) << Where() << ": freed a leased block";
      }
      ++stats_.freed;
    }
    freed_.clear();
  }

  void CheckStep() {
    ApplyFrees();
    if (HasFatalFailure()) return;
    const Status inv = EngineInspector::CheckInvariants(*engine_);
    ASSERT_TRUE(inv.ok()) << Where() << ": " << inv.ToString();
    // Held leases: bytes never move out from under a reader.
    for (const HeldLease& h : held_) {
      for (size_t i = 0; i < h.blocks.size(); ++i) {
        ASSERT_TRUE(PayloadIntact(h.keys[i], engine_->pool(h.blocks[i].tier).slot_data(h.blocks[i].slot), bytes_))
            << Where() << ": a leased block changed under its lease";
      }
    }
    // Same hits as the model, for a few conversations (and across tenants: none).
    for (int k = 0; k < 3; ++k) {
      const Conversation& c = convs_[rng_() % convs_.size()];
      ASSERT_EQ(engine_->Match(c.tenant.ns, c.keys, c.tokens), RefPrefix(c, kMaxBlocks)) << Where();
      const Conversation& other = convs_[rng_() % convs_.size()];
      if (!(other.tenant.ns == c.tenant.ns)) {
        ASSERT_EQ(engine_->Match(other.tenant.ns, c.keys, c.tokens), 0u) << Where() << ": cross-tenant hit";
      }
    }
  }

  void Run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      const int op = static_cast<int>(rng_() % 100);
      const int ci = static_cast<int>(rng_() % convs_.size());
      const std::string sid = "conv-" + std::to_string(ci);
      const uint32_t n = 1 + static_cast<uint32_t>(rng_() % kMaxBlocks);
      if (op < 40) {
        DoAcquire(ci, n, rng_() % 4 == 0, rng_() % 5 != 0, true);
      } else if (op < 52) {
        DoAcquire(ci, n, rng_() % 2 == 0, rng_() % 2 == 0, false);
      } else if (op < 64) {
        if (!held_.empty()) {
          const size_t i = rng_() % held_.size();
          ASSERT_TRUE(engine_->Release(held_[i].id).ok()) << Where();
          held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
        }
      } else if (op < 72) {
        auto r = engine_->Demote(convs_[ci].tenant, sid);
        ASSERT_TRUE(r.ok() || r.status().code() == StatusCode::kNotFound) << Where() << r.status().ToString();
        stats_.demote_calls += r.ok();
      } else if (op < 78) {
        auto r = engine_->Prefetch(convs_[ci].tenant, sid);
        ASSERT_TRUE(r.ok() || r.status().code() == StatusCode::kNotFound) << Where() << r.status().ToString();
      } else if (op < 80) {
        const Status st = engine_->Evict(convs_[ci].tenant, sid);
        ASSERT_TRUE(st.ok() || st.code() == StatusCode::kNotFound) << Where() << st.ToString();
      } else if (op < 83) {
        ApplyFrees();
        auto r = engine_->EndSession(convs_[ci].tenant, sid);
        ASSERT_TRUE(r.ok() || r.status().code() == StatusCode::kNotFound) << Where() << r.status().ToString();
        ASSERT_TRUE(freed_.empty()) << Where() << ": ending a session freed a block";
      } else if (op < 86) {
        const Status st = engine_->SetPriority(convs_[ci].tenant, sid, static_cast<int>(rng_() % 4));
        ASSERT_TRUE(st.ok() || st.code() == StatusCode::kNotFound) << Where() << st.ToString();
      } else if (op < 96) {
        engine_->Tick();
      } else {
        ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)).ok()) << Where();
        engine_->Tick();
      }
      if (HasFatalFailure()) return;
      CheckStep();
      if (HasFatalFailure()) return;
    }
  }

  void Finish() {
    ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)).ok());
    // Every block the model holds is still readable and intact.
    for (int ci = 0; ci < kConversations; ++ci) {
      DoAcquire(ci, kMaxBlocks, false, true, false);
      if (HasFatalFailure()) return;
      ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)).ok());
      CheckStep();
      if (HasFatalFailure()) return;
    }
    for (const HeldLease& h : held_) ASSERT_TRUE(engine_->Release(h.id).ok());
    held_.clear();
    for (const SessionInfo& s : engine_->ListSessions()) ASSERT_TRUE(engine_->Evict(Tenant{s.ns, s.tenant}, s.id).ok());
    ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)).ok());
    ApplyFrees();
    ASSERT_TRUE(EngineInspector::CheckInvariants(*engine_).ok());
    const EngineStats s = engine_->stats();
    EXPECT_EQ(s.used[Tier::kGpu], 0u) << "gpu slots leaked";
    EXPECT_EQ(s.used[Tier::kHost], 0u) << "host slots leaked";
    EXPECT_EQ(s.blocks, 0u);
    EXPECT_TRUE(present_.empty()) << present_.size() << " blocks the model holds were never reported freed";
    engine_stats_ = s;
  }

  struct Counts {
    uint64_t acquires = 0, hit_blocks = 0, committed = 0, duplicates = 0, freed = 0, alloc_failures = 0,
             demote_calls = 0;
  } stats_;
  EngineStats engine_stats_;

 private:
  static bool HasFatalFailure() { return ::testing::Test::HasFatalFailure(); }

  std::mt19937_64 rng_;
  uint32_t seed_;
  int step_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Engine> engine_;
  size_t bytes_ = 0;
  std::vector<Conversation> convs_;
  std::set<std::pair<uint64_t, uint64_t>> present_;
  std::vector<HeldLease> held_;
  std::vector<BlockKey> freed_;
};

class EngineModelTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(EngineModelTest, RandomOperationsMatchTheModel) {
  EngineModel model(GetParam());
  model.SetUp();
  ASSERT_FALSE(HasFatalFailure());
  model.Run(4000);
  ASSERT_FALSE(HasFatalFailure());
  model.Finish();
  ASSERT_FALSE(HasFatalFailure());
  const auto& c = model.stats_;
  const auto& s = model.engine_stats_;
  // The workload must have exercised what it claims to.
  EXPECT_GT(c.committed, 100u);
  EXPECT_GT(c.duplicates + c.hit_blocks, 100u);
  EXPECT_GT(s.demoted_blocks, 50u);
  EXPECT_GT(s.promoted_blocks, 20u);
  EXPECT_GT(s.dropped_blocks, 0u);
  std::printf("seed %u: %llu acquires, %llu hit blocks, %llu committed, %llu duplicates, %llu freed, %llu alloc "
              "failures; engine: %llu demoted, %llu promoted, %llu dropped, %llu sessions evicted\n",
              GetParam(), (unsigned long long)c.acquires, (unsigned long long)c.hit_blocks,
              (unsigned long long)c.committed, (unsigned long long)c.duplicates, (unsigned long long)c.freed,
              (unsigned long long)c.alloc_failures, (unsigned long long)s.demoted_blocks,
              (unsigned long long)s.promoted_blocks, (unsigned long long)s.dropped_blocks,
              (unsigned long long)s.evicted_sessions);
}

INSTANTIATE_TEST_SUITE_P(Seeds, EngineModelTest, ::testing::Values(1u, 2u, 3u, 20261202u));

}  // namespace
}  // namespace kvtier::tiering
