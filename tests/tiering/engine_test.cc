// Engine: the write and read paths, sessions, leases, tiering and pressure.
//
// Most tests run on the real host backend. Tests that need a copy to stay in
// flight (or a backend that refuses work) use ManualBackend, whose copies land
// only when the test says so.
#include "kvtier/tiering/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <ostream>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kvtier/shm_segment.h"
#include "kvtier/tiering/host_backend.h"
#include "engine_inspector.h"
#include "support/test_names.h"

namespace kvtier {
// Readable tiers in assertion messages.
void PrintTo(Tier tier, std::ostream* os) { *os << TierName(tier); }
}  // namespace kvtier

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kBt = 4;  // Tokens per block.
constexpr auto kWait = std::chrono::seconds(10);

ModelProfile TestProfile() { return ModelProfile{"test", 2, 1, 8, DType::kF16, kBt}; }  // 256-byte blocks.

// --- A backend whose copies land only when the test runs them ------------------

class HeapPool final : public Pool {
 public:
  HeapPool(const PoolSpec& spec, std::unique_ptr<std::byte[]> mem)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, mem.get()), mem_(std::move(mem)) {}
  PoolHandle Export() const override {
    PoolHandle h;
    h.tier = tier();
    h.slot_bytes = slot_bytes();
    h.slots = slots();
    return h;
  }

 private:
  std::unique_ptr<std::byte[]> mem_;
};

class ManualBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  std::string Describe() const override { return "manual (test)"; }

  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) override {
    auto mem = std::make_unique<std::byte[]>(spec.slot_bytes * spec.slots);
    return std::unique_ptr<Pool>(new HeapPool(spec, std::move(mem)));
  }

  Result<Fence> SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst,
                             std::span<const CopyOp> ops) override {
    if (refuse_submits > 0) {
      --refuse_submits;
      return Unavailable("copy refused by the test");
    }
    const int d = static_cast<int>(dir);
    EXPECT_EQ(src.slot_bytes(), dst.slot_bytes());
    EXPECT_EQ(src.tier(), dir == CopyDirection::kGpuToHost ? Tier::kGpu : Tier::kHost);
    jobs_[d].push_back(Job{++submitted_[d], &src, &dst, std::vector<CopyOp>(ops.begin(), ops.end())});
    return Fence{submitted_[d], dir};
  }

  bool IsComplete(const Fence& f) const override {
    return f.IsNull() || completed_[static_cast<int>(f.stream)] >= f.seq;
  }

  Status Wait(const Fence& f, milliseconds) const override {
    ++wait_calls;
    if (!IsComplete(f) && complete_on_wait) RunUntil(f);
    if (IsComplete(f)) return Status::Ok();
    return Status(StatusCode::kTimeout, "manual backend: copy not run");
  }

  void SetCompletionNotifier(std::function<void()>) override {}
  std::string FenceSegmentName() const override { return ""; }
  int FenceSegmentFd() const override { return -1; }
  CopyStats copy_stats(CopyDirection) const override { return {}; }

  // Emulated client events: byte 0 of the handle names the event; the test
  // says when it is done (every event is pending until then).
  Result<uint64_t> WatchClientEvent(uint64_t, const wire::IpcEventHandle& event) override {
    watches_[next_watch_] = event[0];
    return next_watch_++;
  }
  WorkState QueryWatch(uint64_t watch) override {
    const auto it = watches_.find(watch);
    EXPECT_NE(it, watches_.end()) << "query of an ended watch";
    if (it == watches_.end()) return WorkState::kDone;
    const auto e = events.find(it->second);
    return e == events.end() ? WorkState::kPending : e->second;
  }
  void EndWatch(uint64_t watch) override { EXPECT_EQ(watches_.erase(watch), 1u) << "watch ended twice"; }
  size_t open_watches() const { return watches_.size(); }
  std::unordered_map<uint8_t, WorkState> events;

  // Lands every queued copy, promotions first.
  void RunAll() const {
    for (int d : {static_cast<int>(CopyDirection::kHostToGpu), static_cast<int>(CopyDirection::kGpuToHost)}) {
      while (!jobs_[d].empty()) RunOne(d);
    }
  }
  size_t queued_ops() const {
    size_t n = 0;
    for (const auto& q : jobs_) {
      for (const Job& j : q) n += j.ops.size();
    }
    return n;
  }

  mutable int wait_calls = 0;
  bool complete_on_wait = false;  // Wait runs the copies it waits for, like a synchronous device.
  int refuse_submits = 0;         // The next N SubmitCopies calls fail.

 private:
  struct Job {
    uint64_t seq;
    const Pool* src;
    const Pool* dst;
    std::vector<CopyOp> ops;
  };

  void RunOne(int d) const {
    const Job& j = jobs_[d].front();
    for (const CopyOp& op : j.ops)
      std::memcpy(j.dst->slot_data(op.dst_slot), j.src->slot_data(op.src_slot), j.src->slot_bytes());
    completed_[d] = j.seq;
    jobs_[d].pop_front();
  }
  void RunUntil(const Fence& f) const {
    const int d = static_cast<int>(f.stream);
    while (completed_[d] < f.seq && !jobs_[d].empty()) RunOne(d);
  }

  mutable std::deque<Job> jobs_[kCopyStreams];
  std::unordered_map<uint64_t, uint8_t> watches_;
  uint64_t next_watch_ = 1;
  uint64_t submitted_[kCopyStreams] = {0, 0};
  mutable uint64_t completed_[kCopyStreams] = {0, 0};
};

// --- Test data -----------------------------------------------------------------

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
std::byte ByteOf(const BlockKey& key, size_t i) {
  const uint64_t w = (i / 8) % 2 ? key.hi : key.lo;
  return static_cast<std::byte>((w >> (8 * (i % 8))) ^ (i * 131));
}

struct Freed {
  BlockKey key;
  bool dropped;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = testing::UniqueShmPrefix("engine");
    HostBackendOptions o;
    o.name_prefix = prefix_;
    auto b = CreateHostBackend(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    host_backend_ = std::move(b).value();
  }

  void TearDown() override {
    if (engine_ != nullptr) {
      const Status st = EngineInspector::CheckInvariants(*engine_);
      EXPECT_TRUE(st.ok()) << "at teardown: " << st.ToString();
    }
  }

  // No automatic pressure unless a test lowers the watermarks.
  EngineOptions Options(uint32_t gpu_slots, uint32_t host_slots) {
    EngineOptions o;
    o.profile = TestProfile();
    o.gpu_slots = gpu_slots;
    o.host_slots = host_slots;
    o.gpu_high_watermark = o.gpu_low_watermark = 1.0;
    o.host_high_watermark = o.host_low_watermark = 1.0;
    o.name = "engine" + std::to_string(engines_made_);
    o.index_segment = "/" + prefix_ + ".index" + std::to_string(engines_made_);
    o.on_free = [this](const BlockKey& key, bool dropped) { freed_.push_back(Freed{key, dropped}); };
    return o;
  }

  void Start(const EngineOptions& o, bool manual = false) {
    ++engines_made_;
    engine_.reset();
    if (manual) manual_ = std::make_unique<ManualBackend>();
    backend_ = manual ? static_cast<Backend*>(manual_.get()) : host_backend_.get();
    auto e = Engine::Create(o, *backend_);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    auto seg = ShmSegment::MapPassed(engine_->index_fd(), false, sizeof(IndexHeader), "index");
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    index_mapping_ = std::move(seg).value();
    auto view = IndexView::Attach(index_mapping_.data(), index_mapping_.size());
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    view_ = *view;
  }

  Chain MakeChain(uint32_t seed, uint32_t blocks, const Chain* prefix = nullptr) {
    Chain c;
    if (prefix != nullptr) c.tokens = prefix->tokens;
    for (uint32_t i = 0; i < blocks * kBt; ++i) c.tokens.push_back(seed * 100003u + i);
    c.keys.resize(c.tokens.size() / kBt);
    EXPECT_EQ(ComputeKeys(ns_, BlockKey{}, c.tokens, kBt, c.keys), c.keys.size());
    for (uint32_t i = 0; i < c.blocks(); ++i) {
      known_[c.keys[i]] =
          Known{i == 0 ? BlockKey{} : c.keys[i - 1], std::vector<TokenId>(c.block(i).begin(), c.block(i).end())};
    }
    return c;
  }

  void FillBlock(std::byte* p, const BlockKey& key) const {
    for (size_t i = 0; i < engine_->profile().BlockBytes(); ++i) p[i] = ByteOf(key, i);
  }
  bool Holds(const BlockLocation& loc, const BlockKey& key) const {
    const std::byte* p = engine_->pool(loc.tier).slot_data(loc.slot);
    for (size_t i = 0; i < engine_->profile().BlockBytes(); ++i) {
      if (p[i] != ByteOf(key, i)) return false;
    }
    return true;
  }

  // Writes blocks [from, end) of `c` and commits them to `session`, as a worker
  // does after prefill. The write lease is released.
  CommitResult Put(const std::string& session, const Chain& c, uint32_t from = 0) {
    const uint32_t n = c.blocks() - from;
    auto w = engine_->Allocate(tenant_, n);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return {};
    EXPECT_EQ(w->slots.size(), n);
    for (uint32_t i = 0; i < n; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[from + i]);
    auto r = engine_->Commit(w->id, tenant_, session, from == 0 ? BlockKey{} : c.keys[from - 1], from, c.tokens_from(from),
                             w->slots);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(engine_->Release(w->id).ok());
    return r.ok() ? *r : CommitResult{};
  }

  // Put, then demotes every block of the session and waits until they landed in the host tier.
  void PutInHostTier(const std::string& session, const Chain& c) {
    Put(session, c);
    ASSERT_EQ(*engine_->Demote(tenant_, session), c.blocks());
    ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  }

  Result<ReadLease> Get(const std::string& session, const Chain& c, bool promote = true) {
    return engine_->Acquire(tenant_, session, c.keys, c.tokens, promote);
  }

