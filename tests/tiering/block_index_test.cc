// BlockIndex (the daemon's writer of the shared index), checked against a
// std::unordered_map under churn, at exact table positions across the wrap-around,
// and against a concurrent IndexView reader.
#include "block_index.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvtier/shm_segment.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

constexpr uint32_t kBlockTokens = 4;

// The index plus a second, read-only mapping of its segment (what a client sees).
struct Mapped {
  BlockIndex index;
  ShmSegment mapping;
  IndexView view;

  const IndexHeader& header() const { return view.header(); }
  const IndexSlot* table() const { return reinterpret_cast<const IndexSlot*>(mapping.data() + header().table_offset); }
};

std::unique_ptr<Mapped> MakeIndex(uint32_t max_records) {
  auto index = BlockIndex::Create("/" + testing::UniqueShmPrefix("block-index"), kBlockTokens, max_records, 42);
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  if (!index.ok()) return nullptr;
  auto seg = ShmSegment::MapPassed(index->share_fd(), false, sizeof(IndexHeader), "index");
  EXPECT_TRUE(seg.ok()) << seg.status().ToString();
  if (!seg.ok()) return nullptr;
  auto view = IndexView::Attach(seg->data(), seg->size());
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  if (!view.ok()) return nullptr;
  return std::unique_ptr<Mapped>(new Mapped{std::move(index).value(), std::move(seg).value(), *view});
}

// Tokens stored for `key` in these tests: a function of the key.
std::vector<TokenId> TokensOf(const BlockKey& key) {
  return {static_cast<TokenId>(key.lo), static_cast<TokenId>(key.lo >> 32), static_cast<TokenId>(key.hi),
          static_cast<TokenId>(key.hi >> 32)};
}

BlockKey ParentOf(const BlockKey& key) { return BlockKey{key.hi ^ 0x5555, key.lo + 1}; }

// Every entry is reachable from its home slot without crossing an empty slot, the
// occupied count equals size(), and no key appears twice.
::testing::AssertionResult TableIsConsistent(const Mapped& m) {
  const uint32_t slots = m.header().table_slots;
  const IndexSlot* t = m.table();
  uint32_t occupied = 0;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> seen;
  for (uint32_t pos = 0; pos < slots; ++pos) {
    if (t[pos].seq & 1u) return ::testing::AssertionFailure() << "slot " << pos << " left odd";
    if (t[pos].record == kNoRecord) continue;
    ++occupied;
    const BlockKey key{t[pos].key_lo, t[pos].key_hi};
    if (!seen.emplace(key, pos).second) return ::testing::AssertionFailure() << "key twice: " << key.ToHex();
    for (uint32_t p = HomeSlot(key, slots); p != pos; p = (p + 1) & (slots - 1)) {
      if (t[p].record == kNoRecord) {
        return ::testing::AssertionFailure() << "key at " << pos << " unreachable: empty slot " << p;
      }
    }
  }
  if (occupied != m.index.size()) {
    return ::testing::AssertionFailure() << occupied << " occupied slots, size() " << m.index.size();
  }
  if (LoadRelaxed(m.header().entries) != occupied) return ::testing::AssertionFailure() << "header entries off";
  return ::testing::AssertionSuccess();
}

void Put(Mapped& m, const BlockKey& key, uint32_t record, Tier tier = Tier::kGpu) {
  m.index.WriteRow(record, ParentOf(key), TokensOf(key));
  m.index.Insert(key, record, 9, tier);
}

BlockKey KeyAtHome(uint32_t home, uint64_t salt) { return BlockKey{(salt << 32) | home, salt * 7 + 1}; }

