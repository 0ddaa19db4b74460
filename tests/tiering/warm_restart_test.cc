// Warm restart: the manifest format (encode, decode, every rejection) and the
// engine's adoption rules, on the real host backend with its persistent pool.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine_inspector.h"
#include "engine_test_support.h"  // The engine tests' profile (TestProfile, kBt).
#include "kvtier/shm_segment.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/tiering/host_backend.h"
#include "support/test_names.h"
#include "warm_manifest.h"

namespace kvtier::tiering {
namespace {

constexpr auto kWait = std::chrono::seconds(10);

// --- The format ------------------------------------------------------------------

WarmManifest Sample() {
  WarmManifest m;
  m.geometry = WarmGeometry{0x1234, 256, kBt, 16};
  m.clean = true;
  m.written_unix_ms = 42;
  const Namespace ns = Namespace::Make(0x1234, "tenant");
  BlockKey parent;
  for (uint32_t i = 0; i < 3; ++i) {
    WarmBlock b;
    b.tokens = {i, i + 1, i + 2, i + 3};
    b.parent = parent;
    b.ns = ns;
    b.key = ChainKey(parent, ns, b.tokens);
    b.checksum = 1000 + i;
    b.host_slot = 5 + i;
    parent = b.key;
    m.blocks.push_back(b);
  }
  m.sessions.push_back(WarmSession{"acme", "chat-1", 3, {0, 1, 2}});
  m.sessions.push_back(WarmSession{"", "x", 0, {0}});
  return m;
}

TEST(WarmManifestTest, RoundTrips) {
  const WarmManifest m = Sample();
  const std::vector<std::byte> bytes = EncodeWarmManifest(m);
  auto d = DecodeWarmManifest(bytes, m.geometry);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->clean);
  EXPECT_EQ(d->written_unix_ms, 42u);
  ASSERT_EQ(d->blocks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d->blocks[i].key, m.blocks[i].key);
    EXPECT_EQ(d->blocks[i].parent, m.blocks[i].parent);
    EXPECT_EQ(d->blocks[i].ns, m.blocks[i].ns);
    EXPECT_EQ(d->blocks[i].tokens, m.blocks[i].tokens);
    EXPECT_EQ(d->blocks[i].checksum, m.blocks[i].checksum);
    EXPECT_EQ(d->blocks[i].host_slot, m.blocks[i].host_slot);
  }
  ASSERT_EQ(d->sessions.size(), 2u);
  EXPECT_EQ(d->sessions[0].tenant, "acme");
  EXPECT_EQ(d->sessions[0].id, "chat-1");
  EXPECT_EQ(d->sessions[0].priority, 3);
  EXPECT_EQ(d->sessions[0].chain, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(d->sessions[1].tenant, "");
  EXPECT_EQ(d->sessions[1].id, "x");
}

// A manifest an older build wrote (format 1) kept the tenant in the id as
// "<tenant>/<id>": it still decodes, with the tenant split off.
TEST(WarmManifestTest, AFormat1ManifestDecodesWithTheTenantSplitOffTheId) {
  WarmManifest m = Sample();
  m.sessions[0].tenant.clear();
  m.sessions[0].id = "acme/chat-1";  // As format 1 wrote it; no tenant bytes.
  std::vector<std::byte> bytes = EncodeWarmManifest(m, /*format=*/2);  // Format 1's block entries are format 2's.
  uint32_t version = 1;
  std::memcpy(bytes.data() + 8, &version, sizeof(version));
  const uint64_t header_checksum = XXH3_64bits(bytes.data(), 120);  // Everything before the field.
  std::memcpy(bytes.data() + 120, &header_checksum, sizeof(header_checksum));
  auto d = DecodeWarmManifest(bytes, m.geometry);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->sessions.size(), 2u);
  EXPECT_EQ(d->sessions[0].tenant, "acme");
  EXPECT_EQ(d->sessions[0].id, "chat-1");
  EXPECT_EQ(d->sessions[1].tenant, "");
  EXPECT_EQ(d->sessions[1].id, "x");
}