  // Waits for the lease's fence, then checks every leased block's bytes.
  void ExpectLeaseHolds(const ReadLease& lease, const Chain& c) {
    ASSERT_TRUE(backend_->Wait(lease.fence, kWait).ok());
    ASSERT_LE(lease.blocks.size(), c.blocks());
    for (size_t i = 0; i < lease.blocks.size(); ++i) {
      EXPECT_TRUE(Holds(lease.blocks[i], c.keys[i]))
          << "block " << i << " in " << TierName(lease.blocks[i].tier) << " slot " << lease.blocks[i].slot;
    }
  }

  // Leases `c` without promoting, checks its bytes wherever they are, releases.
  void ExpectChainHolds(const Chain& c, uint32_t expect_blocks) {
    auto lease = Get("", c, /*promote=*/false);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    EXPECT_EQ(lease->matched, expect_blocks);
    EXPECT_EQ(lease->blocks.size(), expect_blocks);
    ExpectLeaseHolds(*lease, c);
    if (lease->id != 0) {
      EXPECT_TRUE(engine_->Release(lease->id).ok());
    }
  }

  uint32_t Matched(const Chain& c) const { return engine_->Match(ns_, c.keys, c.tokens); }

  std::vector<Tier> Tiers(const std::string& session) const {
    auto info = engine_->GetSession(tenant_, session);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? info->tiers : std::vector<Tier>{};
  }
  static std::vector<Tier> All(Tier t, size_t n) { return std::vector<Tier>(n, t); }

  // Engine invariants, plus: every block of every session is in the shared index
  // with its tokens, parent and namespace, in the tier the session reports.
  void ExpectConsistent() {
    const Status st = EngineInspector::CheckInvariants(*engine_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (const SessionInfo& s : engine_->ListSessions()) {
      auto info = engine_->GetSession(tenant_, s.id);
      ASSERT_TRUE(info.ok());
      for (size_t i = 0; i < info->chain.size(); ++i) {
        auto it = known_.find(info->chain[i]);
        ASSERT_NE(it, known_.end()) << "session " << s.id << " holds a block no test made";
        IndexEntry e;
        ASSERT_TRUE(view_.Find(info->chain[i], it->second.parent, NamespaceTag(ns_), it->second.tokens, &e))
            << "session " << s.id << " block " << i << " missing from the shared index";
        EXPECT_EQ(e.tier, info->tiers[i]) << "session " << s.id << " block " << i;
      }
    }
  }

  size_t FreedCount(bool dropped) const {
    return static_cast<size_t>(
        std::count_if(freed_.begin(), freed_.end(), [&](const Freed& f) { return f.dropped == dropped; }));
  }
  bool WasFreed(const BlockKey& key, bool dropped) const {
    return std::any_of(freed_.begin(), freed_.end(),
                       [&](const Freed& f) { return f.key == key && f.dropped == dropped; });
  }

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

#define EXPECT_INVARIANTS()                                  \
  do {                                                       \
    const ::kvtier::Status _st = EngineInspector::CheckInvariants(*engine_); \
    EXPECT_TRUE(_st.ok()) << _st.ToString();                 \
  } while (0)

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

// --- Leases ------------------------------------------------------------------------

TEST_F(EngineTest, LeasedBlocksAreNeverDemotedOrFreed) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("s", c);
  auto lease = Get("", c);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->blocks.size(), 3u);

  auto demoted = engine_->Demote(tenant_, "s");
  ASSERT_TRUE(demoted.ok());
  EXPECT_EQ(*demoted, 0u) << "leased blocks are skipped";
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);

  // Evicting the only session while a reader holds the blocks keeps them alive.
  ASSERT_TRUE(engine_->Evict(tenant_, "s").ok());
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u);
  EXPECT_INVARIANTS();
  // Pressure cannot take them either.
  auto w = engine_->Allocate(tenant_, 6);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  engine_->Tick();
  ExpectLeaseHolds(*lease, c);

  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(freed_.size(), 3u);
  EXPECT_EQ(FreedCount(false), 3u) << "the last holder let go: not a drop";
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().blocks, 0u);
  EXPECT_EQ(Matched(c), 0u);
  EXPECT_EQ(engine_->Release(lease->id).code(), StatusCode::kNotFound) << "a lease ends once";
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, TwoReadersOfOneBlock) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 2);
  Put("s", c);
  auto l1 = Get("", c);
  auto l2 = Get("", c);
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_NE(l1->id, l2->id);
  EXPECT_EQ(engine_->stats().read_leases, 2u);
  ASSERT_TRUE(engine_->Evict(tenant_, "s").ok());
  ASSERT_TRUE(engine_->Release(l1->id).ok());
  EXPECT_TRUE(freed_.empty()) << "the second reader still holds them";
  ExpectLeaseHolds(*l2, c);
  ASSERT_TRUE(engine_->Release(l2->id).ok());
  EXPECT_EQ(freed_.size(), 2u);
  EXPECT_INVARIANTS();
}

// --- Demotion, promotion, prefetch -----------------------------------------------

TEST_F(EngineTest, DemoteThenAcquirePromotesWithIntactBytes) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 4);
  Put("s", c);
  auto n = engine_->Demote(tenant_, "s");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 0u);
  EXPECT_EQ(st.used[Tier::kHost], 4u);
  EXPECT_EQ(st.demoted_blocks, 4u);
  EXPECT_EQ(st.copies_in_flight, 0u);
  auto info = engine_->GetSession(tenant_, "s");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tiers, All(Tier::kHost, 4));
  EXPECT_EQ(info->blocks_in[Tier::kHost], 4u);
  EXPECT_EQ(info->moving, 0u);
  ExpectConsistent();
  ExpectChainHolds(c, 4);  // Read in place in the host tier.

  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_EQ(lease->promoted, 4u);
  EXPECT_FALSE(lease->fence.IsNull());
  EXPECT_EQ(lease->fence.stream, CopyDirection::kHostToGpu);
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kGpu);
  EXPECT_INVARIANTS();
  // The worker waits on the fence through the backend, then reads the GPU slots.
  ASSERT_TRUE(backend_->Wait(lease->fence, kWait).ok());
  ExpectLeaseHolds(*lease, c);
  EXPECT_EQ(engine_->Poll(), 4u);
  st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 4u);
  EXPECT_EQ(st.used[Tier::kHost], 0u);
  EXPECT_EQ(st.promoted_blocks, 4u);
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 4));
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, AcquireWithoutPromoteLeasesInTheHostTier) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("s", c));
  auto lease = Get("s", c, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kHost);
  ExpectLeaseHolds(*lease, c);
  // While leased in the host tier, neither prefetch nor a promoting acquire moves them.
  EXPECT_EQ(*engine_->Prefetch(tenant_, "s"), 0u);
  auto second = Get("", c, /*promote=*/true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->promoted, 0u);
  for (const BlockLocation& loc : second->blocks) EXPECT_EQ(loc.tier, Tier::kHost);
  ASSERT_TRUE(engine_->Release(second->id).ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, PromoteOnReleaseMovesTheReadHostBlocksOnceTheLeaseEnds) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("s", c));
  auto lease = Get("s", c, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull()) << "nothing to wait for: read where they lie";
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kHost);
  ExpectLeaseHolds(*lease, c);
  engine_->Poll();
  EXPECT_EQ(Tiers("s"), All(Tier::kHost, 4)) << "nothing moves while the lease is held";
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 4u) << "promoted at release, into free GPU slots";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 4));
  EXPECT_EQ(engine_->stats().promoted_blocks, 4u);
  EXPECT_EQ(engine_->stats().after_read_promotions, 4u);
  EXPECT_EQ(engine_->stats().after_read_given_up, 0u);
  ExpectChainHolds(c, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, PromoteOnReleaseDemotesColderBlocksAndPromotesWhenTheyLand) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);  // The GPU tier is full.
  auto lease = Get("a", a, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 4u) << "b's demotion, started at release";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());  // b lands in the host tier, then a is promoted.
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 4));
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 4));
  EXPECT_EQ(engine_->stats().after_read_promotions, 4u) << "once b's demotion landed";
  EXPECT_TRUE(freed_.empty()) << "nothing lost";
  ExpectChainHolds(a, 4);
  ExpectChainHolds(b, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, PromoteOnReleaseLeavesBlocksWhereTheyAreWithoutRoomOrASession) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4), d = MakeChain(3, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);
  auto hold = Get("", b);  // All of the GPU tier pinned: no room can come.
  ASSERT_TRUE(hold.ok());
  auto lease = Get("a", a, /*promote=*/false);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(lease->id).ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ASSERT_TRUE(engine_->Release(hold->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4)) << "given up when no room was coming";
  EXPECT_EQ(engine_->stats().after_read_given_up, 4u);
  EXPECT_EQ(engine_->stats().after_read_promotions, 0u);
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 4));

  // A block no session holds any more is freed with the lease, not promoted.
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("d", d));
  auto read = Get("", d, /*promote=*/false);
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(engine_->PromoteOnRelease(read->id).ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "d").ok());
  ASSERT_TRUE(engine_->Release(read->id).ok());
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  EXPECT_EQ(freed_.size(), 6u) << "b's four blocks and d's two";
  ExpectConsistent();

  // Only a read lease can be marked.
  EXPECT_EQ(engine_->PromoteOnRelease(read->id).code(), StatusCode::kNotFound);
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(engine_->PromoteOnRelease(w->id).code(), StatusCode::kNotFound);
  ASSERT_TRUE(engine_->Release(w->id).ok());
}

TEST_F(EngineTest, PrefetchPromotesASession) {
  Start(Options(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("s", c);
  EXPECT_EQ(*engine_->Prefetch(tenant_, "s"), 0u) << "already in the GPU tier";
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  EXPECT_EQ(*engine_->Demote(tenant_, "s"), 0u) << "already moving";
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  const uint64_t before = engine_->GetSession(tenant_, "s")->last_use;
  auto n = engine_->Prefetch(tenant_, "s");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(*engine_->Prefetch(tenant_, "s"), 0u) << "already moving";
  EXPECT_GT(engine_->GetSession(tenant_, "s")->last_use, before) << "prefetch counts as a use";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().promoted_blocks, 3u);
  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, PromotionStopsWhenTheGpuTierIsFull) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);
  auto hold = Get("", b);  // Pin all of the GPU tier.
  ASSERT_TRUE(hold.ok());
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_TRUE(lease->blocks.empty()) << "no room to promote the first block";
  EXPECT_EQ(lease->id, 0u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(hold->id).ok());

  // Unpinned, b is colder than a (a was just acquired): b is demoted to make
  // room, and all of a is promoted. Nothing is lost.
  lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  ASSERT_EQ(lease->blocks.size(), 4u);
  EXPECT_EQ(lease->promoted, 4u);
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 4));
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 4));
  ExpectConsistent();
}

