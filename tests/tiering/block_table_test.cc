// BlockTable: a record per block, its slot and its index entry, the tenant's
// counts and the KV events, as blocks are published, doomed and freed.
#include "block_table.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "engine_parts_test_support.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

static_assert(OtherTier(Tier::kGpu) == Tier::kHost && OtherTier(Tier::kHost) == Tier::kGpu);

// A BlockEvent with its tokens copied (the event's span is valid during the call only).
struct Event {
  BlockEventKind kind;
  BlockKey key, parent;
  Tier tier, from;
  std::vector<TokenId> tokens;
};

class BlockTableTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kGpuSlots = 4;
  static constexpr uint32_t kHostSlots = 2;

  void SetUp() override {
    auto index = BlockIndex::Create("/" + testing::UniqueShmPrefix("block-table"), kBt, kGpuSlots + kHostSlots,
                                    TestProfile().Fingerprint());
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    table_.emplace(std::move(index).value(), kGpuSlots, kHostSlots);
    table_->set_observer([this](const BlockEvent& e) {
      events_.push_back(Event{e.kind, e.key, e.parent, e.tier, e.from, {e.tokens.begin(), e.tokens.end()}});
    });
  }

  // Publishes block `n` of the tenant in a fresh slot of `tier`.
  uint32_t Publish(uint64_t n, Tier tier, const ModelId& model = {}) {
    const uint32_t slot = table_->slots(tier).Allocate();
    return table_->Publish(PartKey(n), PartParent(n), PartTokens(n), tenant_, model, tier, slot);
  }
  std::optional<IndexSlot> Entry(const BlockKey& key) const { return IndexSlotOf(table_->index(), key); }

  TenantAccount tenant_{Tenant::Make(TestProfile().Fingerprint(), "tenant"), {}, {}, {}, 0, 0, false, {}};
  std::optional<BlockTable> table_;
  std::vector<Event> events_;
};

TEST_F(BlockTableTest, ANewTableHasARecordForEverySlotAndNothingLive) {
  EXPECT_EQ(table_->capacity(), kGpuSlots + kHostSlots);
  EXPECT_EQ(table_->free_records(), kGpuSlots + kHostSlots);
  EXPECT_EQ(table_->live(), 0u);
  EXPECT_EQ(table_->slots(Tier::kGpu).capacity(), kGpuSlots);
  EXPECT_EQ(table_->slots(Tier::kHost).capacity(), kHostSlots);
  EXPECT_EQ(table_->slots(Tier::kGpu).used(), 0u);
  EXPECT_EQ(table_->index().size(), 0u);
  EXPECT_TRUE(events_.empty());
}

// Publish makes the block findable by clients (index entry, row with parent
// and tokens), counts it for its tenant and reports it stored.
TEST_F(BlockTableTest, PublishIndexesTheBlockAndCountsItForItsTenant) {
  const uint32_t r0 = Publish(0, Tier::kGpu);
  const uint32_t r1 = Publish(1, Tier::kHost);
  EXPECT_NE(r0, r1);
  EXPECT_EQ(table_->live(), 2u);

  const Record& rec = (*table_)[r1];
  EXPECT_EQ(rec.key, PartKey(1));
  EXPECT_EQ(rec.tier, Tier::kHost);
  EXPECT_TRUE(table_->slots(Tier::kHost).in_use(rec.slot));
  EXPECT_EQ(rec.state, BlockState::kReady);
  EXPECT_EQ(rec.tenant, &tenant_);
  EXPECT_EQ(rec.refs, 0u);
  EXPECT_EQ(rec.readers, 0u);
  EXPECT_FALSE(rec.doomed);
  EXPECT_TRUE(rec.IdleIn(Tier::kHost));
  EXPECT_FALSE(rec.ReadyIn(Tier::kGpu));

  EXPECT_EQ(table_->index().Find(PartKey(0)), r0);
  EXPECT_EQ(table_->index().Find(PartKey(1)), r1);
  EXPECT_EQ(table_->index().parent(r1), PartKey(0));
  EXPECT_EQ(table_->index().parent(r0), BlockKey{});
  const std::vector<TokenId> tokens(table_->index().tokens(r1), table_->index().tokens(r1) + kBt);
  EXPECT_EQ(tokens, PartTokens(1));
  const auto entry = Entry(PartKey(1));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->tier, static_cast<uint8_t>(Tier::kHost));
  EXPECT_EQ(entry->moving, 0);
  EXPECT_EQ(entry->ns_tag, NamespaceTag(tenant_.tenant.ns));

  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 1u);
  EXPECT_EQ(tenant_.blocks[Tier::kHost], 1u);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, BlockEventKind::kStored);
  EXPECT_EQ(events_[1].key, PartKey(1));
  EXPECT_EQ(events_[1].parent, PartKey(0));
  EXPECT_EQ(events_[1].tier, Tier::kHost);
  EXPECT_EQ(events_[1].tokens, PartTokens(1));
}

