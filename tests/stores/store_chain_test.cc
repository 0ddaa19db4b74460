// StoreChain: the order stores are asked in, verification of what they return,
// write routing and the bound on queued writes. The stores here keep their
// values in memory (an honest BlockStore: what it is given it returns); the
// disk and Redis stores have their own tests against real files and servers.
#include "kvtier/stores/store_chain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace kvtier::stores {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kFingerprint = 42;
constexpr uint32_t kBt = 4;
constexpr size_t kPayload = 256;

// What a MemoryStore holds; shared with the test, so it outlives the chain.
struct MemoryData {
  std::mutex mu;
  std::map<std::string, std::string> values;
  bool down = false;
  // Each Get takes at least this long (a slow store), and asks for at most how many keys.
  std::chrono::milliseconds get_delay{0};
  size_t most_keys_per_get = 0;
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return values.size();
  }
  std::string at(const std::string& key) {
    std::lock_guard<std::mutex> l(mu);
    return values.at(key);
  }
};

class MemoryStore final : public BlockStore {
 public:
  MemoryStore(std::string kind, std::shared_ptr<MemoryData> data) : kind_(std::move(kind)), d_(std::move(data)) {}
  std::string_view kind() const override { return kind_; }
  std::string Describe() const override { return "memory " + kind_; }
  Result<size_t> Present(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> l(d_->mu);
    if (d_->down) return Unavailable(kind_ + " is down");
    size_t n = 0;
    while (n < keys.size() && d_->values.count(keys[n]) != 0) ++n;
    return n;
  }
  Result<std::vector<std::optional<StoreValue>>> Get(std::span<const std::string> keys,
                                                     uint64_t max_value_bytes) override {
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> l(d_->mu);
      delay = d_->get_delay;
      d_->most_keys_per_get = std::max(d_->most_keys_per_get, keys.size());
    }
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> l(d_->mu);
    if (d_->down) return Unavailable(kind_ + " is down");
    std::vector<std::optional<StoreValue>> out;
    for (const auto& k : keys) {
      auto it = d_->values.find(k);
      const bool fits = it != d_->values.end() && it->second.size() <= max_value_bytes;
      out.push_back(fits ? std::optional<StoreValue>(StoreValue::Copy(it->second)) : std::nullopt);
    }
    return out;
  }
  Status Put(std::span<const StoreItem> items) override {
    std::lock_guard<std::mutex> l(d_->mu);
    if (d_->down) return Unavailable(kind_ + " is down");
    for (const auto& i : items) d_->values[i.key] = i.value;
    return Status::Ok();
  }

 private:
  std::string kind_;
  std::shared_ptr<MemoryData> d_;
};

struct Chain {
  Namespace ns = Namespace::Make(kFingerprint, "t");
  std::vector<TokenId> tokens;
  std::vector<BlockKey> keys;
  explicit Chain(uint32_t blocks, uint32_t seed = 1, std::string_view tenant = "t")
      : ns(Namespace::Make(kFingerprint, tenant)) {
    for (uint32_t i = 0; i < blocks * kBt; ++i) tokens.push_back(seed * 1000 + i);
    keys.resize(blocks);
    ComputeKeys(ns, BlockKey{}, tokens, kBt, keys);
  }
  std::vector<std::byte> Payload(size_t i) const {
    std::vector<std::byte> p(kPayload);
    for (size_t j = 0; j < kPayload; ++j) p[j] = static_cast<std::byte>(i * 7 + j);
    return p;
  }
  std::span<const TokenId> Block(size_t i) const { return std::span(tokens).subspan(i * kBt, kBt); }
  BlockKey Parent(size_t i) const { return i == 0 ? BlockKey{} : keys[i - 1]; }
  std::string Record(size_t i) const {
    return EncodeBlockRecord({kFingerprint, keys[i], Parent(i), ns}, Block(i), Payload(i));
  }
  std::string Key(size_t i) const { return StoreKey("kvtier:", kFingerprint, keys[i]); }
  FetchRequest Request(size_t from) const {
    FetchRequest r;
    r.profile_fingerprint = kFingerprint;
    r.payload_bytes = kPayload;
    r.block_tokens = kBt;
    r.key_ns = ns;
    r.parent = Parent(from);
    r.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(from), keys.end());
    r.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(from * kBt), tokens.end());
    return r;
  }
};