TEST_F(EngineTest, PromotionStopsWhereTheGpuTierCannotMakeRoom) {
  Start(Options(4, 8));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);
  const Chain b2{std::vector<TokenId>(b.tokens.begin(), b.tokens.begin() + 2 * kBt),
                 std::vector<BlockKey>(b.keys.begin(), b.keys.begin() + 2)};
  auto hold = Get("", b2);  // Pin half of the GPU tier.
  ASSERT_TRUE(hold.ok());
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 4u);
  ASSERT_EQ(lease->blocks.size(), 2u) << "two GPU slots could be freed, not four";
  EXPECT_EQ(lease->promoted, 2u);
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->Release(hold->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(freed_.empty());
  ExpectConsistent();
}

// Regression (found by the chaos soak): making GPU room for a promotion may drop
// host-tier blocks of the coldest sessions, and those must not be the very blocks
// the acquire is about to lease. Here the prefix is only in the host tier, held
// by the coldest session, and the host tier is full.
TEST_F(EngineTest, MakingRoomForAPromotionNeverDropsThePrefixBeingAcquired) {
  Start(Options(4, 4));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  Put("b", b);  // Both tiers full; "a" is the coldest session.
  auto lease = Get("", a);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_INVARIANTS();
  ExpectLeaseHolds(*lease, a);
  if (lease->id != 0) {
    ASSERT_TRUE(engine_->Release(lease->id).ok());
  }
  EXPECT_FALSE(WasFreed(a.keys[0], true)) << "the prefix being acquired was dropped";
  EXPECT_EQ(Matched(a), 4u);
  ExpectChainHolds(a, 4);
  ExpectChainHolds(b, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, DemoteMakesRoomInTheHostTierByDroppingColderBlocks) {
  Start(Options(8, 4));
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // b needs 3 host slots, 1 is free: the coldest host blocks (a's tail) make room.
  ASSERT_EQ(*engine_->Demote(tenant_, "b"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 3));
  EXPECT_EQ(Matched(a), 1u);
  EXPECT_TRUE(WasFreed(a.keys[2], true));
  EXPECT_TRUE(WasFreed(a.keys[1], true));
  EXPECT_EQ(engine_->stats().dropped_blocks, 2u);
  ExpectChainHolds(b, 3);
  ExpectChainHolds(a, 1);
  ExpectConsistent();
}

// --- Watermarks -------------------------------------------------------------------

class WatermarkTest : public EngineTest {
 protected:
  // 10 GPU slots: above 8 used, demote down to 5.
  void StartGpuPressure() {
    EngineOptions o = Options(10, 32);
    o.gpu_high_watermark = 0.8;
    o.gpu_low_watermark = 0.5;
    Start(o);
  }
  std::vector<Tier> Mixed(size_t host, size_t gpu) {
    std::vector<Tier> v(host, Tier::kHost);
    v.insert(v.end(), gpu, Tier::kGpu);
    return v;
  }
};

TEST_F(WatermarkTest, TickDemotesTheLeastRecentlyUsedSessionFirst) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3), c = MakeChain(3, 2), d = MakeChain(4, 1);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  engine_->Tick();
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u) << "8 of 10 is not above the high watermark";
  auto use = Get("a", a);  // a becomes the warmest: b, c, a.
  ASSERT_TRUE(use.ok());
  ASSERT_TRUE(engine_->Release(use->id).ok());
  Put("d", d);  // 9 of 10.
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("b"), All(Tier::kHost, 3));
  EXPECT_EQ(Tiers("c"), Mixed(1, 1));
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 3));
  EXPECT_EQ(Tiers("d"), All(Tier::kGpu, 1));
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 5u) << "down to the low watermark";
  EXPECT_EQ(st.demoted_blocks, 4u);
  EXPECT_EQ(st.dropped_blocks, 0u);
  engine_->Tick();
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ExpectChainHolds(b, 3);
  ExpectChainHolds(c, 2);
  ExpectConsistent();
}

TEST_F(WatermarkTest, LowerPriorityIsDemotedBeforeHigher) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3), c = MakeChain(3, 2), d = MakeChain(4, 1);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  ASSERT_TRUE(engine_->SetPriority(tenant_, "a", 3).ok());
  ASSERT_TRUE(engine_->SetPriority(tenant_, "b", 3).ok());
  Put("d", d);
  // Coldest first: priority 0 (c, d), then priority 3 (a, b).
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("c"), All(Tier::kHost, 2));
  EXPECT_EQ(Tiers("d"), All(Tier::kHost, 1));
  EXPECT_EQ(Tiers("a"), Mixed(1, 2));
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->GetSession(tenant_, "a")->priority, 3);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  ExpectConsistent();
}

TEST_F(WatermarkTest, RetuneAppliesNewWatermarksFromTheNextTick) {
  Start(Options(10, 32));  // Watermarks at 1.0: no pressure.
  const Chain a = MakeChain(1, 5), b = MakeChain(2, 4);
  Put("a", a);
  Put("b", b);
  engine_->Tick();
  EXPECT_EQ(engine_->stats().copies_in_flight + engine_->stats().demoted_blocks, 0u);

  EngineOptions bad = engine_->options();
  bad.gpu_high_watermark = 0.5;
  bad.gpu_low_watermark = 0.6;
  EXPECT_EQ(engine_->Retune(bad).code(), StatusCode::kInvalidArgument);
  bad = engine_->options();
  bad.max_copy_batch = 0;
  EXPECT_EQ(engine_->Retune(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->options().gpu_high_watermark, 1.0) << "a rejected retune changes nothing";

  EngineOptions o = engine_->options();
  o.gpu_high_watermark = 0.8;
  o.gpu_low_watermark = 0.5;
  o.max_copy_batch = 2;
  o.gpu_slots = 99;  // Not tunable: ignored.
  ASSERT_TRUE(engine_->Retune(o).ok());
  EXPECT_EQ(engine_->options().gpu_low_watermark, 0.5);
  EXPECT_EQ(engine_->options().max_copy_batch, 2u);
  EXPECT_EQ(engine_->options().gpu_slots, 10u);
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u) << "9 of 10 is above the new high watermark: down to 5";
  EXPECT_EQ(Tiers("a"), Mixed(4, 1));
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 4));
  EXPECT_EQ(backend_->copy_stats(CopyDirection::kGpuToHost).batches, 2u) << "4 blocks in batches of 2";
  ExpectConsistent();
}

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

TEST_F(WatermarkTest, LeasedSessionsAreSkipped) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 5);
  Put("a", a);
  Put("b", b);
  auto pin = Get("", a);
  ASSERT_TRUE(pin.ok());
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 4));
  EXPECT_EQ(Tiers("b"), Mixed(4, 1));
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

TEST_F(WatermarkTest, BlocksReadWithoutASessionStillCoolDown) {
  StartGpuPressure();
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 3), c = MakeChain(3, 2);
  Put("a", a);
  // A reader without a session name (a scheduler, say) reads a's blocks once.
  auto peek = Get("", a);
  ASSERT_TRUE(peek.ok());
  ASSERT_TRUE(engine_->Release(peek->id).ok());
  Put("b", b);
  Put("c", c);  // 9 of 10: demote 4.
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // a was used least recently, by its session and by the reader alike.
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  EXPECT_EQ(Tiers("b"), All(Tier::kGpu, 3));
  EXPECT_EQ(Tiers("c"), All(Tier::kGpu, 2));
  ExpectConsistent();
}

TEST_F(WatermarkTest, ASharedPrefixIsDemotedWithItsWarmestSession) {
  StartGpuPressure();
  const Chain system = MakeChain(100, 2);
  const Chain a = MakeChain(1, 2, &system);
  const Chain b = MakeChain(2, 2, &system);
  const Chain c = MakeChain(3, 3);
  Put("a", a);
  Put("b", b, 0);  // Shares the system prompt (duplicates), warmer than a.
  Put("c", c);     // 2 + 2 + 2 + 3 = 9 of 10: demote 4.
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // Walking coldest first: a's own 2 blocks, then b's (the system prompt was used by b
  // after a's last use, so it goes with b).
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  EXPECT_EQ(Tiers("b"), Mixed(2, 2));
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  EXPECT_EQ(Tiers("c"), All(Tier::kGpu, 3));
  ExpectChainHolds(a, 4);
  ExpectChainHolds(b, 4);
  ExpectConsistent();
}

TEST_F(WatermarkTest, BlocksLastUsedByAnEvictedSessionCanStillBeDemoted) {
  StartGpuPressure();
  const Chain system = MakeChain(100, 4);
  const Chain a = MakeChain(1, 1, &system);
  const Chain b = MakeChain(2, 1, &system);
  Put("a", a);
  Put("b", b);  // Uses the system prompt after a did.
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  const Chain c = MakeChain(3, 5);
  Put("c", c);  // 10 of 10.
  auto pin = Get("", c);
  ASSERT_TRUE(pin.ok());
  engine_->Tick();
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  // Only a's blocks can move; the system prompt is now a's alone, however recently
  // b used it, so all of a goes and usage is back at the low watermark.
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 5));
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 5u);
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