// Format 4 keeps whether a session's client ended it; a format 3 manifest
// (before sessions had flags) decodes with every session open.
TEST(WarmManifestTest, AnEndedSessionStaysEndedAndAFormat3ManifestHasNone) {
  WarmManifest m = Sample();
  m.sessions[0].ended = true;
  auto d = DecodeWarmManifest(EncodeWarmManifest(m), m.geometry);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->sessions[0].ended);
  EXPECT_FALSE(d->sessions[1].ended);
  auto old = DecodeWarmManifest(EncodeWarmManifest(m, /*format=*/3), m.geometry);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_FALSE(old->sessions[0].ended);
  EXPECT_EQ(old->sessions[0].chain, m.sessions[0].chain);
}

TEST(WarmManifestTest, OtherGeometryOrVersionIsAPreconditionFailure) {
  const WarmManifest m = Sample();
  const std::vector<std::byte> bytes = EncodeWarmManifest(m);
  for (int field = 0; field < 4; ++field) {
    WarmGeometry g = m.geometry;
    if (field == 0) g.profile_fingerprint ^= 1;
    if (field == 1) g.block_bytes *= 2;
    if (field == 2) g.block_tokens = 8;
    if (field == 3) g.host_slots = 32;
    auto d = DecodeWarmManifest(bytes, g);
    ASSERT_FALSE(d.ok()) << field;
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition) << d.status().ToString();
  }
  std::vector<std::byte> v = bytes;
  v[8] = std::byte{kWarmFormatVersion + 1};  // format_version
  auto d = DecodeWarmManifest(v, m.geometry);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
}

TEST(WarmManifestTest, EveryCorruptionIsRejected) {
  const WarmManifest m = Sample();
  const std::vector<std::byte> good = EncodeWarmManifest(m);
  auto expect_corrupt = [&](std::vector<std::byte> bytes, const char* what) {
    auto d = DecodeWarmManifest(bytes, m.geometry);
    ASSERT_FALSE(d.ok()) << what;
    EXPECT_EQ(d.status().code(), StatusCode::kCorrupt) << what << ": " << d.status().ToString();
  };
  expect_corrupt({}, "empty");
  expect_corrupt(std::vector<std::byte>(good.begin(), good.begin() + 100), "header cut");
  expect_corrupt(std::vector<std::byte>(good.begin(), good.end() - 8), "body cut");
  std::vector<std::byte> v = good;
  v.push_back(std::byte{0});
  expect_corrupt(v, "trailing byte");
  v = good;
  v[0] ^= std::byte{1};
  expect_corrupt(v, "magic");
  v = good;
  v[60] ^= std::byte{1};  // Inside the header: its checksum catches it.
  expect_corrupt(v, "header byte");
  // Every single body byte flip is caught by the body checksum.
  for (size_t i = 128; i < good.size(); i += 7) {
    v = good;
    v[i] ^= std::byte{0x40};
    expect_corrupt(v, "body byte");
  }
  // Structurally wrong content with valid checksums.
  WarmManifest bad = m;
  bad.blocks[1].host_slot = bad.blocks[0].host_slot;
  expect_corrupt(EncodeWarmManifest(bad), "slot twice");
  bad = m;
  bad.blocks[2].host_slot = 16;
  expect_corrupt(EncodeWarmManifest(bad), "slot out of range");
  bad = m;
  bad.sessions[0].chain.push_back(7);
  expect_corrupt(EncodeWarmManifest(bad), "chain index out of range");
  bad = m;
  bad.sessions[1].id.clear();
  expect_corrupt(EncodeWarmManifest(bad), "empty session id");
}

