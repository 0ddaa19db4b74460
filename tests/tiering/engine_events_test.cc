// Engine: KV events (EngineOptions::on_block_event), replayed, give the
// blocks per tier.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine_test_support.h"

namespace kvtier::tiering {
namespace {

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