TEST_F(WatermarkTest, HostPressureDropsTheColdestSessions) {
  EngineOptions o = Options(16, 8);
  o.host_high_watermark = 0.75;  // Above 6 of 8, drop down to 4.
  o.host_low_watermark = 0.5;
  Start(o);
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3), c = MakeChain(3, 2);
  Put("a", a);
  Put("b", b);
  Put("c", c);
  for (const char* s : {"a", "b"}) ASSERT_GT(*engine_->Demote(tenant_, s), 0u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  engine_->Tick();
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 6u) << "6 of 8 is not above the high watermark";
  EXPECT_TRUE(freed_.empty());
  ASSERT_EQ(*engine_->Demote(tenant_, "c"), 2u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  engine_->Tick();
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kHost], 4u);
  EXPECT_EQ(st.dropped_blocks, 4u);
  EXPECT_EQ(FreedCount(true), 4u);
  EXPECT_EQ(FreedCount(false), 0u);
  for (const BlockKey& k : a.keys) EXPECT_TRUE(WasFreed(k, true));
  EXPECT_TRUE(WasFreed(b.keys[2], true)) << "then the tail of the next coldest";
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound) << "an emptied session goes";
  EXPECT_EQ(Matched(a), 0u);
  EXPECT_EQ(Matched(b), 2u);
  EXPECT_EQ(Matched(c), 2u);
  ExpectChainHolds(b, 2);
  ExpectChainHolds(c, 2);
  ExpectConsistent();
}

// --- Full pools ---------------------------------------------------------------------

TEST_F(EngineTest, FullPoolsWithEverythingLeasedRefuseAllocationAndLoseNothing) {
  Start(Options(4, 4));
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  auto pin = Get("", a);
  ASSERT_TRUE(pin.ok());
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("gpu tier full"), std::string::npos) << w.status().ToString();
  EXPECT_NE(w.status().message().find("0 of 4 slots free"), std::string::npos) << w.status().ToString();
  EXPECT_EQ(engine_->stats().allocation_failures, 1u);
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(Matched(a), 4u);
  ExpectLeaseHolds(*pin, a);
  ExpectConsistent();

  // Write leases hold slots the same way.
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  auto w1 = engine_->Allocate(tenant_, 4);  // Demotes all of a (coldest, unleased) to the host tier.
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  auto w2 = engine_->Allocate(tenant_, 1);
  EXPECT_EQ(w2.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->stats().allocation_failures, 2u);
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w1->id).ok());
  EXPECT_TRUE(engine_->Allocate(tenant_, 4).ok());
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, AllocateLargerThanTheTierIsRefused) {
  Start(Options(4, 4));
  auto w = engine_->Allocate(tenant_, 5);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("4 slots"), std::string::npos) << w.status().ToString();
}

TEST_F(EngineTest, AllocateDemotesColdestBlocksBeforeDroppingAny) {
  Start(Options(6, 4));
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(freed_.empty()) << "the host tier had room: nothing may be lost";
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(Matched(a), 3u);
  EXPECT_EQ(Matched(b), 3u);
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->blocks_in[Tier::kHost], 2u) << "the coldest session made the room";
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, TryAllocateNeverWaitsAndSucceedsOnceTheDemotionsLand) {
  Start(Options(6, 4), /*manual=*/true);
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  const int waits = manual_->wait_calls;
  auto pending = engine_->TryAllocate(tenant_, 2);
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  EXPECT_FALSE(pending->has_value()) << "the GPU tier is full; demotions of a were scheduled, not waited for";
  EXPECT_EQ(manual_->wait_calls, waits) << "TryAllocate must not wait on a fence";
  EXPECT_EQ(manual_->queued_ops(), 2u) << "the coldest session's blocks are being demoted";
  // Asking again before the copies land schedules nothing more.
  auto again = engine_->TryAllocate(tenant_, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ(manual_->queued_ops(), 2u);
  manual_->RunAll();
  auto w = engine_->TryAllocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->has_value());
  EXPECT_EQ((*w)->slots.size(), 2u);
  EXPECT_TRUE(freed_.empty()) << "room came from demotion: nothing was lost";
  EXPECT_EQ(Matched(a), 3u);
  ASSERT_TRUE(engine_->Release((*w)->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, TryAllocateThatMayNotWaitFailsWithoutLosingLeasedBlocks) {
  Start(Options(4, 4), /*manual=*/true);
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  auto pin = Get("", a);  // Nothing can be demoted or dropped.
  ASSERT_TRUE(pin.ok());
  auto r = engine_->TryAllocate(tenant_, 1);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << "no copy in flight: nothing to wait for";
  r = engine_->TryAllocate(tenant_, 1, /*may_wait=*/false);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(freed_.empty());
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, AcquireNeedsRoomWhileDemotionsForItsPromotionsAreInFlight) {
  Start(Options(4, 8), /*manual=*/true);
  manual_->complete_on_wait = true;
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 4);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 4u);
  manual_->RunAll();
  engine_->Poll();
  Put("b", b);  // The GPU tier is full of b; a is in the host tier.
  manual_->complete_on_wait = false;
  EXPECT_TRUE(engine_->AcquireNeedsRoom(ns_, a.keys, a.tokens)) << "b's demotion must land first";
  EXPECT_EQ(manual_->queued_ops(), 4u) << "b is being demoted to make the room";
  EXPECT_FALSE(engine_->GetSession(tenant_, "a")->blocks_in[Tier::kGpu]) << "no effect on a";
  manual_->RunAll();
  EXPECT_FALSE(engine_->AcquireNeedsRoom(ns_, a.keys, a.tokens)) << "the room is there now";
  const int waits = manual_->wait_calls;
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(manual_->wait_calls, waits) << "Acquire found the room: it did not wait";
  ASSERT_EQ(lease->blocks.size(), 4u);
  EXPECT_EQ(lease->promoted, 4u);
  manual_->RunAll();
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_TRUE(freed_.empty());
  ExpectConsistent();
}

TEST_F(EngineTest, AllocateDropsColdestUnleasedBlocksAsALastResort) {
  Start(Options(6, 4));
  // Fill the host tier with blocks a reader holds, so nothing can be demoted.
  const Chain h = MakeChain(9, 4);
  Put("h", h);
  ASSERT_EQ(*engine_->Demote(tenant_, "h"), 4u);
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(5)).ok());
  auto pin = Get("", h, /*promote=*/false);
  ASSERT_TRUE(pin.ok());
  const Chain a = MakeChain(1, 3), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(WasFreed(a.keys[2], true));
  EXPECT_TRUE(WasFreed(a.keys[1], true));
  EXPECT_EQ(Matched(a), 1u) << "the coldest session loses its tail first";
  EXPECT_EQ(Matched(b), 3u);
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, FailedAllocateDropsNothing) {
  // Two GPU slots are pinned by a reader, two hold an unleased session. Asking for
  // three cannot succeed: the unleased blocks must not be thrown away for nothing.
  Start(Options(4, 4));
  const Chain a = MakeChain(1, 2), b = MakeChain(2, 2);
  Put("a", a);
  Put("b", b);
  auto pin = Get("", b);
  ASSERT_TRUE(pin.ok());
  auto w = engine_->Allocate(tenant_, 3);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(freed_.empty()) << "blocks were dropped by an allocation that failed anyway";
  EXPECT_EQ(Matched(a), 2u);
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  ASSERT_TRUE(engine_->Release(pin->id).ok());
  ExpectConsistent();
}

// --- With copies held in flight -------------------------------------------------------

TEST_F(EngineTest, AllocateWaitsForInFlightDemotionsInsteadOfDropping) {
  Start(Options(4, 8), /*manual=*/true);
  manual_->complete_on_wait = true;
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 4u);
  EXPECT_EQ(engine_->stats().copies_in_flight, 4u);
  EXPECT_EQ(manual_->queued_ops(), 4u);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_GE(manual_->wait_calls, 1);
  EXPECT_TRUE(freed_.empty());
  EXPECT_EQ(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectChainHolds(a, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, AllocateNeverDropsMovingBlocks) {
  Start(Options(4, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 4);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 4u);
  // The copies do not finish: the blocks are neither free nor droppable.
  auto w = engine_->Allocate(tenant_, 2);
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(freed_.empty());
  EXPECT_INVARIANTS();
  manual_->RunAll();
  w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(freed_.empty());
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectChainHolds(a, 4);
  ExpectConsistent();
}

TEST_F(EngineTest, MovingBlocksStayReadableInTheirSourceTier) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 2);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->moving, 2u);
  EXPECT_EQ(info->tiers, All(Tier::kGpu, 2));
  IndexEntry e;
  ASSERT_TRUE(view_.Find(a.keys[0], BlockKey{}, NamespaceTag(ns_), a.block(0), &e));
  EXPECT_EQ(e.tier, Tier::kGpu);
  EXPECT_TRUE(e.moving) << "clients see the copy in flight";
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 2u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 2u) << "a moving block holds a slot in each tier";
  EXPECT_EQ(engine_->Poll(), 0u);
  ExpectChainHolds(a, 2);  // Read at the source while the copy is pending.
  EXPECT_INVARIANTS();
  manual_->RunAll();
  EXPECT_EQ(engine_->Poll(), 2u);
  ASSERT_TRUE(view_.Find(a.keys[0], BlockKey{}, NamespaceTag(ns_), a.block(0), &e));
  EXPECT_EQ(e.tier, Tier::kHost);
  EXPECT_FALSE(e.moving);
  ExpectConsistent();
}

TEST_F(EngineTest, ALeaseTakenDuringDemotionKeepsTheBlockInTheGpuTier) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 3);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 3u);
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 0u);
  EXPECT_TRUE(lease->fence.IsNull());
  for (const BlockLocation& loc : lease->blocks) EXPECT_EQ(loc.tier, Tier::kGpu);
  ExpectLeaseHolds(*lease, a);
  manual_->RunAll();
  engine_->Poll();
  // The demotion landed, but the block was leased meanwhile: the GPU copy stays.
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(engine_->stats().demoted_blocks, 0u);
  ExpectLeaseHolds(*lease, a);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
  // Once released, it can be demoted again.
  EXPECT_EQ(*engine_->Demote(tenant_, "a"), 3u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 3));
  ExpectConsistent();
}

TEST_F(EngineTest, EvictDuringDemotionFreesBothSlotsWhenTheCopyLands) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 2);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(FreedCount(false), 2u);
  EXPECT_EQ(Matched(a), 0u) << "gone from the index at once";
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 2u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 2u);
  EXPECT_INVARIANTS();
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_INVARIANTS();
  // The same blocks can be cached again.
  Put("a", a);
  ExpectChainHolds(a, 2);
  ExpectConsistent();
}