TEST(BlockIndexTest, CreateValidates) {
  EXPECT_EQ(BlockIndex::Create("/" + testing::UniqueShmPrefix("bi"), kBlockTokens, 0, 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockIndex::Create("", kBlockTokens, 8, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockIndex::Create("/", kBlockTokens, 8, 1).status().code(), StatusCode::kInvalidArgument);
}

// The index is nameless: a segment of its label in /dev/shm (a crashed run's,
// or one a squatter made) neither stands in the way nor is used.
TEST(BlockIndexTest, ANamedSegmentOfItsLabelIsNeitherAnObstacleNorUsed) {
  const std::string name = "/" + testing::UniqueShmPrefix("bi-stale");
  auto squat = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(squat.ok());
  auto index = BlockIndex::Create(name, kBlockTokens, 8, 1);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->segment_name(), "memfd:" + name.substr(1));
  auto seg = ShmSegment::MapPassed(index->share_fd(), false, sizeof(IndexHeader), "index");
  ASSERT_TRUE(seg.ok());
  EXPECT_TRUE(IndexView::Attach(seg->data(), seg->size()).ok());
  EXPECT_FALSE(IndexView::Attach(squat->data(), squat->size()).ok()) << "the squatted segment was left untouched";
}

TEST(BlockIndexTest, OthersMapItReadOnlyOnly) {
  auto m = MakeIndex(8);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(ShmSegment::MapPassed(m->index.share_fd(), /*writable=*/true, 1, "index").ok());
  EXPECT_NE(::ftruncate(m->index.share_fd(), 0), 0);
}

// Probes end after one pass over the table, and an entry whose record lies
// outside the rows is no entry: no table content makes a lookup loop or read
// out of bounds (the attack that filled every slot of a client-writable index
// made the daemon spin forever; one pointing at record 0x7ffffff0 crashed it).
TEST(BlockIndexTest, AFullTableAndWildRecordIdsAreMissesNotHangsOrCrashes) {
  auto m = MakeIndex(4);
  ASSERT_NE(m, nullptr);
  const uint32_t slots = m->header().table_slots;
  for (uint32_t i = 0; i < slots; ++i) m->index.Insert(KeyAtHome(i, i + 1), i % 4, 1, Tier::kGpu);
  ASSERT_EQ(m->index.size(), slots) << "every slot taken, as the engine never does";
  EXPECT_EQ(m->index.Find(KeyAtHome(0, 999)), kNoRecord);
  EXPECT_FALSE(m->index.Erase(KeyAtHome(1, 999)));
  EXPECT_FALSE(m->index.SetLocation(KeyAtHome(2, 999), Tier::kHost, false));
  EXPECT_EQ(m->index.Find(KeyAtHome(3, 4)), 3u % 4);
  std::vector<TokenId> tokens(kBlockTokens, 1);
  EXPECT_FALSE(m->view.Find(KeyAtHome(0, 999), BlockKey{}, 1, tokens, nullptr));

  auto wild = MakeIndex(4);
  ASSERT_NE(wild, nullptr);
  wild->index.Insert(KeyAtHome(5, 1), 0x7ffffff0u, 1, Tier::kGpu);
  EXPECT_EQ(wild->index.Find(KeyAtHome(5, 1)), kNoRecord);
  uint32_t rec = 0;
  EXPECT_EQ(wild->index.FindPrefix(std::vector<BlockKey>{KeyAtHome(5, 1)}, 1, std::span<uint32_t>(&rec, 1)), 0u);
}

TEST(BlockIndexTest, InsertFindEraseBasics) {
  auto m = MakeIndex(16);
  ASSERT_NE(m, nullptr);
  const BlockKey a{100, 1}, b{101, 2};
  EXPECT_EQ(m->index.Find(a), kNoRecord);
  EXPECT_FALSE(m->index.Erase(a));
  Put(*m, a, 3);
  Put(*m, b, 4, Tier::kHost);
  EXPECT_EQ(m->index.size(), 2u);
  EXPECT_EQ(m->index.Find(a), 3u);
  EXPECT_EQ(m->index.Find(b), 4u);
  EXPECT_EQ(m->index.parent(3), ParentOf(a));
  EXPECT_TRUE(m->index.RowMatches(3, ParentOf(a), TokensOf(a)));
  EXPECT_FALSE(m->index.RowMatches(3, ParentOf(b), TokensOf(a)));
  EXPECT_FALSE(m->index.RowMatches(3, ParentOf(a), TokensOf(b)));
  std::vector<TokenId> stored(m->index.tokens(3), m->index.tokens(3) + kBlockTokens);
  EXPECT_EQ(stored, TokensOf(a));

  std::vector<BlockKey> keys = {a, BlockKey{5, 5}, b};
  std::vector<uint32_t> records(3, 0);
  m->index.FindBatch(keys, records);
  EXPECT_EQ(records, (std::vector<uint32_t>{3, kNoRecord, 4}));

  // The prefix form stops at the first miss and treats an entry of another
  // namespace as absent.
  EXPECT_EQ(m->index.FindPrefix(keys, 9, records), 1u);
  EXPECT_EQ(records[0], 3u);
  std::vector<BlockKey> both = {a, b};
  EXPECT_EQ(m->index.FindPrefix(both, 9, records), 2u);
  EXPECT_EQ(records[0], 3u);
  EXPECT_EQ(records[1], 4u);
  EXPECT_EQ(m->index.FindPrefix(both, 8, records), 0u);
  EXPECT_EQ(m->index.FindPrefix(std::span<const BlockKey>(both).first(0), 9, records), 0u);

  int visited = 0;
  m->index.ForEach([&](const BlockKey& k, const IndexSlot& s) {
    ++visited;
    EXPECT_TRUE(k == a || k == b);
    EXPECT_EQ(s.record, k == a ? 3u : 4u);
    EXPECT_EQ(s.tier, static_cast<uint8_t>(k == a ? Tier::kGpu : Tier::kHost));
  });
  EXPECT_EQ(visited, 2);

  EXPECT_TRUE(m->index.Erase(a));
  EXPECT_FALSE(m->index.Erase(a));
  EXPECT_EQ(m->index.Find(a), kNoRecord);
  EXPECT_EQ(m->index.Find(b), 4u);
  EXPECT_EQ(m->index.size(), 1u);
  EXPECT_TRUE(TableIsConsistent(*m));
}

TEST(BlockIndexTest, BackwardShiftAcrossTheWrapAround) {
  auto m = MakeIndex(32);  // 64 slots.
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->header().table_slots, 64u);
  const IndexSlot* t = m->table();
  const BlockKey a = KeyAtHome(62, 1), b = KeyAtHome(62, 2), c = KeyAtHome(62, 3), d = KeyAtHome(63, 4),
                 e = KeyAtHome(0, 5);
  Put(*m, a, 0);
  Put(*m, b, 1);
  Put(*m, c, 2);
  Put(*m, d, 3);
  Put(*m, e, 4);
  auto at = [&](uint32_t pos) { return t[pos].record; };
  ASSERT_EQ(at(62), 0u);
  ASSERT_EQ(at(63), 1u);
  ASSERT_EQ(at(0), 2u);
  ASSERT_EQ(at(1), 3u);
  ASSERT_EQ(at(2), 4u);

  // Erasing the head of the run pulls every later member back by one, across the end.
  ASSERT_TRUE(m->index.Erase(a));
  EXPECT_EQ(at(62), 1u);
  EXPECT_EQ(at(63), 2u);
  EXPECT_EQ(at(0), 3u);
  EXPECT_EQ(at(1), 4u);
  EXPECT_EQ(at(2), kNoRecord);
  EXPECT_TRUE(TableIsConsistent(*m));
  EXPECT_EQ(m->index.Find(b), 1u);
  EXPECT_EQ(m->index.Find(c), 2u);
  EXPECT_EQ(m->index.Find(d), 3u);
  EXPECT_EQ(m->index.Find(e), 4u);

  // An entry sitting at its home (slot 0) is never pulled back across the wrap.
  const BlockKey f = KeyAtHome(0, 6);  // Lands at slot 2.
  Put(*m, f, 5);
  ASSERT_EQ(at(2), 5u);
  ASSERT_TRUE(m->index.Erase(c));  // Slot 63.
  EXPECT_EQ(at(62), 1u);
  EXPECT_EQ(at(63), 3u) << "d (home 63) moves into its home";
  EXPECT_EQ(at(0), 4u) << "e (home 0) moves into its home";
  EXPECT_EQ(at(1), 5u) << "f (home 0) moves back by one";
  EXPECT_EQ(at(2), kNoRecord);
  EXPECT_TRUE(TableIsConsistent(*m));

  ASSERT_TRUE(m->index.Erase(d));  // Slot 63: e and f stay, e is at home.
  EXPECT_EQ(at(63), kNoRecord);
  EXPECT_EQ(at(0), 4u);
  EXPECT_EQ(at(1), 5u);
  EXPECT_TRUE(TableIsConsistent(*m));
  EXPECT_EQ(m->index.Find(b), 1u);
  EXPECT_EQ(m->index.Find(e), 4u);
  EXPECT_EQ(m->index.Find(f), 5u);
  EXPECT_EQ(m->index.Find(c), kNoRecord);
  EXPECT_EQ(m->index.Find(d), kNoRecord);
  EXPECT_EQ(m->index.size(), 3u);
}