class StoreChainTest : public ::testing::Test {
 protected:
  // Two stores: a "disk" that writes back, a "remote" that writes through.
  void Start(uint64_t queue_bytes = uint64_t{1} << 30, size_t max_events = 0,
             uint64_t fetch_chunk_bytes = StoreChainOptions{}.fetch_chunk_bytes) {
    auto d = std::make_unique<MemoryStore>("disk", disk_);
    auto r = std::make_unique<MemoryStore>("remote", remote_);
    std::vector<ChainedStore> stores;
    stores.push_back(ChainedStore{std::move(d), false});
    stores.push_back(ChainedStore{std::move(r), true});
    StoreChainOptions o;
    o.max_queued_bytes = queue_bytes;
    o.max_events = max_events;
    o.fetch_chunk_bytes = fetch_chunk_bytes;
    chain_ = std::make_unique<StoreChain>(std::move(stores), o, [this] {
      std::lock_guard<std::mutex> l(mu_);
      ++notified_;
      cv_.notify_all();
    });
  }
  FetchResult Fetch(FetchRequest r) { return Wait(chain_->StartFetch(std::move(r))); }
  FetchResult Wait(uint64_t id) {
    std::unique_lock<std::mutex> l(mu_);
    std::optional<FetchResult> out;
    cv_.wait_for(l, 10s, [&] { return (out = chain_->TakeFetch(id)).has_value(); });
    EXPECT_TRUE(out.has_value()) << "fetch did not complete";
    return out ? std::move(*out) : FetchResult{};
  }
  // Waits until the chain wrote what it queued.
  void Drain() {
    for (int i = 0; i < 500; ++i) {
      bool idle = true;
      for (const auto& s : chain_->stats()) idle = idle && s.queued_bytes == 0;
      if (idle) return;
      std::this_thread::sleep_for(2ms);
    }
    FAIL() << "queued writes were not written";
  }
  void ExpectPayloads(const FetchResult& r, const Chain& c, size_t from) {
    for (size_t i = 0; i < r.blocks(); ++i) {
      const auto want = c.Payload(from + i);
      ASSERT_EQ(r.payloads[i].size(), want.size());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), r.payloads[i].begin())) << "block " << from + i;
    }
  }

  std::shared_ptr<MemoryData> disk_ = std::make_shared<MemoryData>();
  std::shared_ptr<MemoryData> remote_ = std::make_shared<MemoryData>();
  std::unique_ptr<StoreChain> chain_;
  std::mutex mu_;
  std::condition_variable cv_;
  int notified_ = 0;
};

TEST_F(StoreChainTest, LandedBlocksGoToWriteThroughStoresAndDroppedOnesToWriteBackStores) {
  Start();
  const Chain c(3);
  for (size_t i = 0; i < 2; ++i) {
    const auto p = c.Payload(i);
    chain_->Offer({kFingerprint, c.keys[i], c.Parent(i), c.ns}, c.Block(i), p, /*dropped=*/false);
  }
  const auto p = c.Payload(2);
  chain_->Offer({kFingerprint, c.keys[2], c.Parent(2), c.ns}, c.Block(2), p, /*dropped=*/true);
  Drain();
  EXPECT_EQ(remote_->size(), 2u);
  EXPECT_EQ(disk_->size(), 1u);
  EXPECT_EQ(remote_->at(c.Key(0)), c.Record(0));
  EXPECT_EQ(disk_->at(c.Key(2)), c.Record(2));
  const auto st = chain_->stats();
  EXPECT_EQ(st[0].put_blocks, 1u);
  EXPECT_EQ(st[1].put_blocks, 2u);
  EXPECT_EQ(st[1].put_bytes, 2 * c.Record(0).size());
}