TEST_F(EngineTest, EvictDuringPromotionFreesBothSlotsWhenTheCopyLands) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 2);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
  manual_->RunAll();
  engine_->Poll();
  ASSERT_EQ(*engine_->Prefetch(tenant_, "a"), 2u);
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(FreedCount(false), 2u);
  EXPECT_INVARIANTS();
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineTest, AcquireJoinsAPromotionAlreadyInFlight) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 2);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
  manual_->RunAll();
  engine_->Poll();
  ASSERT_EQ(*engine_->Prefetch(tenant_, "a"), 2u);
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->promoted, 2u);
  EXPECT_FALSE(lease->fence.IsNull()) << "the lease waits for the prefetch's copy";
  EXPECT_FALSE(backend_->IsComplete(lease->fence));
  manual_->RunAll();
  ExpectLeaseHolds(*lease, a);
  engine_->Poll();
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, RefusedCopiesLeaveBlocksWhereTheyAre) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 3);
  Put("a", a);
  manual_->refuse_submits = 1;
  ASSERT_TRUE(engine_->Demote(tenant_, "a").ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kGpu, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(engine_->stats().copies_in_flight, 0u);
  ExpectConsistent();
  ExpectChainHolds(a, 3);

  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 3u);
  manual_->RunAll();
  engine_->Poll();
  ASSERT_EQ(Tiers("a"), All(Tier::kHost, 3));
  manual_->refuse_submits = 1;
  ASSERT_TRUE(engine_->Prefetch(tenant_, "a").ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 3));
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  ExpectConsistent();
}

TEST_F(EngineTest, ARefusedPromotionLeasesTheBlocksWhereTheyAre) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 3);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 3u);
  manual_->RunAll();
  engine_->Poll();
  manual_->refuse_submits = 1;
  auto lease = Get("a", a);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 3u);
  ASSERT_EQ(lease->blocks.size(), 3u);
  EXPECT_EQ(lease->promoted, 0u) << "nothing is being promoted";
  for (const BlockLocation& loc : lease->blocks) {
    EXPECT_EQ(loc.tier, Tier::kHost) << "the lease must not point at a GPU slot that holds nothing";
  }
  ExpectLeaseHolds(*lease, a);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ExpectConsistent();
}

TEST_F(EngineTest, WaitIdleTimesOutWhileCopiesAreStuck) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 2);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
  EXPECT_EQ(engine_->WaitIdle(milliseconds(1)).code(), StatusCode::kTimeout);
  manual_->RunAll();
  EXPECT_TRUE(engine_->WaitIdle(milliseconds(1)).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 2));
}

TEST_F(EngineTest, CopiesAreBatchedByMaxCopyBatch) {
  EngineOptions o = Options(16, 16);
  o.max_copy_batch = 3;
  Start(o, /*manual=*/true);
  const Chain a = MakeChain(1, 8);
  Put("a", a);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 8u);
  EXPECT_EQ(engine_->stats().copies_in_flight, 8u);
  // Batches of 3, 3, 2 land one at a time, in order.
  manual_->complete_on_wait = true;
  ASSERT_TRUE(manual_->Wait(Fence{1, CopyDirection::kGpuToHost}, milliseconds(0)).ok());
  EXPECT_EQ(engine_->Poll(), 3u);
  ASSERT_TRUE(manual_->Wait(Fence{2, CopyDirection::kGpuToHost}, milliseconds(0)).ok());
  EXPECT_EQ(engine_->Poll(), 3u);
  EXPECT_FALSE(manual_->IsComplete(Fence{3, CopyDirection::kGpuToHost}));
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 8));
  ExpectChainHolds(a, 8);
  ExpectConsistent();
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


// --- Per-tenant quotas ---------------------------------------------------------

class EngineQuotaTest : public EngineTest {
 protected:
  EngineOptions QuotaOptions(uint32_t gpu_quota, uint32_t host_quota) {
    EngineOptions o = Options(32, 32);
    TenantQuota q;
    q.tenant = tenant_;
    q.blocks[Tier::kGpu] = gpu_quota;
    q.blocks[Tier::kHost] = host_quota;
    o.quotas.push_back(q);
    return o;
  }
  // Commits `blocks` fresh blocks of the other tenant (no quota) under `session`.
  void PutOther(const std::string& session, uint32_t seed, uint32_t blocks) {
    std::vector<TokenId> tokens(blocks * kBt);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 100003u + static_cast<TokenId>(i);
    auto w = engine_->Allocate(other_, blocks);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto r = engine_->Commit(w->id, other_, session, BlockKey{}, 0, tokens, w->slots);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(engine_->Release(w->id).ok());
  }
  uint32_t Usage(const Namespace& ns, Tier t) { return engine_->tenant_usage(ns).blocks[t]; }
  const Tenant other_ = Tenant::Make(TestProfile().Fingerprint(), "other tenant");
};

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


// --- Lease lifetimes -----------------------------------------------------------

constexpr milliseconds kLeaseTimeout{1000};

EngineOptions WithLeaseTimeout(EngineOptions o) {
  o.lease_timeout = kLeaseTimeout;
  return o;
}

std::chrono::steady_clock::time_point Later(milliseconds by) { return std::chrono::steady_clock::now() + by; }

// A write lease older than the timeout is revoked: its slots go back to the
// pool (and off its tenant's quota), its commit fails with a clear error, and
// its release says it expired, once.
TEST_F(EngineQuotaTest, AnExpiredWriteLeaseGivesItsSlotsBackAndItsCommitFails) {
  Start(WithLeaseTimeout(QuotaOptions(4, 0)));
  auto w = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const Chain c = MakeChain(1, 4);
  for (uint32_t i = 0; i < 4; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
  EXPECT_EQ(engine_->ExpireLeases(std::chrono::steady_clock::now()).leases(), 0u) << "not old enough";
  EXPECT_FALSE(engine_->Allocate(tenant_, 1).ok()) << "the quota is full of leased slots";

  const LeaseExpiry expired = engine_->ExpireLeases(Later(kLeaseTimeout));
  EXPECT_EQ(expired.write, 1u);
  EXPECT_EQ(expired.read, 0u);
  EXPECT_EQ(expired.slots, 4u);
  EXPECT_FALSE(expired.more);
  EXPECT_TRUE(engine_->LeaseExpired(w->id));
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.used[Tier::kGpu], 0u) << "the slots are free again";
  EXPECT_EQ(st.write_leases, 0u);
  EXPECT_EQ(st.leased_slots, 0u);
  EXPECT_EQ(st.expired_write_leases, 1u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  EXPECT_INVARIANTS();

  // The slots now belong to a new lease, which writes and commits its own blocks.
  const Chain mine = MakeChain(2, 4);
  Put("other-writer", mine);
  auto r = engine_->Commit(w->id, tenant_, "late", BlockKey{}, 0, c.tokens, w->slots);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("write lease " + std::to_string(w->id) + " expired after"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("limits.lease_timeout_ms: 1000"), std::string::npos) << r.status().message();
  EXPECT_EQ(Matched(c), 0u) << "nothing of the expired lease was published";
  ExpectChainHolds(mine, 4);
  EXPECT_EQ(engine_->GetSession(tenant_, "late").status().code(), StatusCode::kNotFound);

  const Status released = engine_->Release(w->id);
  EXPECT_EQ(released.code(), StatusCode::kNotFound);
  EXPECT_NE(released.message().find("expired"), std::string::npos) << released.message();
  EXPECT_FALSE(engine_->LeaseExpired(w->id)) << "released: forgotten";
  const Status again = engine_->Release(w->id);
  EXPECT_NE(again.message().find("does not exist"), std::string::npos) << again.message();
  ExpectConsistent();
}

// A read lease older than the timeout is revoked: its pins end, so its blocks
// may be demoted, and freed once no session holds them.
TEST_F(EngineTest, AnExpiredReadLeaseUnpinsItsBlocks) {
  Start(WithLeaseTimeout(Options(8, 8)));
  const Chain a = MakeChain(1, 4), b = MakeChain(2, 3);
  Put("a", a);
  Put("b", b);
  auto la = Get("", a);
  auto lb = Get("", b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(engine_->Demote(tenant_, "a").value(), 0u) << "leased blocks never move";
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  EXPECT_EQ(Matched(b), 3u) << "the lease still holds b's blocks";

  const LeaseExpiry expired = engine_->ExpireLeases(Later(kLeaseTimeout));
  EXPECT_EQ(expired.read, 2u);
  EXPECT_EQ(expired.records, 7u);
  EXPECT_EQ(engine_->stats().read_leases, 0u);
  EXPECT_EQ(engine_->stats().expired_read_leases, 2u);
  EXPECT_EQ(Matched(b), 0u) << "no one held b's blocks any more";
  EXPECT_EQ(FreedCount(false), 3u);
  EXPECT_EQ(FreedCount(true), 0u) << "released, not dropped";
  EXPECT_EQ(engine_->Demote(tenant_, "a").value(), 4u) << "unpinned, a's blocks may move";
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 4));
  ExpectChainHolds(a, 4);

  const Status released = engine_->Release(la->id);
  EXPECT_EQ(released.code(), StatusCode::kNotFound);
  EXPECT_NE(released.message().find("read lease " + std::to_string(la->id) + " expired after"), std::string::npos)
      << released.message();
  EXPECT_NE(released.message().find("may be another block's"), std::string::npos) << released.message();
  EXPECT_TRUE(engine_->LeaseExpired(lb->id));
  ExpectConsistent();
}

