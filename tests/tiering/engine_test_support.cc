// EngineTest and the engine tests' shared data (engine_test_support.h).
#include "engine_test_support.h"

#include <algorithm>
#include <string>

#include "kvtier/tiering/host_backend.h"
#include "support/test_names.h"

namespace kvtier {
void PrintTo(Tier tier, std::ostream* os) { *os << TierName(tier); }
}  // namespace kvtier

namespace kvtier::tiering {

ModelProfile TestProfile() { return ModelProfile{"test", 2, 1, 8, DType::kF16, kBt}; }

std::byte ByteOf(const BlockKey& key, size_t i) {
  const uint64_t w = (i / 8) % 2 ? key.hi : key.lo;
  return static_cast<std::byte>((w >> (8 * (i % 8))) ^ (i * 131));
}

std::unique_ptr<Backend> TestHostBackend(const std::string& prefix) {
  HostBackendOptions o;
  o.name_prefix = prefix;
  auto b = CreateHostBackend(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

void EngineTest::SetUp() {
  prefix_ = testing::UniqueShmPrefix("engine");
  host_backend_ = TestHostBackend(prefix_);
  ASSERT_NE(host_backend_, nullptr);
}

void EngineTest::TearDown() {
  if (engine_ != nullptr) {
    const Status st = EngineInspector::CheckInvariants(*engine_);
    EXPECT_TRUE(st.ok()) << "at teardown: " << st.ToString();
  }
}

EngineOptions TestEngineOptions(uint32_t gpu_slots, uint32_t host_slots, std::string name, std::string index_segment) {
  EngineOptions o;
  o.profile = TestProfile();
  o.gpu_slots = gpu_slots;
  o.host_slots = host_slots;
  o.gpu_high_watermark = o.gpu_low_watermark = 1.0;
  o.host_high_watermark = o.host_low_watermark = 1.0;
  o.name = std::move(name);
  o.index_segment = std::move(index_segment);
  return o;
}

EngineOptions EngineTest::Options(uint32_t gpu_slots, uint32_t host_slots) {
  EngineOptions o = TestEngineOptions(gpu_slots, host_slots, "engine" + std::to_string(engines_made_),
                                      "/" + prefix_ + ".index" + std::to_string(engines_made_));
  o.on_free = [this](const BlockKey& key, bool dropped) { freed_.push_back(Freed{key, dropped}); };
  return o;
}

void EngineTest::Start(const EngineOptions& o, bool manual) {
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

Chain EngineTest::MakeChain(uint32_t seed, uint32_t blocks, const Chain* prefix) {
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

void EngineTest::FillBlock(std::byte* p, const BlockKey& key) const {
  for (size_t i = 0; i < engine_->profile().BlockBytes(); ++i) p[i] = ByteOf(key, i);
}

bool EngineTest::Holds(const BlockLocation& loc, const BlockKey& key) const {
  const std::byte* p = engine_->pool(loc.tier).slot_data(loc.slot);
  for (size_t i = 0; i < engine_->profile().BlockBytes(); ++i) {
    if (p[i] != ByteOf(key, i)) return false;
  }
  return true;
}

CommitResult EngineTest::Put(const std::string& session, const Chain& c, uint32_t from) {
  const uint32_t n = c.blocks() - from;
  auto w = engine_->Allocate(tenant_, n);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return {};
  EXPECT_EQ(w->slots.size(), n);
  for (uint32_t i = 0; i < n; ++i) FillBlock(engine_->pool(Tier::kGpu).slot_data(w->slots[i]), c.keys[from + i]);
  auto r = engine_->Commit(w->id, tenant_, session, from == 0 ? BlockKey{} : c.keys[from - 1], from,
                           c.tokens_from(from), w->slots);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(engine_->Release(w->id).ok());
  return r.ok() ? *r : CommitResult{};
}

void EngineTest::PutInHostTier(const std::string& session, const Chain& c) {
  Put(session, c);
  ASSERT_EQ(*engine_->Demote(tenant_, session), c.blocks());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
}

void EngineTest::ExpectLeaseHolds(const ReadLease& lease, const Chain& c) {
  ASSERT_TRUE(backend_->Wait(lease.fence, kWait).ok());
  ASSERT_LE(lease.blocks.size(), c.blocks());
  for (size_t i = 0; i < lease.blocks.size(); ++i) {
    EXPECT_TRUE(Holds(lease.blocks[i], c.keys[i]))
        << "block " << i << " in " << TierName(lease.blocks[i].tier) << " slot " << lease.blocks[i].slot;
  }
}

void EngineTest::ExpectChainHolds(const Chain& c, uint32_t expect_blocks) {
  auto lease = Get("", c, /*promote=*/false);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched, expect_blocks);
  EXPECT_EQ(lease->blocks.size(), expect_blocks);
  ExpectLeaseHolds(*lease, c);
  if (lease->id != 0) {
    EXPECT_TRUE(engine_->Release(lease->id).ok());
  }
}

std::vector<Tier> EngineTest::Tiers(const std::string& session) const {
  auto info = engine_->GetSession(tenant_, session);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  return info.ok() ? info->tiers : std::vector<Tier>{};
}

void EngineTest::ExpectConsistent() {
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

size_t EngineTest::FreedCount(bool dropped) const {
  return static_cast<size_t>(
      std::count_if(freed_.begin(), freed_.end(), [&](const Freed& f) { return f.dropped == dropped; }));
}

bool EngineTest::WasFreed(const BlockKey& key, bool dropped) const {
  return std::any_of(freed_.begin(), freed_.end(),
                     [&](const Freed& f) { return f.key == key && f.dropped == dropped; });
}

EngineOptions EngineQuotaTest::QuotaOptions(uint32_t gpu_quota, uint32_t host_quota) {
  EngineOptions o = Options(32, 32);
  TenantQuota q;
  q.tenant = tenant_;
  q.blocks[Tier::kGpu] = gpu_quota;
  q.blocks[Tier::kHost] = host_quota;
  o.quotas.push_back(q);
  return o;
}

void EngineQuotaTest::PutOther(const std::string& session, uint32_t seed, uint32_t blocks) {
  std::vector<TokenId> tokens(blocks * kBt);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 100003u + static_cast<TokenId>(i);
  auto w = engine_->Allocate(other_, blocks);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto r = engine_->Commit(w->id, other_, session, BlockKey{}, 0, tokens, w->slots);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(engine_->Release(w->id).ok());
}

}  // namespace kvtier::tiering