TEST(WarmManifestTest, SegmentIsReplacedWhole) {
  const std::string name = "/" + testing::UniqueShmPrefix("warm") + ".warm";
  auto missing = ReadWarmSegment(name);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  WarmManifest m = Sample();
  ASSERT_TRUE(WriteWarmSegment(name, EncodeWarmManifest(m)).ok());
  m.sessions.pop_back();
  const std::vector<std::byte> second = EncodeWarmManifest(m);
  ASSERT_TRUE(WriteWarmSegment(name, second).ok());
  auto read = ReadWarmSegment(name);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, second);
  EXPECT_TRUE(RemoveWarmSegment(name));
  EXPECT_FALSE(RemoveWarmSegment(name));
  EXPECT_FALSE(WriteWarmSegment("no-slash", second).ok());
}

// --- The persistent host pool ----------------------------------------------------

TEST(PersistentPoolTest, AdoptsASegmentOfTheSameSizeAndReplacesAnother) {
  const std::string prefix = testing::UniqueShmPrefix("warm");
  HostBackendOptions o;
  o.name_prefix = prefix;
  auto backend = CreateHostBackend(o);
  ASSERT_TRUE(backend.ok());
  const std::string name = "/" + prefix + ".p";
  PoolSpec spec{Tier::kHost, 4096, 8, "p"};
  spec.persistent = true;
  {
    auto pool = (*backend)->CreatePool(spec);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    EXPECT_FALSE((*pool)->adopted());
    (*pool)->slot_data(7)[4095] = std::byte{0x5a};
  }
  {
    auto pool = (*backend)->CreatePool(spec);  // The segment outlived the pool.
    ASSERT_TRUE(pool.ok());
    EXPECT_TRUE((*pool)->adopted());
    EXPECT_EQ((*pool)->slot_data(7)[4095], std::byte{0x5a});
  }
  spec.slots = 16;
  {
    auto pool = (*backend)->CreatePool(spec);
    ASSERT_TRUE(pool.ok());
    EXPECT_FALSE((*pool)->adopted());
    EXPECT_EQ((*pool)->slot_data(7)[4095], std::byte{0});
  }
  spec.persistent = false;
  { ASSERT_TRUE((*backend)->CreatePool(spec).ok()); }
  // A pool that is not persistent is nameless: the named one is not touched.
  auto named = ShmSegment::Open(name, false);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->size(), 16u * 4096);
  struct stat st {};
  ASSERT_EQ(::fstat(named->share_fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "a persistent pool is its owner's alone";
  ::shm_unlink(name.c_str());
}

// --- Adoption --------------------------------------------------------------------

std::byte ByteOf(const BlockKey& key, size_t i) {
  return static_cast<std::byte>(((i / 8) % 2 ? key.hi : key.lo) >> (8 * (i % 8)) ^ (i * 29));
}

class WarmAdoptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = testing::UniqueShmPrefix("warm");
    HostBackendOptions o;
    o.name_prefix = prefix_;
    auto b = CreateHostBackend(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    tenant_ = Tenant::Make(TestProfile().Fingerprint(), "");
    ns_ = tenant_.ns;
  }
  void TearDown() override {
    if (engine_) EXPECT_TRUE(EngineInspector::CheckInvariants(*engine_).ok()) << EngineInspector::CheckInvariants(*engine_).ToString();
    engine_.reset();
    shm_unlink(PoolName().c_str());
    shm_unlink(Manifest().c_str());
  }

  std::string PoolName() const { return "/" + prefix_ + ".w.host"; }
  std::string Manifest() const { return "/" + prefix_ + ".w.warm"; }

  // A fresh engine on the same (persistent) segments, as a restarted daemon has.
  void Restart(uint32_t host_slots = 16, double host_watermark = 1.0) {
    engine_.reset();
    EngineOptions o;
    o.profile = TestProfile();
    o.gpu_slots = 16;
    o.host_slots = host_slots;
    o.gpu_high_watermark = o.gpu_low_watermark = 1.0;
    o.host_high_watermark = o.host_low_watermark = host_watermark;
    o.name = "w";
    o.index_segment = "/" + prefix_ + ".index";
    o.warm_restart = true;
    auto e = Engine::Create(o, *backend_);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
  }

  std::vector<TokenId> Tokens(uint32_t seed, uint32_t blocks) {
    std::vector<TokenId> t;
    for (uint32_t i = 0; i < blocks * kBt; ++i) t.push_back(seed * 1000 + i);
    return t;
  }
  std::vector<BlockKey> Keys(const std::vector<TokenId>& tokens) {
    std::vector<BlockKey> k(tokens.size() / kBt);
    ComputeKeys(tenant_.KeyNs(), BlockKey{}, tokens, kBt, k);
    return k;
  }

  // Writes and commits `tokens` as `session` (block i's bytes are a function of its key).
  void Put(const std::string& session, const std::vector<TokenId>& tokens) {
    const std::vector<BlockKey> keys = Keys(tokens);
    auto w = engine_->Allocate(tenant_, static_cast<uint32_t>(keys.size()));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (size_t i = 0; i < keys.size(); ++i) {
      std::byte* p = engine_->pool(Tier::kGpu).slot_data(w->slots[i]);
      for (size_t j = 0; j < TestProfile().BlockBytes(); ++j) p[j] = ByteOf(keys[i], j);
    }
    auto c = engine_->Commit(w->id, tenant_, session, BlockKey{}, 0, tokens, w->slots);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE(engine_->Release(w->id).ok());
  }
  void DemoteAll() {
    engine_->DemoteForShutdown();
    ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  }

  // Blocks of `tokens` that Acquire finds, each checked byte for byte after promotion.
  uint32_t VerifiedHits(const std::vector<TokenId>& tokens) {
    const std::vector<BlockKey> keys = Keys(tokens);
    auto lease = engine_->Acquire(tenant_, "", keys, tokens);
    EXPECT_TRUE(lease.ok());
    if (!lease.ok()) return 0;
    EXPECT_TRUE(backend_->Wait(lease->fence, kWait).ok());
    for (size_t i = 0; i < lease->blocks.size(); ++i) {
      const std::byte* p = engine_->pool(lease->blocks[i].tier).slot_data(lease->blocks[i].slot);
      for (size_t j = 0; j < TestProfile().BlockBytes(); ++j) {
        if (p[j] != ByteOf(keys[i], j)) {
          ADD_FAILURE() << "block " << i << " byte " << j << " differs";
          break;
        }
      }
    }
    if (lease->id != 0) EXPECT_TRUE(engine_->Release(lease->id).ok());
    engine_->Poll();
    return lease->matched;
  }

  uint32_t SessionBlocks(const std::string& id) {
    auto s = engine_->GetSession(tenant_, id);
    return s.ok() ? s->blocks : 0;
  }

  std::string prefix_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Engine> engine_;
  Tenant tenant_;
  Namespace ns_;
};