TEST_F(StoreChainTest, AFetchTakesTheLongestContinuationAcrossTheStoresInOrder) {
  Start();
  const Chain c(5);
  for (size_t i : {0, 1}) disk_->values[c.Key(i)] = c.Record(i);
  for (size_t i : {0, 1, 2, 3}) remote_->values[c.Key(i)] = c.Record(i);
  const FetchResult r = Fetch(c.Request(0));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.blocks(), 4u);
  EXPECT_EQ(r.store, (std::vector<uint8_t>{0, 0, 1, 1}));
  ExpectPayloads(r, c, 0);
  const auto st = chain_->stats();
  EXPECT_EQ(st[0].hit_blocks, 2u);
  EXPECT_EQ(st[0].miss_blocks, 3u);
  EXPECT_EQ(st[1].hit_blocks, 2u);
  EXPECT_EQ(st[1].miss_blocks, 1u);
  EXPECT_GE(notified_, 1);
  // From the middle of the chain: the parent is block 1's key.
  const FetchResult mid = Fetch(c.Request(2));
  ASSERT_EQ(mid.blocks(), 2u);
  ExpectPayloads(mid, c, 2);
}

// A fetch read everything in one batched Get per store: nothing of it was
// ready until all of it was, so an Acquire whose budget ran out got none of a
// long prefix the store was slow to give. Now it reads chunk by chunk, and
// TakeReady moves out the verified prefix while the fetch goes on.
TEST_F(StoreChainTest, TakeReadyMovesOutTheVerifiedPrefixWhileTheFetchGoesOnForTheRest) {
  const Chain c(40);
  Start(uint64_t{1} << 30, 0, /*fetch_chunk_bytes=*/4 * c.Record(0).size());  // Four blocks a Get.
  for (size_t i = 0; i < 40; ++i) disk_->values[c.Key(i)] = c.Record(i);
  disk_->get_delay = 10ms;
  const uint64_t id = chain_->StartFetch(c.Request(0));
  // Once a chunk is verified (the store's figures move as it goes), part of the fetch is ready.
  for (int i = 0; i < 1000 && chain_->stats()[0].hit_blocks == 0; ++i) std::this_thread::sleep_for(1ms);
  bool finished = true;
  const FetchResult first = chain_->TakeReady(id, &finished);
  EXPECT_FALSE(finished) << "ten turns of 10 ms: under way";
  ASSERT_GE(first.blocks(), 4u);
  ASSERT_LT(first.blocks(), 40u);
  EXPECT_EQ(first.payloads.size(), first.blocks());
  ExpectPayloads(first, c, 0);
  // The rest comes later, from where the ready prefix ended.
  const FetchResult rest = Wait(id);
  ASSERT_TRUE(rest.status.ok()) << rest.status.ToString();
  EXPECT_EQ(first.blocks() + rest.blocks(), 40u);
  ExpectPayloads(rest, c, first.blocks());
  EXPECT_EQ(disk_->most_keys_per_get, 4u);
  const auto st = chain_->stats();
  EXPECT_EQ(st[0].hit_blocks, 40u);
  EXPECT_EQ(st[0].miss_blocks, 0u);
  EXPECT_EQ(st[0].fetches, 1u) << "one fetch, however many turns";
  EXPECT_EQ(st[1].fetches, 0u) << "the next store is not asked: the first held them all";
  EXPECT_EQ(st[0].fetched_bytes, 40 * c.Record(0).size()) << "each record read once";
  // A finished fetch's TakeReady is its result, then it is forgotten.
  const uint64_t small = chain_->StartFetch(Chain(2).Request(0));
  (void)Wait(small);
  (void)chain_->TakeReady(small, &finished);
  EXPECT_TRUE(finished);
}