// Leases expire oldest first; one that is younger than the timeout stays. The
// timeout may change (Retune): 0 means never.
TEST_F(EngineTest, LeasesExpireOldestFirstAndTheTimeoutMayChange) {
  Start(Options(8, 8));
  auto old_lease = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(old_lease.ok());
  std::this_thread::sleep_for(milliseconds(5));
  const auto between = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(milliseconds(5));
  auto young = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(young.ok());
  EXPECT_GE(engine_->stats().oldest_lease_ms, 10u);
  EXPECT_EQ(engine_->ExpireLeases(Later(std::chrono::hours(24 * 365))).leases(), 0u) << "no timeout: never";

  EngineOptions o = engine_->options();
  o.lease_timeout = kLeaseTimeout;
  ASSERT_TRUE(engine_->Retune(o).ok());
  const LeaseExpiry first = engine_->ExpireLeases(between + kLeaseTimeout);
  EXPECT_EQ(first.write, 1u);
  EXPECT_TRUE(engine_->LeaseExpired(old_lease->id));
  EXPECT_FALSE(engine_->LeaseExpired(young->id));
  EXPECT_EQ(engine_->stats().write_leases, 1u);
  EXPECT_LT(engine_->stats().oldest_lease_ms, 10'000u) << "the young lease is the oldest now";
  EXPECT_EQ(engine_->ExpireLeases(Later(kLeaseTimeout)).write, 1u);
  EXPECT_EQ(engine_->stats().oldest_lease_ms, 0u) << "none is held";
  o.lease_timeout = milliseconds(-1);
  EXPECT_EQ(engine_->Retune(o).code(), StatusCode::kInvalidArgument);
  EXPECT_INVARIANTS();
}

// One call gives back about kLeaseExpiryWork slots at most; the rest wait for
// the next call (the daemon's next tick), so a tick never stalls on a backlog.
TEST_F(EngineTest, LeaseExpiryIsBoundedPerCall) {
  constexpr uint32_t kPerLease = kLeaseExpiryWork / 2;
  Start(WithLeaseTimeout(Options(4 * kPerLease, 8)));
  std::vector<LeaseId> ids;
  for (int i = 0; i < 4; ++i) {
    auto w = engine_->Allocate(tenant_, kPerLease);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ids.push_back(w->id);
  }
  const auto when = Later(kLeaseTimeout);
  const LeaseExpiry first = engine_->ExpireLeases(when);
  EXPECT_EQ(first.write, 2u);
  EXPECT_EQ(first.slots, 2 * kPerLease);
  EXPECT_TRUE(first.more);
  EXPECT_TRUE(engine_->LeaseExpired(ids[0]) && engine_->LeaseExpired(ids[1]));
  EXPECT_FALSE(engine_->LeaseExpired(ids[2]) || engine_->LeaseExpired(ids[3]));
  EXPECT_INVARIANTS();
  const LeaseExpiry second = engine_->ExpireLeases(when);
  EXPECT_EQ(second.write, 2u);
  EXPECT_FALSE(second.more);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  for (LeaseId id : ids) EXPECT_EQ(engine_->Release(id).code(), StatusCode::kNotFound);
  EXPECT_INVARIANTS();
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

// --- Clients' GPU work: nothing is reused, served or moved before it is done ------

class EngineGpuWorkTest : public EngineTest {
 protected:
  // The work of client `client` ending in emulated event `event`.
  GpuWork Work(uint8_t event, uint64_t client = 7) {
    wire::IpcEventHandle h{};
    h[0] = event;
    auto w = manual_->WatchClientEvent(client, h);
    EXPECT_TRUE(w.ok());
    return GpuWork{w.ok() ? *w : 0, client};
  }
  void Finish(uint8_t event, Backend::WorkState state = Backend::WorkState::kDone) { manual_->events[event] = state; }

  // Writes `c` into a fresh write lease and commits it with writer work `writer`.
  WriteLease Written(const std::string& session, const Chain& c, GpuWork writer) {
    auto w = engine_->Allocate(tenant_, c.blocks());
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return {};
    for (uint32_t i = 0; i < c.blocks(); ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
    auto r = engine_->Commit(w->id, tenant_, session, BlockKey{}, 0, c.tokens, w->slots, writer);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *w;
  }
};

// A write lease released with work still running keeps its slots until the
// work is done: they are not handed to the next writer before.
TEST_F(EngineGpuWorkTest, ReleasedWriteSlotsAreReusedOnlyAfterTheWork) {
  Start(Options(4, 4), /*manual=*/true);
  auto w = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(engine_->Release(w->id, Work(1)).ok());
  EXPECT_EQ(engine_->stats().write_leases, 0u) << "gone for its holder";
  EXPECT_EQ(engine_->stats().gpu_work_pending, 1u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 4u) << "the slots wait for the work";
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 4u) << "and stay on the tenant's count";
  EXPECT_EQ(engine_->Allocate(tenant_, 1).status().code(), StatusCode::kResourceExhausted);
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 4u);
  EXPECT_INVARIANTS();

  Finish(1);
  EXPECT_EQ(engine_->Poll(), 4u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().gpu_work_pending, 0u);
  EXPECT_EQ(engine_->tenant_usage(ns_).leased, 0u);
  EXPECT_EQ(manual_->open_watches(), 0u) << "the watch ended with the work";
  EXPECT_TRUE(engine_->Allocate(tenant_, 4).ok());
  EXPECT_INVARIANTS();
}

// A read lease released with work still reading keeps its blocks pinned: an
// evicted session's blocks are freed, and others demoted, only after it.
TEST_F(EngineGpuWorkTest, ReleasedReadLeasePinsItsBlocksUntilTheWork) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain a = MakeChain(1, 3);
  Put("a", a);
  auto lease = Get("", a);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id, Work(2)).ok());
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  EXPECT_EQ(FreedCount(false), 0u) << "still read by the client's GPU";
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u);
  EXPECT_INVARIANTS();
  Finish(2);
  engine_->Poll();
  EXPECT_EQ(FreedCount(false), 3u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(manual_->open_watches(), 0u);
  EXPECT_INVARIANTS();

  // Pinned blocks are not demoted either.
  Put("b", MakeChain(2, 2));
  auto lb = Get("b", MakeChain(2, 2));
  ASSERT_TRUE(lb.ok());
  ASSERT_TRUE(engine_->Release(lb->id, Work(3)).ok());
  EXPECT_EQ(engine_->Demote(tenant_, "b").value(), 0u);
  Finish(3);
  engine_->Poll();
  EXPECT_EQ(engine_->Demote(tenant_, "b").value(), 2u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_INVARIANTS();
}

// Blocks committed with their writer's work still running are neither served
// nor demoted, and a duplicate's slot is not reused, until the work is done.
TEST_F(EngineGpuWorkTest, CommittedBlocksWaitForTheirWriter) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain c = MakeChain(1, 3);
  WriteLease w = Written("s", c, Work(4));
  EXPECT_EQ(engine_->GetSession(tenant_, "s")->blocks, 3u) << "committed at once";
  auto early = Get("", c);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->matched, 0u) << "not served while the writer may still write";
  EXPECT_EQ(engine_->Demote(tenant_, "s").value(), 0u) << "not copied to the host tier either";
  // A second writer of the same blocks: duplicates, whose slots wait for it.
  auto w2 = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w2.ok());
  auto dup = engine_->Commit(w2->id, tenant_, "t", BlockKey{}, 0, c.tokens, w2->slots, Work(5));
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(dup->duplicates, 3u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 6u);
  EXPECT_INVARIANTS();

  Finish(5);
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u) << "the duplicates' slots are free";
  EXPECT_EQ(Get("", c)->matched, 0u) << "the first writer is still at it";
  Finish(4);
  auto late = Get("", c);  // Acquire sees the work done itself, without a Poll.
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->matched, 3u);
  ExpectLeaseHolds(*late, c);
  ASSERT_TRUE(engine_->Release(late->id).ok());
  EXPECT_EQ(engine_->Demote(tenant_, "s").value(), 3u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(manual_->open_watches(), 0u);
  ExpectConsistent();
  ASSERT_TRUE(engine_->Release(w.id).ok());
  ASSERT_TRUE(engine_->Release(w2->id).ok());
}

// A writer that goes away (or whose event fails) before its work is done loses
// the blocks: out of every session and the index at once, never served, and
// their slots come free only when the work is over.
TEST_F(EngineGpuWorkTest, AGoneWritersUnfinishedBlocksAreDropped) {
  Start(Options(8, 8), /*manual=*/true);
  const Chain c = MakeChain(1, 3);
  const Chain longer = MakeChain(2, 1, &c);
  Put("base", MakeChain(9, 1));
  WriteLease w = Written("s", c, Work(6, /*client=*/42));
  // Another session took the same blocks as duplicates, then went on.
  auto w2 = engine_->Allocate(tenant_, 4);
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE(engine_->Commit(w2->id, tenant_, "t", BlockKey{}, 0, longer.tokens, w2->slots).ok());
  EXPECT_EQ(engine_->ClientGone(/*client=*/41), 0u) << "another client's work";
  EXPECT_EQ(engine_->ClientGone(/*client=*/42), 3u);
  EXPECT_EQ(engine_->stats().unfinished_writes_dropped, 3u);
  EXPECT_EQ(engine_->GetSession(tenant_, "s").status().code(), StatusCode::kNotFound) << "emptied";
  EXPECT_EQ(engine_->GetSession(tenant_, "t").status().code(), StatusCode::kNotFound) << "cut before block 0";
  EXPECT_EQ(engine_->GetSession(tenant_, "base")->blocks, 1u) << "untouched";
  EXPECT_EQ(engine_->stats().blocks, 1u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 3u + 1u) << "the dropped blocks' slots wait for the work";
  EXPECT_INVARIANTS();
  Finish(6);
  EXPECT_EQ(Get("", c)->matched, 0u);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 1u) << "base alone";
  EXPECT_INVARIANTS();
  ASSERT_TRUE(engine_->Release(w.id).ok());
  ASSERT_TRUE(engine_->Release(w2->id).ok());

  // A failed event: the blocks it was writing are dropped at the next Poll.
  ASSERT_TRUE(engine_->EvictSessions(std::nullopt) > 0);
  WriteLease w3 = Written("u", c, Work(8));
  Finish(8, Backend::WorkState::kFailed);
  engine_->Poll();
  EXPECT_EQ(engine_->GetSession(tenant_, "u").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().unfinished_writes_dropped, 6u);
  EXPECT_EQ(manual_->open_watches(), 0u);
  ExpectConsistent();
  ASSERT_TRUE(engine_->Release(w3.id).ok());
}