// A clean shutdown fills the host tier only to its high watermark: filled to
// 100 %, the next start found it past the mark and dropped blocks at once.
TEST_F(WarmAdoptTest, ShutdownDemotesUpToTheHostHighWatermarkOnly) {
  Restart(16, 0.75);
  for (uint32_t s = 0; s < 4; ++s) Put("s" + std::to_string(s), Tokens(s + 1, 4));
  DemoteAll();
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 12u) << "0.75 of 16 host slots";
  ASSERT_TRUE(engine_->SaveWarm(Manifest(), true).ok());
  Restart(16, 0.75);
  auto report = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->adopted_blocks, 12u);
  engine_->EnforceWatermarks();
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 12u) << "nothing dropped by the first watermark check";
}

TEST_F(WarmAdoptTest, CleanRestartAdoptsSessionsIndexAndBytes) {
  Restart();
  const auto a = Tokens(1, 4), b = Tokens(2, 3);
  Put("tenant/a", a);
  Put("b", b);
  ASSERT_TRUE(engine_->SetPriority(tenant_, "b", 5).ok());
  ASSERT_TRUE(engine_->EndSession(tenant_, "b").ok());
  DemoteAll();
  auto saved = engine_->SaveWarm(Manifest(), true);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->blocks, 7u);
  EXPECT_EQ(saved->sessions, 2u);
  EXPECT_EQ(saved->checksummed, 7u);
  EXPECT_FALSE(engine_->warm_dirty());

  Restart();
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->found);
  EXPECT_TRUE(r->compatible) << r->reason;
  EXPECT_TRUE(r->clean);
  EXPECT_EQ(r->adopted_blocks, 7u);
  EXPECT_EQ(r->dropped_blocks, 0u);
  EXPECT_EQ(r->adopted_sessions, 2u);
  EXPECT_EQ(engine_->stats().warm_adopted_blocks, 7u);
  EXPECT_EQ(engine_->stats().used[Tier::kHost], 7u);
  EXPECT_TRUE(EngineInspector::CheckInvariants(*engine_).ok()) << EngineInspector::CheckInvariants(*engine_).ToString();
  auto sb = engine_->GetSession(tenant_, "b");
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->priority, 5);
  EXPECT_EQ(sb->chain, Keys(b));
  EXPECT_TRUE(sb->ended) << "an ended session comes back ended";
  EXPECT_FALSE(engine_->GetSession(tenant_, "tenant/a")->ended);
  EXPECT_EQ(engine_->Match(ns_, Keys(a), a), 4u);
  EXPECT_EQ(VerifiedHits(a), 4u);
  EXPECT_EQ(VerifiedHits(b), 3u);
  // A new block written after adoption does not land on an adopted slot.
  Put("c", Tokens(3, 5));
  EXPECT_EQ(VerifiedHits(a), 4u);
}