TEST_F(StoreChainTest, AFetchThatStopsInOneStoreGoesOnInTheNextAcrossChunks) {
  const Chain c(10);
  Start(uint64_t{1} << 30, 0, /*fetch_chunk_bytes=*/3 * c.Record(0).size());
  for (size_t i = 0; i < 7; ++i) disk_->values[c.Key(i)] = c.Record(i);
  for (size_t i = 0; i < 10; ++i) remote_->values[c.Key(i)] = c.Record(i);
  const FetchResult r = Fetch(c.Request(0));
  ASSERT_EQ(r.blocks(), 10u);
  EXPECT_EQ(r.store, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
  ExpectPayloads(r, c, 0);
  const auto st = chain_->stats();
  EXPECT_EQ(st[0].hit_blocks, 7u);
  EXPECT_EQ(st[0].miss_blocks, 3u);
  EXPECT_EQ(st[1].hit_blocks, 3u);
  EXPECT_EQ(st[1].miss_blocks, 0u);
}

// One I/O thread served fetches whole, in order: a tenant's short fetch queued
// behind another tenant's long one waited for all of it. Now the tenants take
// turns a chunk each.
TEST_F(StoreChainTest, AShortFetchQueuedBehindAnotherTenantsLongOneCompletesFirst) {
  const Chain long_chain(40, 1, "a"), short_chain(2, 2, "b");
  Start(uint64_t{1} << 30, 0, /*fetch_chunk_bytes=*/4 * long_chain.Record(0).size());
  for (size_t i = 0; i < 40; ++i) disk_->values[long_chain.Key(i)] = long_chain.Record(i);
  for (size_t i = 0; i < 2; ++i) disk_->values[short_chain.Key(i)] = short_chain.Record(i);
  disk_->get_delay = 10ms;
  const uint64_t long_id = chain_->StartFetch(long_chain.Request(0));
  const FetchResult short_result = Fetch(short_chain.Request(0));
  EXPECT_EQ(short_result.blocks(), 2u);
  // Turn order, not timing: the long fetch had at most two turns of its ten.
  EXPECT_FALSE(chain_->TakeFetch(long_id).has_value()) << "the long fetch is still under way";
  EXPECT_LE(chain_->stats()[0].hit_blocks, 2u + 8u);
  EXPECT_EQ(Wait(long_id).blocks(), 40u);
}

TEST_F(StoreChainTest, ACancelledFetchUnderWayStopsAtItsNextTurn) {
  const Chain c(40);
  Start(uint64_t{1} << 30, 0, /*fetch_chunk_bytes=*/4 * c.Record(0).size());
  for (size_t i = 0; i < 40; ++i) disk_->values[c.Key(i)] = c.Record(i);
  disk_->get_delay = 5ms;
  const uint64_t id = chain_->StartFetch(c.Request(0));
  for (int i = 0; i < 1000 && chain_->stats()[0].hit_blocks == 0; ++i) std::this_thread::sleep_for(1ms);
  chain_->CancelFetch(id);
  const Chain later(2, 3);
  {
    std::lock_guard<std::mutex> l(disk_->mu);  // The I/O thread may be in a Get.
    for (size_t i = 0; i < 2; ++i) disk_->values[later.Key(i)] = later.Record(i);
  }
  EXPECT_EQ(Fetch(later.Request(0)).blocks(), 2u) << "a later fetch completes";
  EXPECT_LT(chain_->stats()[0].hit_blocks, 40u + 2u) << "the cancelled one read no further";
  bool finished = false;
  EXPECT_EQ(chain_->TakeReady(id, &finished).blocks(), 0u);
  EXPECT_TRUE(finished);
  EXPECT_FALSE(chain_->TakeFetch(id).has_value());
}

TEST_F(StoreChainTest, ALocateSaysWhichStoreAFetchWouldReadEachBlockFromAndReadsNone) {
  Start();
  const Chain c(5);
  for (size_t i : {0, 1}) disk_->values[c.Key(i)] = c.Record(i);
  for (size_t i : {0, 1, 2, 3}) remote_->values[c.Key(i)] = c.Record(i);
  FetchRequest r;
  r.profile_fingerprint = kFingerprint;
  r.keys = c.keys;
  r.locate = true;
  const FetchResult where = Fetch(r);
  ASSERT_TRUE(where.status.ok()) << where.status.ToString();
  EXPECT_EQ(where.store, (std::vector<uint8_t>{0, 0, 1, 1})) << "block 4 is in no store";
  EXPECT_EQ(where.blocks(), 0u) << "no record is read";
  for (const auto& st : chain_->stats()) {
    EXPECT_EQ(st.fetches, 0u);
    EXPECT_EQ(st.hit_blocks + st.miss_blocks + st.fetched_bytes, 0u) << "a locate is no fetch";
  }
  // A store that is down is passed by, its error counted.
  disk_->down = true;
  const FetchResult without = Fetch(r);
  EXPECT_EQ(without.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(without.store, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(chain_->stats()[0].errors, 1u);
}

TEST_F(StoreChainTest, ARecordThatFailsVerificationIsAMissAndTheNextStoreIsAsked) {
  Start();
  const Chain c(3);
  const Chain other(3, /*seed=*/2);
  std::string bad = c.Record(1);
  bad[bad.size() - 1] ^= 1;  // A payload byte.
  disk_->values[c.Key(0)] = c.Record(0);
  disk_->values[c.Key(1)] = bad;
  disk_->values[c.Key(2)] = c.Record(2);
  remote_->values[c.Key(1)] = other.Record(1);  // Another chain's block under this key.
  const FetchResult r = Fetch(c.Request(0));
  EXPECT_EQ(r.blocks(), 1u) << "nothing after a block no store holds intact";
  const auto st = chain_->stats();
  EXPECT_EQ(st[0].corrupt, 1u);
  EXPECT_EQ(st[1].foreign, 1u);
  // Fixed in the remote store: the fetch goes on there, and on past it in the same store only.
  remote_->values[c.Key(1)] = c.Record(1);
  const FetchResult again = Fetch(c.Request(0));
  EXPECT_EQ(again.blocks(), 2u);
  EXPECT_EQ(again.store, (std::vector<uint8_t>{0, 1}));
}

// The block events the daemon publishes in vLLM's STORAGE medium.
TEST_F(StoreChainTest, WritesOfReportedBlocksAndBlocksAStoreWasFoundWithoutAreCollectedInOrder) {
  Start(uint64_t{1} << 30, /*max_events=*/16);
  const Chain c(5);
  auto offer = [&](size_t i, bool dropped, bool reported) {
    const auto p = c.Payload(i);
    chain_->Offer({kFingerprint, c.keys[i], c.Parent(i), c.ns}, c.Block(i), p, dropped, reported);
  };
  offer(0, /*dropped=*/false, /*reported=*/true);   // remote (through)
  offer(1, /*dropped=*/false, /*reported=*/false);  // remote, not reported (an isolated tenant's)
  offer(2, /*dropped=*/true, /*reported=*/true);    // disk (back)
  Drain();
  using K = StoreEvent::Kind;
  std::vector<StoreEvent> e = chain_->TakeEvents();
  ASSERT_EQ(e.size(), 2u);
  std::sort(e.begin(), e.end(), [](const StoreEvent& x, const StoreEvent& y) { return x.store < y.store; });
  EXPECT_EQ(e[0].kind, K::kWritten);
  EXPECT_EQ(e[0].store, 0u);
  EXPECT_EQ(e[0].key, c.keys[2]);
  EXPECT_EQ(e[0].parent, c.keys[1]);
  EXPECT_EQ(e[0].tokens, std::vector<TokenId>(c.Block(2).begin(), c.Block(2).end()));
  EXPECT_EQ(e[1].store, 1u);
  EXPECT_EQ(e[1].key, c.keys[0]);
  EXPECT_TRUE(e[1].parent.IsNull());
  EXPECT_TRUE(chain_->TakeEvents().empty()) << "taken once";

  // A fetch: the disk holds block 0 and 2 (not 1), the remote 0 and 1 (not 2).
  remote_->values.erase(c.Key(0));
  disk_->values[c.Key(0)] = c.Record(0);
  remote_->values[c.Key(1)] = c.Record(1);
  EXPECT_EQ(Fetch(c.Request(0)).blocks(), 2u);
  e = chain_->TakeEvents();
  ASSERT_EQ(e.size(), 2u) << "per store, the first block it was asked for and lacked";
  EXPECT_EQ(e[0].kind, K::kGone);
  EXPECT_EQ(e[0].store, 0u);
  EXPECT_EQ(e[0].key, c.keys[1]);
  EXPECT_EQ(e[1].kind, K::kGone);
  EXPECT_EQ(e[1].store, 1u);
  EXPECT_EQ(e[1].key, c.keys[2]);
  // A locate learns as much, and a store that is down says nothing.
  disk_->down = true;
  FetchRequest r;
  r.profile_fingerprint = kFingerprint;
  r.keys = c.keys;
  r.locate = true;
  (void)Fetch(r);
  e = chain_->TakeEvents();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].store, 1u);
  EXPECT_EQ(e[0].key, c.keys[0]);
}

TEST_F(StoreChainTest, BlockEventsPastTheBoundAreDroppedAndCountedAndNoneAreCollectedWithoutOne) {
  Start(uint64_t{1} << 30, /*max_events=*/2);
  const Chain c(3);
  for (size_t i = 0; i < 3; ++i) {
    const auto p = c.Payload(i);
    chain_->Offer({kFingerprint, c.keys[i], c.Parent(i), c.ns}, c.Block(i), p, /*dropped=*/false, true);
  }
  Drain();
  EXPECT_EQ(chain_->TakeEvents().size(), 2u);
  EXPECT_EQ(chain_->dropped_events(), 1u);
  chain_.reset();
  Start();
  const auto p = c.Payload(0);
  chain_->Offer({kFingerprint, c.keys[0], c.Parent(0), c.ns}, c.Block(0), p, /*dropped=*/false, true);
  Drain();
  EXPECT_EQ(Fetch(Chain(2, /*seed=*/7).Request(0)).blocks(), 0u) << "a miss in both stores";
  EXPECT_TRUE(chain_->TakeEvents().empty());
  EXPECT_EQ(chain_->dropped_events(), 0u);
}

TEST_F(StoreChainTest, AStoreThatIsDownIsSkippedAndCounted) {
  Start();
  const Chain c(2);
  disk_->down = true;
  for (size_t i : {0, 1}) remote_->values[c.Key(i)] = c.Record(i);
  const FetchResult r = Fetch(c.Request(0));
  EXPECT_EQ(r.blocks(), 2u);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(chain_->stats()[0].errors, 1u);
  remote_->down = true;
  const auto p = c.Payload(0);
  chain_->Offer({kFingerprint, c.keys[0], c.Parent(0), c.ns}, c.Block(0), p, false);
  Drain();
  EXPECT_EQ(chain_->stats()[1].errors, 1u);
  EXPECT_EQ(Fetch(c.Request(0)).blocks(), 0u);
}

TEST_F(StoreChainTest, OffersPastTheQueueBoundAreDroppedAndCountedNeverWaitedFor) {
  Start(/*queue_bytes=*/1);  // Nothing fits.
  const Chain c(1);
  const auto p = c.Payload(0);
  chain_->Offer({kFingerprint, c.keys[0], c.Parent(0), c.ns}, c.Block(0), p, false);
  chain_->Offer({kFingerprint, c.keys[0], c.Parent(0), c.ns}, c.Block(0), p, true);
  Drain();
  const auto st = chain_->stats();
  EXPECT_EQ(st[0].put_dropped, 1u);
  EXPECT_EQ(st[1].put_dropped, 1u);
  EXPECT_EQ(remote_->size(), 0u);
}

TEST_F(StoreChainTest, ACancelledFetchIsNeverReturned) {
  Start();
  const Chain c(2);
  for (size_t i : {0, 1}) disk_->values[c.Key(i)] = c.Record(i);
  const uint64_t id = chain_->StartFetch(c.Request(0));
  chain_->CancelFetch(id);
  // A later fetch completes; the cancelled one never shows up.
  EXPECT_EQ(Fetch(c.Request(0)).blocks(), 2u);
  EXPECT_FALSE(chain_->TakeFetch(id).has_value());
}

TEST_F(StoreChainTest, WhatIsQueuedIsWrittenWhenTheChainStops) {
  Start();
  const Chain c(8);
  for (size_t i = 0; i < 8; ++i) {
    const auto p = c.Payload(i);
    chain_->Offer({kFingerprint, c.keys[i], c.Parent(i), c.ns}, c.Block(i), p, false);
  }
  chain_.reset();
  EXPECT_EQ(remote_->size(), 8u);
}

TEST_F(StoreChainTest, AtShutdownOffersWaitForQueueRoomInsteadOfBeingDropped) {
  const Chain c(6);
  Start(/*queue_bytes=*/c.Record(0).size());  // One record at a time.
  chain_->WaitForRoomUntil(std::chrono::steady_clock::now() + 10s);
  for (size_t i = 0; i < 6; ++i) {
    const auto p = c.Payload(i);
    chain_->Offer({kFingerprint, c.keys[i], c.Parent(i), c.ns}, c.Block(i), p, /*dropped=*/true);
  }
  Drain();
  EXPECT_EQ(disk_->size(), 6u);
  EXPECT_EQ(chain_->stats()[0].put_dropped, 0u);
}

}  // namespace
}  // namespace kvtier::stores