// Work that never reports done is given back after the lease timeout, as a
// lease held that long would be; so is work of an engine that goes away.
TEST_F(EngineGpuWorkTest, WorkThatNeverEndsExpiresWithTheLeaseTimeout) {
  EngineOptions o = Options(4, 4);
  o.lease_timeout = milliseconds(30);
  Start(o, /*manual=*/true);
  auto w = engine_->Allocate(tenant_, 2);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(engine_->Release(w->id, Work(9)).ok());
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 2u);
  std::this_thread::sleep_for(milliseconds(40));
  engine_->Poll();
  EXPECT_EQ(engine_->stats().used[Tier::kGpu], 0u);
  EXPECT_EQ(engine_->stats().expired_gpu_work, 1u);
  EXPECT_EQ(manual_->open_watches(), 0u);
  ASSERT_TRUE(engine_->Release(engine_->Allocate(tenant_, 1)->id, Work(10)).ok());
  EXPECT_EQ(manual_->open_watches(), 1u);
  EXPECT_INVARIANTS();
  engine_.reset();
  EXPECT_EQ(manual_->open_watches(), 0u) << "the engine ends the watches it holds";
}

}  // namespace
}  // namespace kvtier::tiering

// --- The stores below the host tier: blocks offered to them, blocks imported ----------

namespace kvtier::tiering {
namespace {

struct Spilled {
  BlockKey key, parent;
  Namespace key_ns;
  std::vector<TokenId> tokens;
  std::vector<std::byte> payload;
  bool dropped;
};

class EngineStoreTest : public EngineTest {
 protected:
  EngineOptions SpillOptions(uint32_t gpu_slots, uint32_t host_slots) {
    EngineOptions o = Options(gpu_slots, host_slots);
    o.on_spill = [this](const HostBlock& b) {
      spilled_.push_back(Spilled{b.key,
                                 b.parent,
                                 b.key_ns,
                                 {b.tokens.begin(), b.tokens.end()},
                                 {b.payload.begin(), b.payload.end()},
                                 b.dropped});
    };
    return o;
  }
  // The bytes of block `i` of `c`, as a store would hand them back.
  std::vector<std::byte> Payload(const Chain& c, uint32_t i) const {
    std::vector<std::byte> p(engine_->profile().BlockBytes());
    FillBlock(p.data(), c.keys[i]);
    return p;
  }
  void ExpectSpilledIs(const Spilled& s, const Chain& c, uint32_t i) const {
    EXPECT_EQ(s.key, c.keys[i]);
    EXPECT_EQ(s.parent, i == 0 ? BlockKey{} : c.keys[i - 1]);
    EXPECT_EQ(s.key_ns, ns_);
    EXPECT_EQ(s.tokens, std::vector<TokenId>(c.block(i).begin(), c.block(i).end()));
    EXPECT_EQ(s.payload, Payload(c, i));
  }
  std::vector<Spilled> spilled_;
};

TEST_F(EngineStoreTest, BlocksLandingInTheHostTierAreOfferedOnceWithTheirBytes) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(1, 3);
  Put("s", c);
  EXPECT_TRUE(spilled_.empty()) << "blocks in the GPU tier are not offered";
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  ASSERT_EQ(spilled_.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(spilled_[i].dropped);
    ExpectSpilledIs(spilled_[i], c, i);
  }
  // Promoted and demoted again: the stores have it already.
  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(spilled_.size(), 3u);
  EXPECT_EQ(engine_->stats().spilled_blocks, 3u);
  EXPECT_INVARIANTS();
}

TEST_F(EngineStoreTest, BlocksPressureDropsFromTheHostTierAreOfferedBeforeTheirSlotIsReused) {
  Start(SpillOptions(4, 2));
  const Chain a = MakeChain(1, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("a", a));
  spilled_.clear();
  // b's demotion needs the host tier's two slots: a's blocks are dropped, tail first.
  const Chain b = MakeChain(2, 2);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("b", b));
  std::vector<const Spilled*> dropped;
  for (const Spilled& s : spilled_) {
    if (s.dropped) dropped.push_back(&s);
  }
  ASSERT_EQ(dropped.size(), 2u);
  ExpectSpilledIs(*dropped[0], a, 1);
  ExpectSpilledIs(*dropped[1], a, 0);
  EXPECT_INVARIANTS();
}

TEST_F(EngineStoreTest, FetchedBlocksAreServedAndPromotedByTheAcquireThatBroughtThem) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(3, 4);
  std::vector<std::vector<std::byte>> bytes;
  for (uint32_t i = 0; i < 4; ++i) bytes.push_back(Payload(c, i));
  FetchedBlocks fetched{0, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, true, &fetched);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_EQ(lease->imported, 4u);
  EXPECT_EQ(lease->promoted, 4u);
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 4));
  EXPECT_EQ(engine_->stats().imported_blocks, 4u);
  EXPECT_EQ(engine_->stats().hit_blocks, 0u) << "imported blocks are no cache hits";
  // They came from a store: demoting them does not offer them back.
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(spilled_.empty());
  ExpectConsistent();
}

TEST_F(EngineStoreTest, HitsAreCountedByTheTierTheyWereFoundIn) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(10, 3);
  ASSERT_NO_FATAL_FAILURE(PutInHostTier("s", c));
  auto lease = Get("s", c);  // Found in the host tier, promoted.
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  lease = Get("s", c);  // Found in the GPU tier.
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.hit_blocks_in[Tier::kHost], 3u);
  EXPECT_EQ(st.hit_blocks_in[Tier::kGpu], 3u);
  EXPECT_EQ(st.hit_blocks, 6u);
}

TEST_F(EngineStoreTest, FetchedBlocksContinueTheCachedPrefixUntilTheHostTierIsFull) {
  Start(SpillOptions(8, 2));
  const Chain c = MakeChain(4, 5);
  Chain head = c;
  head.tokens.resize(2 * kBt);
  head.keys.resize(2);
  Put("s", head);  // Blocks 0 and 1, in the GPU tier.
  std::vector<std::vector<std::byte>> bytes;
  for (uint32_t i = 1; i < 5; ++i) bytes.push_back(Payload(c, i));
  // A fetch that started when only block 0 was cached: block 1 is skipped,
  // and the host tier's two slots take blocks 2 and 3.
  FetchedBlocks fetched{1, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, /*promote=*/false, &fetched);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 4u);
  EXPECT_EQ(lease->imported, 2u);
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  EXPECT_EQ(Tiers("s"), (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kHost, Tier::kHost}));
  ExpectConsistent();
}

// A fetch that came after its Acquire stopped waiting: placed into the
// session, unleased, without counting a lookup; not where the session moved on.
TEST_F(EngineStoreTest, ALateFetchLandsInItsSessionUnlessTheSessionMovedOn) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(5, 4);
  Chain head = c;
  head.tokens.resize(kBt);
  head.keys.resize(1);
  Put("s", head);  // Block 0 cached, in the session; the fetch continues from it.
  std::vector<std::vector<std::byte>> bytes;
  for (uint32_t i = 1; i < 4; ++i) bytes.push_back(Payload(c, i));
  const FetchedBlocks fetched{1, {bytes.begin(), bytes.end()}};
  const uint64_t hits = engine_->stats().hit_blocks, misses = engine_->stats().miss_blocks;
  auto placed = engine_->ImportLate(tenant_, "s", c.keys, c.tokens, fetched);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(*placed, 3u);
  EXPECT_EQ(Tiers("s"), (std::vector<Tier>{Tier::kGpu, Tier::kHost, Tier::kHost, Tier::kHost}));
  EXPECT_EQ(engine_->stats().read_leases, 0u);
  EXPECT_EQ(engine_->stats().hit_blocks, hits);
  EXPECT_EQ(engine_->stats().miss_blocks, misses);
  auto lease = Get("s", c);
  ASSERT_TRUE(lease.ok());
  ExpectLeaseHolds(*lease, c);
  ASSERT_TRUE(engine_->Release(lease->id).ok());

  // A cold session (nothing cached): made with the blocks.
  const Chain d = MakeChain(6, 2);
  std::vector<std::vector<std::byte>> dbytes{Payload(d, 0), Payload(d, 1)};
  EXPECT_EQ(*engine_->ImportLate(tenant_, "cold", d.keys, d.tokens, FetchedBlocks{0, {dbytes.begin(), dbytes.end()}}),
            2u);
  EXPECT_EQ(Tiers("cold"), All(Tier::kHost, 2));

  // A session whose chain moved on to other tokens since: left alone, nothing placed.
  const Chain e = MakeChain(7, 3), other = MakeChain(8, 1);
  Put("moved", other);
  std::vector<std::vector<std::byte>> ebytes{Payload(e, 0), Payload(e, 1), Payload(e, 2)};
  EXPECT_EQ(*engine_->ImportLate(tenant_, "moved", e.keys, e.tokens, FetchedBlocks{0, {ebytes.begin(), ebytes.end()}}),
            0u);
  EXPECT_EQ(Tiers("moved"), All(Tier::kGpu, 1));
  EXPECT_EQ(engine_->Match(tenant_.ns, e.keys, e.tokens), 0u) << "no unheld block left behind";
  // No session named: nothing would hold them.
  EXPECT_EQ(*engine_->ImportLate(tenant_, "", e.keys, e.tokens, FetchedBlocks{0, {ebytes.begin(), ebytes.end()}}),
            0u);
  ExpectConsistent();
}

TEST_F(EngineStoreTest, FetchedBlocksThatDoNotFitTheRequestOrThePoolAreLeftOut) {
  Start(SpillOptions(8, 8));
  const Chain c = MakeChain(5, 3);
  std::vector<std::vector<std::byte>> bytes{Payload(c, 0), Payload(c, 1), Payload(c, 2)};
  // Fetched for a longer prefix than is cached: they do not continue it.
  FetchedBlocks late{1, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, true, &late);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  // Blocks of another size than the pool's slots.
  std::vector<std::byte> short_block(10);
  FetchedBlocks wrong{0, {std::span<const std::byte>(short_block)}};
  lease = engine_->Acquire(tenant_, "s", c.keys, c.tokens, true, &wrong);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  // Bytes for other tokens than the request's are published under the keys
  // their tokens give, which are not the requested ones: nothing is served.
  const Chain other = MakeChain(6, 3);
  FetchedBlocks forged{0, {bytes.begin(), bytes.end()}};
  lease = engine_->Acquire(tenant_, "s", c.keys, other.tokens, true, &forged);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched, 0u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(engine_->stats().imported_blocks, 0u);
  ExpectConsistent();
}