TEST_F(WarmAdoptTest, CorruptBlockAndItsDescendantsAreDropped) {
  Restart();
  const auto a = Tokens(1, 4);
  std::vector<TokenId> fork(a.begin(), a.begin() + kBt);  // Shares block 0 with a.
  for (uint32_t i = 0; i < kBt; ++i) fork.push_back(9000 + i);
  Put("a", a);
  Put("fork", fork);
  DemoteAll();
  auto info = engine_->GetSession(tenant_, "a");
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(engine_->SaveWarm(Manifest(), true).ok());
  engine_.reset();

  // Flip one byte of block 1 of "a" in the surviving pool segment.
  auto mf = ReadWarmSegment(Manifest());
  ASSERT_TRUE(mf.ok());
  auto m = DecodeWarmManifest(*mf, WarmGeometry{TestProfile().Fingerprint(), TestProfile().BlockBytes(), kBt, 16});
  ASSERT_TRUE(m.ok());
  uint32_t slot = 0;
  for (const WarmBlock& b : m->blocks) {
    if (b.key == info->chain[1]) slot = b.host_slot;
  }
  {
    auto pool = ShmSegment::Open(PoolName(), true);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool->data()[size_t{slot} * TestProfile().BlockBytes() + 17] ^= std::byte{1};
  }
  Restart();
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->listed_blocks, 5u);
  EXPECT_EQ(r->adopted_blocks, 2u);  // a's block 0 (shared) and fork's block 1.
  EXPECT_EQ(r->dropped_blocks, 3u);  // a's blocks 1-3.
  EXPECT_EQ(engine_->stats().warm_dropped_blocks, 3u);
  EXPECT_EQ(SessionBlocks("a"), 1u);
  EXPECT_EQ(SessionBlocks("fork"), 2u);
  EXPECT_EQ(VerifiedHits(a), 1u);
  EXPECT_EQ(VerifiedHits(fork), 2u);
}

TEST_F(WarmAdoptTest, BlockWhoseKeyDoesNotRecomputeIsDroppedWithDescendants) {
  Restart();
  const auto a = Tokens(1, 3);
  Put("a", a);
  DemoteAll();
  ASSERT_TRUE(engine_->SaveWarm(Manifest(), true).ok());
  engine_.reset();
  const WarmGeometry g{TestProfile().Fingerprint(), TestProfile().BlockBytes(), kBt, 16};
  auto m = DecodeWarmManifest(*ReadWarmSegment(Manifest()), g);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->blocks.size(), 3u);
  m->blocks[1].tokens[0] ^= 1;  // Well-formed manifest, wrong tokens for the key.
  ASSERT_TRUE(WriteWarmSegment(Manifest(), EncodeWarmManifest(*m)).ok());
  Restart();
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->adopted_blocks, 1u);
  EXPECT_EQ(r->dropped_blocks, 2u);
  EXPECT_EQ(VerifiedHits(a), 1u);
}

