// A worker written against an earlier client.h still compiles and behaves the
// same: Client::Acquire and AcquireKeys took `bool promote` before Promote
// existed (true: promote now, false: lease where they lie). The overloads are
// deprecated, not removed; this file is built with the deprecation warning off,
// as such a worker would be until it moves to Promote. StoreNames(stats) is
// deprecated for SessionInfo::stores.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier {
namespace {

using namespace std::chrono_literals;
using testing::DaemonProcess;
using testing::kSmallDaemonConfig;

// A client of a kvtierd started with the small test configuration.
Result<std::unique_ptr<Client>> ConnectTo(DaemonProcess& daemon) {
  if (Status st = daemon.Start(); !st.ok()) return st;
  ClientOptions o;
  o.socket_path = daemon.socket();
  return Client::Connect(o);
}

TEST(ApiCompatTest, AcquireWithABoolPromoteStillWorks) {
  DaemonProcess daemon(kSmallDaemonConfig);
  auto c = ConnectTo(daemon);
  ASSERT_TRUE(c.ok()) << c.status().ToString() << daemon.log();
  const std::vector<TokenId> tokens(2 * (*c)->block_tokens(), 11);
  auto w = (*c)->Allocate(2);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*c)->Commit(*w, "old", BlockKey{}, 0, tokens).ok());
  auto demoted = (*c)->Demote("old");
  ASSERT_TRUE(demoted.ok()) << demoted.status().ToString();
  for (int i = 0; i < 500; ++i) {
    auto s = (*c)->GetSession("old");
    if (s.ok() && s->summary.host_blocks == 2) break;
    std::this_thread::sleep_for(2ms);
  }

  auto where_they_lie = (*c)->Acquire("old", tokens, false);  // Promote::kNo
  ASSERT_TRUE(where_they_lie.ok()) << where_they_lie.status().ToString();
  ASSERT_EQ(where_they_lie->size(), 2u);
  EXPECT_EQ(where_they_lie->promoted(), 0u);
  EXPECT_EQ(where_they_lie->block(0).tier, Tier::kHost);
  ASSERT_TRUE(where_they_lie->Release().ok());

  auto keys = (*c)->Keys(tokens, BlockKey{});
  auto now = (*c)->AcquireKeys("old", keys, tokens, true);  // Promote::kNow
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(now->promoted(), 2u);
  ASSERT_TRUE(now->Wait(5s).ok());
  EXPECT_EQ(now->block(0).tier, Tier::kGpu);
}

// StoreNames recovered the stores' names from the stats before SessionInfo
// carried them; it still does (no store configured: none).
TEST(ApiCompatTest, StoreNamesFromTheStatsStillWorks) {
  EXPECT_EQ(StoreNames({{"store.disk.hit_blocks", 1}, {"gpu_slots", 8}, {"store.redis.hit_blocks", 0}}),
            (std::vector<std::string>{"disk", "redis"}));
  DaemonProcess daemon(kSmallDaemonConfig);
  auto c = ConnectTo(daemon);
  ASSERT_TRUE(c.ok()) << c.status().ToString() << daemon.log();
  auto stats = (*c)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(StoreNames(*stats).empty());
}

}  // namespace
}  // namespace kvtier