TEST_F(EngineStoreTest, CommittedBlocksAreCopiedAndOfferedOnceTheirWriterIsDone) {
  EngineOptions o = SpillOptions(8, 8);
  o.spill_committed = true;
  Start(o, /*manual=*/true);
  const Chain c = MakeChain(7, 3);
  // Written by the client's GPU: nothing is copied before its event completes.
  auto w = engine_->Allocate(tenant_, 3);
  ASSERT_TRUE(w.ok());
  for (uint32_t i = 0; i < 3; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[i]);
  wire::IpcEventHandle event{};
  event[0] = 9;
  auto watch = manual_->WatchClientEvent(1, event);
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(engine_->Commit(w->id, tenant_, "s", BlockKey{}, 0, c.tokens, w->slots, GpuWork{*watch, 1}).ok());
  ASSERT_TRUE(engine_->Release(w->id).ok());
  engine_->Poll();
  manual_->RunAll();
  engine_->Poll();
  EXPECT_TRUE(spilled_.empty()) << "a block is copied only once its writer is done";
  manual_->events[9] = Backend::WorkState::kDone;
  engine_->Poll();  // The writer is done: the copies are submitted...
  EXPECT_TRUE(spilled_.empty());
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 3u) << "...each into a host slot of its own";
  EXPECT_INVARIANTS();
  manual_->RunAll();
  engine_->Poll();  // ...and offered when they land.
  ASSERT_EQ(spilled_.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(spilled_[i].dropped);
    ExpectSpilledIs(spilled_[i], c, i);
  }
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 0u);
  EXPECT_EQ(Tiers("s"), All(Tier::kGpu, 3)) << "the blocks stay where they are";
  // Landing in the host tier later offers them no second time.
  ASSERT_EQ(*engine_->Demote(tenant_, "s"), 3u);
  manual_->RunAll();
  engine_->Poll();
  EXPECT_EQ(spilled_.size(), 3u);
  ExpectConsistent();
}

TEST_F(EngineStoreTest, WithTheHostTierFullCommittedBlocksAreOfferedWhenTheyLandThere) {
  EngineOptions o = SpillOptions(8, 2);
  o.spill_committed = true;
  Start(o);
  const Chain a = MakeChain(8, 2);
  Put("a", a);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  for (int i = 0; i < 1000 && spilled_.size() < 2; ++i) {
    engine_->Poll();
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_EQ(spilled_.size(), 2u);
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);  // The host tier is full now.
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  const Chain b = MakeChain(9, 2);
  Put("b", b);
  engine_->Poll();
  EXPECT_EQ(spilled_.size(), 2u) << "no host slot to copy b into: nothing evicted for it";
  EXPECT_EQ(Tiers("a"), All(Tier::kHost, 2));
  ExpectConsistent();
}

// a's two blocks dropped from the host tier by b's demotion (4 GPU, 2 host slots).
class EngineStoreBelowTest : public EngineStoreTest {
 protected:
  void DropA(const EngineOptions& o) {
    Start(o);
    Put("a", a_);
    ASSERT_EQ(*engine_->Demote(tenant_, "a"), 2u);
    ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
    Put("b", b_);
    ASSERT_EQ(*engine_->Demote(tenant_, "b"), 2u);
    ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  }
  std::vector<std::vector<std::byte>> Payloads(const Chain& c, uint32_t n) const {
    std::vector<std::vector<std::byte>> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(Payload(c, i));
    return out;
  }
  Chain a_ = MakeChain(20, 2), b_ = MakeChain(21, 2);
};

TEST_F(EngineStoreBelowTest, ASessionKeepsTheKeysOfBlocksDroppedIntoTheStores) {
  DropA(SpillOptions(4, 2));
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok()) << "a session whose blocks all went into the stores lives on: " << info.status().ToString();
  EXPECT_EQ(info->blocks, 0u);
  EXPECT_TRUE(info->chain.empty());
  EXPECT_EQ(info->blocks_below, 2u);
  EXPECT_EQ(info->below, a_.keys);
  EXPECT_EQ(info->below_local, (std::vector<std::optional<Tier>>{std::nullopt, std::nullopt}));
  bool listed = false;
  for (const SessionInfo& s : engine_->ListSessions()) {
    if (s.id == "a") {
      listed = true;
      EXPECT_EQ(s.blocks_below, 2u);
      EXPECT_TRUE(s.below.empty()) << "listings carry no keys";
    }
  }
  EXPECT_TRUE(listed);
  ExpectConsistent();
}

TEST_F(EngineStoreBelowTest, WithoutStoresADroppedSessionIsGone) {
  EngineOptions o = Options(4, 2);
  DropA(o);
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound);
}

TEST_F(EngineStoreBelowTest, BlocksBroughtBackFromTheStoresLeaveTheListBelow) {
  DropA(SpillOptions(4, 2));
  // The first block fetched back: the second is still below it.
  const auto bytes = Payloads(a_, 1);
  FetchedBlocks fetched{0, {bytes.begin(), bytes.end()}};
  auto lease = engine_->Acquire(tenant_, "a", a_.keys, a_.tokens, /*promote=*/false, &fetched);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, 1u);
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->blocks, 1u);
  EXPECT_EQ(info->below, std::vector<BlockKey>{a_.keys[1]});
  // Recomputed and committed again: the chain holds both, nothing is below.
  Put("a", a_, 1);
  info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->blocks, 2u);
  EXPECT_TRUE(info->below.empty());
  ExpectConsistent();
}

TEST_F(EngineStoreBelowTest, AChainThatGoesAnotherWayForgetsTheBlocksBelow) {
  DropA(SpillOptions(4, 2));
  const Chain other = MakeChain(22, 1);
  Put("a", other);
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->chain, other.keys);
  EXPECT_TRUE(info->below.empty()) << "a's old blocks do not continue the new chain";
  ExpectConsistent();
}

TEST_F(EngineStoreBelowTest, ASessionWithOnlyBlocksBelowMakesRoomUnderTheTenantsSessionLimit) {
  EngineOptions o = SpillOptions(4, 2);
  o.max_sessions_per_tenant = 2;
  DropA(o);  // a holds no block now, b two.
  Put("c", MakeChain(23, 1));
  EXPECT_EQ(engine_->GetSession(tenant_, "a").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine_->GetSession(tenant_, "b").ok());
  EXPECT_TRUE(engine_->GetSession(tenant_, "c").ok());
  // No such session left: the limit holds.
  auto w = engine_->Allocate(tenant_, 1);
  ASSERT_TRUE(w.ok());
  const Chain d = MakeChain(24, 1);
  EXPECT_EQ(engine_->Commit(w->id, tenant_, "d", BlockKey{}, 0, d.tokens, w->slots).status().code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(engine_->Release(w->id).ok());
  ExpectConsistent();
}

// KV events replayed into a map (key -> tier) give the engine's blocks per tier.
class EngineEventTest : public EngineTest {
 protected:
  EngineOptions EventOptions(uint32_t gpu_slots, uint32_t host_slots) {
    EngineOptions o = Options(gpu_slots, host_slots);
    o.on_block_event = [this](const BlockEvent& e) {
      switch (e.kind) {
        case BlockEventKind::kStored:
          EXPECT_TRUE(replayed_.emplace(e.key, e.tier).second) << "stored twice";
          EXPECT_EQ(e.tokens.size(), kBt);
          break;
        case BlockEventKind::kMoved: {
          auto it = replayed_.find(e.key);
          ASSERT_NE(it, replayed_.end()) << "moved before stored";
          EXPECT_EQ(it->second, e.from);
          EXPECT_NE(e.from, e.tier);
          it->second = e.tier;
          break;
        }
        case BlockEventKind::kRemoved: {
          auto it = replayed_.find(e.key);
          ASSERT_NE(it, replayed_.end()) << "removed before stored";
          EXPECT_EQ(it->second, e.tier);
          replayed_.erase(it);
          break;
        }
      }
    };
    o.on_session_evicted = [this](std::string_view, std::string_view id) { evicted_.emplace_back(id); };
    return o;
  }
  // Every session's blocks and where they are (each block is some session's, once leases are released).
  std::unordered_map<BlockKey, Tier, BlockKeyHash> Cached() const {
    std::unordered_map<BlockKey, Tier, BlockKeyHash> out;
    for (const SessionInfo& s : engine_->ListSessions()) {
      auto info = engine_->GetSession(tenant_, s.id);
      EXPECT_TRUE(info.ok());
      for (size_t i = 0; i < info->chain.size(); ++i) out[info->chain[i]] = info->tiers[i];
    }
    return out;
  }
  std::unordered_map<BlockKey, Tier, BlockKeyHash> replayed_;
  std::vector<std::string> evicted_;
};

TEST_F(EngineEventTest, ReplayedEventsGiveTheBlocksPerTier) {
  Start(EventOptions(8, 4));
  const Chain a = MakeChain(30, 4), b = MakeChain(31, 4), c = MakeChain(32, 6);
  Put("a", a);
  EXPECT_EQ(replayed_, Cached());
  ASSERT_EQ(*engine_->Demote(tenant_, "a"), 4u);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(replayed_, Cached()) << "moved to the host tier";
  Put("b", b);
  auto lease = Get("a", a);  // Promoted back; b is demoted to make room.
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(engine_->Release(lease->id).ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_EQ(replayed_, Cached());
  Put("c", c);  // Past both tiers: blocks are dropped.
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_GT(engine_->stats().dropped_blocks, 0u);
  EXPECT_EQ(replayed_, Cached());
  ASSERT_TRUE(engine_->Evict(tenant_, "b").ok());
  EXPECT_EQ(evicted_, std::vector<std::string>{"b"});
  EXPECT_EQ(replayed_, Cached());
  engine_->EvictSessions(std::nullopt);
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  EXPECT_TRUE(replayed_.empty()) << replayed_.size() << " blocks never removed";
  EXPECT_TRUE(Cached().empty());
}

}  // namespace
}  // namespace kvtier::tiering