TEST_F(WarmAdoptTest, IncompatibleManifestIsRemovedAndTheEngineStartsCold) {
  Restart();
  Put("a", Tokens(1, 2));
  DemoteAll();
  ASSERT_TRUE(engine_->SaveWarm(Manifest(), true).ok());
  Restart(32);  // Another host pool size: the pool segment is replaced, the manifest stale.
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->found);
  EXPECT_FALSE(r->compatible);
  EXPECT_NE(r->reason.find("host slots"), std::string::npos) << r->reason;
  EXPECT_EQ(engine_->stats().blocks, 0u);
  EXPECT_EQ(ReadWarmSegment(Manifest()).status().code(), StatusCode::kNotFound);
  // And a start with no manifest at all.
  Restart(32);
  r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->found);
}

TEST_F(WarmAdoptTest, SnapshotAfterWhichASlotWasReusedAdoptsOnlyIntactBlocks) {
  Restart(4);
  const auto a = Tokens(1, 2), b = Tokens(2, 2);
  Put("a", a);
  Put("b", b);
  DemoteAll();
  ASSERT_TRUE(engine_->SaveWarm(Manifest(), false).ok());  // A periodic snapshot.
  // After it: "a" goes, its host slots take "c"'s blocks; then the daemon dies
  // without another snapshot.
  ASSERT_TRUE(engine_->Evict(tenant_, "a").ok());
  const auto c = Tokens(3, 2);
  Put("c", c);
  ASSERT_TRUE(engine_->Demote(tenant_, "c").ok());
  ASSERT_TRUE(engine_->WaitIdle(kWait).ok());
  ASSERT_EQ(engine_->stats().used[Tier::kHost], 4u);
  Restart(4);
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->clean);
  EXPECT_EQ(r->listed_blocks, 4u);
  EXPECT_EQ(r->adopted_blocks, 2u);
  EXPECT_EQ(SessionBlocks("a"), 0u);
  EXPECT_EQ(SessionBlocks("b"), 2u);
  EXPECT_EQ(VerifiedHits(a), 0u);
  EXPECT_EQ(VerifiedHits(b), 2u);
  EXPECT_EQ(VerifiedHits(c), 0u);
}

TEST_F(WarmAdoptTest, AdoptionNeedsAnEmptyEngine) {
  Restart();
  Put("a", Tokens(1, 1));
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
}

// Blocks keyed with a model identity come back keyed with it: the manifest
// keeps each block's model, and the adopted blocks match that model only.
TEST_F(WarmAdoptTest, AModelsBlocksComeBackAsThatModels) {
  Restart();
  tenant_.model = ModelId{BlockKey{0x5eed, 0x1d}};
  const auto a = Tokens(1, 4);
  Put("a", a);
  DemoteAll();
  ASSERT_TRUE(engine_->SaveWarm(Manifest(), true).ok());
  Restart();
  auto r = engine_->AdoptWarm(Manifest());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->adopted_blocks, 4u) << r->reason;
  EXPECT_EQ(r->adopted_sessions, 1u);
  EXPECT_EQ(engine_->GetSession(tenant_, "a")->model, tenant_.model);
  EXPECT_EQ(engine_->Match(ns_, Keys(a), a, tenant_.model), 4u);
  EXPECT_EQ(VerifiedHits(a), 4u);
  const ModelId mine = tenant_.model;
  tenant_.model = ModelId{};
  EXPECT_EQ(engine_->Match(ns_, Keys(a), a), 0u) << "not served to a client of no (or another) model";
  tenant_.model = mine;
}

}  // namespace
}  // namespace kvtier::tiering