TEST(BlockIndexTest, RandomChurnMatchesAReferenceMap) {
  constexpr uint32_t kRecords = 256;
  auto m = MakeIndex(kRecords);
  ASSERT_NE(m, nullptr);
  const uint32_t slots = m->header().table_slots;
  std::mt19937_64 rng(20240611);
  // Homes cluster at the end of the table (runs wrap around), at its start, and in one
  // hot spot in the middle; the rest spread out.
  auto random_key = [&]() {
    uint64_t home = 0;
    switch (rng() % 4) {
      case 0:
        home = slots - 1 - rng() % 12;
        break;
      case 1:
        home = rng() % 6;
        break;
      case 2:
        home = slots / 2 + rng() % 4;
        break;
      default:
        home = rng() % slots;
        break;
    }
    return BlockKey{(rng() << 32) | home, rng()};
  };
  struct Value {
    uint32_t record;
    Tier tier;
    bool moving;
  };
  std::unordered_map<BlockKey, Value, BlockKeyHash> model;
  std::vector<BlockKey> present;
  std::vector<uint32_t> free_records;
  for (uint32_t r = 0; r < kRecords; ++r) free_records.push_back(r);
  const uint32_t tag = 9;

  auto check_key = [&](const BlockKey& k) {
    auto it = model.find(k);
    const uint32_t want = it == model.end() ? kNoRecord : it->second.record;
    ASSERT_EQ(m->index.Find(k), want) << k.ToHex();
    IndexEntry e;
    const bool hit = m->view.Find(k, ParentOf(k), tag, TokensOf(k), &e);
    ASSERT_EQ(hit, it != model.end()) << k.ToHex();
    if (hit) {
      EXPECT_EQ(e.record, it->second.record);
      EXPECT_EQ(e.tier, it->second.tier);
      EXPECT_EQ(e.moving, it->second.moving);
    }
  };

  size_t max_size = 0;
  for (int step = 0; step < 40000; ++step) {
    const uint64_t op = rng() % 100;
    // Grow towards full, then churn around high occupancy.
    const bool can_insert = !free_records.empty();
    if (op < 50 && can_insert) {
      BlockKey k = random_key();
      while (model.count(k)) k = random_key();
      const uint32_t r = free_records.back();
      free_records.pop_back();
      const Tier tier = rng() % 2 ? Tier::kGpu : Tier::kHost;
      Put(*m, k, r, tier);
      model.emplace(k, Value{r, tier, false});
      present.push_back(k);
    } else if (op < 90 && !present.empty()) {
      const size_t i = rng() % present.size();
      const BlockKey k = present[i];
      present[i] = present.back();
      present.pop_back();
      ASSERT_TRUE(m->index.Erase(k));
      free_records.push_back(model.at(k).record);
      model.erase(k);
      check_key(k);
    } else if (op < 95 && !present.empty()) {
      const BlockKey k = present[rng() % present.size()];
      Value& v = model.at(k);
      v.tier = rng() % 2 ? Tier::kGpu : Tier::kHost;
      v.moving = rng() % 2;
      ASSERT_TRUE(m->index.SetLocation(k, v.tier, v.moving));
    } else {
      const BlockKey k = random_key();
      if (!model.count(k)) {
        ASSERT_FALSE(m->index.Erase(k));
        ASSERT_FALSE(m->index.SetLocation(k, Tier::kGpu, false));
      }
      check_key(k);
    }
    if (HasFatalFailure()) return;
    max_size = std::max<size_t>(max_size, model.size());
    ASSERT_EQ(m->index.size(), model.size());
    if (!present.empty()) check_key(present[rng() % present.size()]);
    if (step % 500 == 0) {
      ASSERT_TRUE(TableIsConsistent(*m)) << "step " << step;
      for (const BlockKey& k : present) check_key(k);
    }
  }
  EXPECT_EQ(max_size, kRecords) << "the churn should have filled the index";
  ASSERT_TRUE(TableIsConsistent(*m));
  for (const BlockKey& k : present) check_key(k);
  // Drain completely.
  for (const BlockKey& k : present) ASSERT_TRUE(m->index.Erase(k));
  EXPECT_EQ(m->index.size(), 0u);
  for (uint32_t pos = 0; pos < slots; ++pos) EXPECT_EQ(m->table()[pos].record, kNoRecord);
}

