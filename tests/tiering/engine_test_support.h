// What the engine's tests share: the test profile, the conversations they
// write (token ids and block keys), the bytes a block holds as a function of
// its key, and EngineTest, the fixture that starts an engine on the real host
// backend (or on ManualBackend, whose copies land only when the test runs
// them) and checks the engine's invariants at teardown. engine_*_test.cc use
// all of it; the tests of the engine's parts the data and ManualBackend.
//
// The fixtures here are in a named namespace: gtest requires every test of a
// suite to use one fixture class, and the suites EngineTest and
// EngineQuotaTest have tests in several files.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine_inspector.h"
#include "kvtier/shm_segment.h"
#include "kvtier/tiering/engine.h"
#include "manual_backend.h"

namespace kvtier {
// Readable tiers in assertion messages.
void PrintTo(Tier tier, std::ostream* os);
}  // namespace kvtier

namespace kvtier::tiering {

inline constexpr uint32_t kBt = 4;  // Tokens per block.
inline constexpr auto kWait = std::chrono::seconds(10);

ModelProfile TestProfile();  // 256-byte blocks of kBt tokens.

// The real host backend, its segments labelled after `prefix` (unique per
// test); nullptr, with a test failure, if it cannot be made.
std::unique_ptr<Backend> TestHostBackend(const std::string& prefix);
// An engine of TestProfile with these slots and no automatic pressure (every
// watermark 1.0), named `name`, its index at `index_segment`.
EngineOptions TestEngineOptions(uint32_t gpu_slots, uint32_t host_slots, std::string name, std::string index_segment);

// Token IDs and block keys of a conversation.
struct Chain {
  std::vector<TokenId> tokens;  // Whole blocks only.
  std::vector<BlockKey> keys;

  uint32_t blocks() const { return static_cast<uint32_t>(keys.size()); }
  std::span<const TokenId> tokens_from(uint32_t block) const {
    return std::span<const TokenId>(tokens).subspan(size_t{block} * kBt);
  }
  std::span<const TokenId> block(uint32_t i) const {
    return std::span<const TokenId>(tokens).subspan(size_t{i} * kBt, kBt);
  }
};

// The bytes of the block with `key`: a function of the key, so any slot can be
// checked against the block it should hold.
std::byte ByteOf(const BlockKey& key, size_t i);

// A block the engine gave up (EngineOptions::on_free).
struct Freed {
  BlockKey key;
  bool dropped;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // No automatic pressure unless a test lowers the watermarks.
  EngineOptions Options(uint32_t gpu_slots, uint32_t host_slots);
  // Starts a new engine (replacing any earlier one) on the host backend, or on
  // a fresh ManualBackend (manual_), and maps its shared index (view_).
  void Start(const EngineOptions& o, bool manual = false);

  // `blocks` blocks of tokens made from `seed`, after `prefix`'s if given,
  // keyed in the test tenant's namespace; the blocks are known to ExpectConsistent.
  Chain MakeChain(uint32_t seed, uint32_t blocks, const Chain* prefix = nullptr);

  void FillBlock(std::byte* p, const BlockKey& key) const;
  bool Holds(const BlockLocation& loc, const BlockKey& key) const;

  // Writes blocks [from, end) of `c` and commits them to `session`, as a worker
  // does after prefill. The write lease is released.
  CommitResult Put(const std::string& session, const Chain& c, uint32_t from = 0);
  // Put, then demotes every block of the session and waits until they landed in the host tier.
  void PutInHostTier(const std::string& session, const Chain& c);
  Result<ReadLease> Get(const std::string& session, const Chain& c, bool promote = true) {
    return engine_->Acquire(tenant_, session, c.keys, c.tokens, promote);
  }

  // Waits for the lease's fence, then checks every leased block's bytes.
  void ExpectLeaseHolds(const ReadLease& lease, const Chain& c);
  // Leases `c` without promoting, checks its bytes wherever they are, releases.
  void ExpectChainHolds(const Chain& c, uint32_t expect_blocks);

  uint32_t Matched(const Chain& c) const { return engine_->Match(ns_, c.keys, c.tokens); }

  std::vector<Tier> Tiers(const std::string& session) const;
  static std::vector<Tier> All(Tier t, size_t n) { return std::vector<Tier>(n, t); }

  // Engine invariants, plus: every block of every session is in the shared index
  // with its tokens, parent and namespace, in the tier the session reports.
  void ExpectConsistent();

  size_t FreedCount(bool dropped) const;
  bool WasFreed(const BlockKey& key, bool dropped) const;

  struct Known {
    BlockKey parent;
    std::vector<TokenId> tokens;
  };

  std::string prefix_;
  std::unique_ptr<Backend> host_backend_;
  std::unique_ptr<ManualBackend> manual_;
  Backend* backend_ = nullptr;
  std::vector<Freed> freed_;
  std::unordered_map<BlockKey, Known, BlockKeyHash> known_;
  ShmSegment index_mapping_;
  IndexView view_;
  int engines_made_ = 0;
  const Tenant tenant_ = Tenant::Make(TestProfile().Fingerprint(), "tenant");
  const Namespace ns_ = tenant_.ns;
  std::unique_ptr<Engine> engine_;  // Last: destroyed before the backends.
};

#define EXPECT_INVARIANTS()                                                  \
  do {                                                                       \
    const ::kvtier::Status _st = EngineInspector::CheckInvariants(*engine_); \
    EXPECT_TRUE(_st.ok()) << _st.ToString();                                 \
  } while (0)

// The test tenant with GPU and host quotas, beside another tenant without any.
class EngineQuotaTest : public EngineTest {
 protected:
  EngineOptions QuotaOptions(uint32_t gpu_quota, uint32_t host_quota);
  // Commits `blocks` fresh blocks of the other tenant (no quota) under `session`.
  void PutOther(const std::string& session, uint32_t seed, uint32_t blocks);
  uint32_t Usage(const Namespace& ns, Tier t) { return engine_->tenant_usage(ns).blocks[t]; }
  const Tenant other_ = Tenant::Make(TestProfile().Fingerprint(), "other tenant");
};

}  // namespace kvtier::tiering