// A block is indexed under the namespace its key was chained in: its tenant's
// and its model's.
TEST_F(BlockTableTest, ABlockOfAModelIsTaggedWithTheModelsNamespace) {
  const ModelId model{BlockKey{5, 6}};
  const uint32_t r = Publish(0, Tier::kGpu, model);
  EXPECT_EQ((*table_)[r].model, model);
  const Namespace key_ns = KeyNamespace(tenant_.tenant.ns, model);
  EXPECT_EQ((*table_)[r].key_ns(), key_ns);
  EXPECT_FALSE(key_ns == tenant_.tenant.ns);
  const auto entry = Entry(PartKey(0));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->ns_tag, NamespaceTag(key_ns));
}

TEST_F(BlockTableTest, UnpublishFreesTheSlotAndTheRecord) {
  const uint32_t r = Publish(0, Tier::kGpu);
  const uint32_t slot = (*table_)[r].slot;
  table_->Unpublish(r);
  EXPECT_EQ(table_->index().Find(PartKey(0)), kNoRecord);
  EXPECT_FALSE(Entry(PartKey(0)).has_value());
  EXPECT_FALSE(table_->slots(Tier::kGpu).in_use(slot));
  EXPECT_EQ((*table_)[r].state, BlockState::kFree);
  EXPECT_EQ(table_->live(), 0u);
  EXPECT_EQ(table_->free_records(), table_->capacity());
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 0u);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, BlockEventKind::kRemoved);
  EXPECT_EQ(events_[1].key, PartKey(0));
  EXPECT_EQ(events_[1].tier, Tier::kGpu);
}

// With every record live, the one freed is the one the next block gets; the
// same key may then be published again.
TEST_F(BlockTableTest, AFullTableReusesTheRecordThatWasFreed) {
  std::vector<uint32_t> recs;
  for (uint64_t n = 0; n < kGpuSlots; ++n) recs.push_back(Publish(n, Tier::kGpu));
  for (uint64_t n = kGpuSlots; n < kGpuSlots + kHostSlots; ++n) recs.push_back(Publish(n, Tier::kHost));
  EXPECT_EQ(table_->free_records(), 0u);
  EXPECT_EQ(table_->live(), table_->capacity());
  table_->Unpublish(recs[2]);
  EXPECT_EQ(table_->free_records(), 1u);
  EXPECT_EQ(Publish(2, Tier::kGpu), recs[2]);
  EXPECT_EQ(table_->index().Find(PartKey(2)), recs[2]);
  EXPECT_EQ(table_->index().size(), kGpuSlots + kHostSlots);
}

// A block freed while its copy is in flight leaves the index and its tenant's
// counts at once, but keeps its slots until the copy lands (the mover frees them).
TEST_F(BlockTableTest, UnpublishingAMovingBlockDoomsIt) {
  const uint32_t r = Publish(0, Tier::kGpu);
  Record& rec = (*table_)[r];
  // What Mover::Schedule does to start a demotion.
  rec.dst_slot = table_->slots(Tier::kHost).Allocate();
  rec.state = BlockState::kDemoting;
  tenant_.MoveStarted(Tier::kGpu);
  EXPECT_FALSE(rec.ReadyIn(Tier::kGpu)) << "moving";

  table_->Unpublish(r);
  EXPECT_TRUE(rec.doomed);
  EXPECT_EQ(table_->index().Find(PartKey(0)), kNoRecord);
  EXPECT_TRUE(table_->slots(Tier::kGpu).in_use(rec.slot)) << "the copy still reads it";
  EXPECT_TRUE(table_->slots(Tier::kHost).in_use(rec.dst_slot)) << "the copy still writes it";
  EXPECT_EQ(table_->live(), 1u);
  EXPECT_EQ(tenant_.blocks[Tier::kGpu], 0u);
  EXPECT_EQ(tenant_.moving_to[Tier::kHost], 0u);
  EXPECT_FALSE(table_->FreeDoomed(r)) << "not while it moves";
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, BlockEventKind::kRemoved);

  // What the mover does when the copy lands (or is cancelled) for a doomed block.
  table_->slots(Tier::kHost).Free(rec.dst_slot);
  table_->slots(Tier::kGpu).Free(rec.slot);
  rec.state = BlockState::kReady;
  table_->Retire(r);
  EXPECT_EQ(table_->live(), 0u);
}