TEST(BlockIndexTest, ConcurrentReaderNeverSeesATornEntry) {
  // One key K is published again and again for two different blocks, variant A and
  // variant B (same key, other parent and last token, as in a hash collision), often
  // reusing the same record row. Variant A is always published in the GPU tier and
  // never moving; B always in the host tier. Neighbours sharing K's home slot are
  // inserted and erased around it, so K's entry is shifted back and forth. A reader
  // that pairs a slot from one publication with a row from another would report a
  // hit with the wrong tier; the seqlock must prevent that.
  auto m = MakeIndex(16);
  ASSERT_NE(m, nullptr);
  const uint32_t home = 20;
  const BlockKey k = KeyAtHome(home, 77);
  const BlockKey parent[2] = {BlockKey{11, 12}, BlockKey{11, 13}};
  const std::vector<TokenId> tokens[2] = {{1, 2, 3, 4}, {1, 2, 3, 5}};
  const Tier tier[2] = {Tier::kGpu, Tier::kHost};
  const uint32_t tag = 3;
  std::vector<BlockKey> neighbours;
  for (uint64_t i = 0; i < 6; ++i) neighbours.push_back(KeyAtHome(home - 1 + static_cast<uint32_t>(i % 3), 100 + i));

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hits[2] = {0, 0}, wrong{0}, neighbour_hits{0}, probes{0};
  std::thread reader([&] {
    const IndexView view = m->view;
    while (!stop.load(std::memory_order_relaxed)) {
      for (int v = 0; v < 2; ++v) {
        IndexEntry e;
        if (view.Find(k, parent[v], tag, tokens[v], &e)) {
          hits[v].fetch_add(1, std::memory_order_relaxed);
          if (e.tier != tier[v] || (v == 0 && e.moving) || e.record >= 16) wrong.fetch_add(1);
        }
      }
      for (size_t i = 0; i < neighbours.size(); ++i) {
        IndexEntry e;
        if (view.Find(neighbours[i], ParentOf(neighbours[i]), tag, TokensOf(neighbours[i]), &e)) {
          neighbour_hits.fetch_add(1, std::memory_order_relaxed);
          if (e.tier != (i % 2 ? Tier::kHost : Tier::kGpu) || e.record >= 16) wrong.fetch_add(1);
        }
      }
      probes.fetch_add(1, std::memory_order_relaxed);
    }
  });

  std::mt19937 rng(7);
  std::vector<uint32_t> free_records = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<uint32_t> neighbour_record(neighbours.size(), kNoRecord);
  auto take = [&] {
    // Reuse the most recently freed record: rows are rewritten while readers may
    // still be looking at them.
    const uint32_t r = free_records.back();
    free_records.pop_back();
    return r;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
  uint64_t rounds = 0;
  while (std::chrono::steady_clock::now() < deadline || hits[0].load() == 0 || hits[1].load() == 0) {
    const int v = static_cast<int>(rng() % 2);
    const uint32_t r = take();
    m->index.WriteRow(r, parent[v], tokens[v]);
    m->index.Insert(k, r, tag, tier[v]);
    if (v == 1 && rng() % 2) m->index.SetLocation(k, tier[v], true);
    for (int j = 0; j < 3; ++j) {
      const size_t i = rng() % neighbours.size();
      if (neighbour_record[i] == kNoRecord) {
        neighbour_record[i] = take();
        m->index.WriteRow(neighbour_record[i], ParentOf(neighbours[i]), TokensOf(neighbours[i]));
        m->index.Insert(neighbours[i], neighbour_record[i], tag, i % 2 ? Tier::kHost : Tier::kGpu);
      } else {
        if (!m->index.Erase(neighbours[i])) ADD_FAILURE() << "neighbour " << i << " vanished";
        free_records.push_back(neighbour_record[i]);
        neighbour_record[i] = kNoRecord;
      }
    }
    if (!m->index.Erase(k)) {
      ADD_FAILURE() << "K vanished";
      break;
    }
    free_records.push_back(r);
    ++rounds;
    if (std::chrono::steady_clock::now() > deadline + std::chrono::seconds(5)) break;  // Liveness guard.
  }
  stop = true;
  reader.join();
  EXPECT_EQ(wrong.load(), 0u) << "a reader saw a torn entry";
  EXPECT_GT(hits[0].load(), 0u);
  EXPECT_GT(hits[1].load(), 0u);
  EXPECT_GT(neighbour_hits.load(), 0u);
  EXPECT_TRUE(TableIsConsistent(*m));
  RecordProperty("writer_rounds", std::to_string(rounds));
  RecordProperty("reader_probes", std::to_string(probes.load()));
}

}  // namespace
}  // namespace kvtier::tiering