// Doom keeps the slot of a block still read; FreeDoomed frees it once the
// last reader went, and only a doomed block.
TEST_F(BlockTableTest, ADoomedBlockIsFreedOnceNoOneReadsIt) {
  const uint32_t r = Publish(0, Tier::kHost);
  Record& rec = (*table_)[r];
  EXPECT_FALSE(table_->FreeDoomed(r)) << "not doomed";
  rec.readers = 1;
  table_->Doom(r);
  EXPECT_TRUE(rec.doomed);
  EXPECT_EQ(table_->index().Find(PartKey(0)), kNoRecord);
  EXPECT_EQ(tenant_.blocks[Tier::kHost], 0u);
  EXPECT_FALSE(table_->FreeDoomed(r)) << "still read";
  EXPECT_TRUE(table_->slots(Tier::kHost).in_use(rec.slot));
  EXPECT_EQ(table_->live(), 1u);
  rec.readers = 0;
  const uint32_t slot = rec.slot;
  EXPECT_TRUE(table_->FreeDoomed(r));
  EXPECT_FALSE(table_->slots(Tier::kHost).in_use(slot));
  EXPECT_EQ(rec.state, BlockState::kFree);
  EXPECT_EQ(table_->live(), 0u);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(events_[1].kind, BlockEventKind::kRemoved);
  EXPECT_EQ(events_[1].tier, Tier::kHost);
}

// Replaying the events in order gives what the table holds.
TEST_F(BlockTableTest, EventsComeInTheOrderOfTheChanges) {
  const uint32_t r = Publish(0, Tier::kGpu);
  Record& rec = (*table_)[r];
  // As the mover leaves a demotion that landed.
  const uint32_t host_slot = table_->slots(Tier::kHost).Allocate();
  table_->slots(Tier::kGpu).Free(rec.slot);
  rec.tier = Tier::kHost;
  rec.slot = host_slot;
  table_->Moved(r, Tier::kGpu);
  table_->Doom(r);
  EXPECT_TRUE(table_->FreeDoomed(r));
  ASSERT_EQ(events_.size(), 3u);
  EXPECT_EQ(events_[0].kind, BlockEventKind::kStored);
  EXPECT_EQ(events_[0].tier, Tier::kGpu);
  EXPECT_EQ(events_[1].kind, BlockEventKind::kMoved);
  EXPECT_EQ(events_[1].key, PartKey(0));
  EXPECT_EQ(events_[1].from, Tier::kGpu);
  EXPECT_EQ(events_[1].tier, Tier::kHost);
  EXPECT_EQ(events_[1].parent, PartParent(0)) << "a move names the block's parent and tokens too";
  EXPECT_EQ(events_[1].tokens, PartTokens(0));
  EXPECT_EQ(events_[2].kind, BlockEventKind::kRemoved);
  EXPECT_EQ(events_[2].tier, Tier::kHost);
}

// What may be done with a record, by its state, tier and holders.
TEST(RecordTest, StatesSayWhereABlockIsReadableAndWhetherItMayMove) {
  Record rec;
  rec.tier = Tier::kGpu;
  rec.state = BlockState::kReady;
  EXPECT_TRUE(rec.ReadyIn(Tier::kGpu));
  EXPECT_TRUE(rec.IdleIn(Tier::kGpu));
  EXPECT_FALSE(rec.ReadyIn(Tier::kHost));
  EXPECT_FALSE(rec.held());
  rec.readers = 1;
  EXPECT_TRUE(rec.ReadyIn(Tier::kGpu));
  EXPECT_FALSE(rec.IdleIn(Tier::kGpu)) << "a leased block may not move";
  EXPECT_TRUE(rec.held());
  rec.readers = 0;
  rec.refs = 2;
  EXPECT_TRUE(rec.IdleIn(Tier::kGpu)) << "sessions do not pin";
  EXPECT_TRUE(rec.held());
  for (BlockState s : {BlockState::kDemoting, BlockState::kPromoting}) {
    rec.state = s;
    EXPECT_TRUE(rec.moving());
    EXPECT_FALSE(rec.ReadyIn(Tier::kGpu));
    EXPECT_FALSE(rec.IdleIn(Tier::kGpu));
  }
  rec.state = BlockState::kFree;
  EXPECT_FALSE(rec.moving());
  EXPECT_FALSE(rec.ReadyIn(Tier::kGpu));
}

}  // namespace
}  // namespace kvtier::tiering
