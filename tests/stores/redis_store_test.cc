// RedisStore against real redis-server processes: standalone (AUTH, TTL, a
// killed, paused and restarted server) and Redis Cluster (slot routing,
// MOVED/ASK during a slot migration, a master's failover).
#include "redis/redis_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "redis/key_slot.h"
#include "redis_server.h"

namespace kvtier::stores {
namespace {

using std::chrono::milliseconds;
using testing::RedisCluster;
using testing::RedisServer;
using testing::RedisServerOptions;
using Clock = std::chrono::steady_clock;

constexpr size_t kTwoMiB = 2u << 20;

// `n` bytes that hold NULs, CR/LF and every other byte value, different per seed.
std::string Binary(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = (i % 7 == 0) ? '\0' : static_cast<char>(x >> 24);
  }
  return s;
}

std::vector<std::string> Keys(const std::string& prefix, size_t n) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

std::vector<StoreItem> Items(const std::vector<std::string>& keys, size_t bytes) {
  std::vector<StoreItem> items;
  for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], Binary(bytes, static_cast<uint32_t>(i) + 1)});
  return items;
}

uint64_t CounterOf(const BlockStore& store, const std::string& name) {
  for (const StoreCounter& c : store.Counters()) {
    if (c.name == name) return c.value;
  }
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool IsOutage(const Status& s) { return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kTimeout; }

RedisStoreOptions OptionsFor(const std::vector<std::string>& nodes, bool cluster) {
  RedisStoreOptions o;
  o.nodes = nodes;
  o.cluster = cluster;
  o.connect_timeout = milliseconds(200);
  o.io_timeout = milliseconds(500);
  o.reconnect_interval = milliseconds(300);
  return o;
}

std::unique_ptr<BlockStore> MustOpen(const RedisStoreOptions& o) {
  auto store = OpenRedisStore(o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

// A loopback port nothing listens on (bound, then released).
int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// ------------------------------------------------------------- without a server

TEST(RedisKeySlotTest, SlotsFollowTheClusterSpecIncludingHashTags) {
  EXPECT_EQ(redis::Crc16("123456789"), 0x31C3);
  EXPECT_EQ(redis::KeySlot("foo"), 12182);
  EXPECT_EQ(redis::KeySlot("bar"), 5061);
  EXPECT_EQ(redis::KeySlot("{user1000}.following"), redis::KeySlot("{user1000}.followers"));
  EXPECT_EQ(redis::KeySlot("{user1000}.following"), redis::KeySlot("user1000"));
  EXPECT_EQ(redis::KeySlot("foo{}{bar}"), redis::Crc16("foo{}{bar}") % 16384);  // An empty tag hashes the key.
  EXPECT_EQ(redis::KeySlot("foo{{bar}}zap"), redis::KeySlot("{bar"));           // The first '{' opens.
  EXPECT_EQ(redis::KeySlot("foo{bar}{zap}"), redis::KeySlot("bar"));            // The first '}' closes.
  EXPECT_EQ(redis::KeySlot("foo{bar"), redis::Crc16("foo{bar") % 16384);        // Unclosed: no tag.
}

TEST(RedisStoreOptionsTest, OpenRejectsMissingOrMalformedNodesWithTheEntryNamed) {
  RedisStoreOptions o = OptionsFor({}, false);
  auto none = OpenRedisStore(o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("nodes"), std::string::npos) << none.status().message();

  for (const std::string bad :
       {"localhost", "localhost:", ":6379", "host:0", "host:65536", "host:12ab", "::1:6379", "[::1:6379"}) {
    o.nodes = {"127.0.0.1:6379", bad};
    o.cluster = true;
    auto r = OpenRedisStore(o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("nodes[1]"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }

  o.nodes = {"127.0.0.1:6379", "127.0.0.1:6380"};
  o.cluster = false;
  auto two = OpenRedisStore(o);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("cluster"), std::string::npos) << two.status().message();
}

TEST(RedisStoreOptionsTest, AnUnreachableServerIsNoErrorAtOpenButEveryCallFailsPromptly) {
  const std::string address = "127.0.0.1:" + std::to_string(ClosedPort());
  auto store = MustOpen(OptionsFor({address}, false));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(), "redis " + address);
  EXPECT_EQ(store->kind(), "redis");
  const std::vector<std::string> keys = {"a", "b"};
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    auto got = store->Get(keys);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
    EXPECT_NE(got.status().message().find(address), std::string::npos) << got.status().message();
    EXPECT_LT(SecondsSince(t0), 0.5);
  }
  auto bracketed = OpenRedisStore(OptionsFor({"[::1]:" + std::to_string(ClosedPort())}, false));
  EXPECT_TRUE(bracketed.ok()) << bracketed.status().ToString();
}

// ------------------------------------------------------------------ standalone

class RedisStandaloneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::RedisInstalled()) << testing::kRedisRequired;
    server_ = Start({});
  }

  static std::unique_ptr<RedisServer> Start(const RedisServerOptions& options) {
    auto s = RedisServer::Start(options);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::unique_ptr<RedisServer> server_;
};

TEST_F(RedisStandaloneTest, TwoMiBBinaryValuesRoundTripThroughPutGetAndPresent) {
  ASSERT_NE(server_, nullptr);
  auto store = MustOpen(OptionsFor({server_->address()}, false));
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"big:0", "big:1", "big:2"};
  const std::vector<StoreItem> items = Items(keys, kTwoMiB);
  ASSERT_EQ(items[0].value.find('\0'), 0u);

  ASSERT_TRUE(store->Put(items).ok());
  auto held = store->Present(keys);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held.value(), 3u);
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 3u);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE((*got)[i].has_value()) << keys[i];
    EXPECT_TRUE(*(*got)[i] == items[i].value) << keys[i] << " differs";
  }
  EXPECT_EQ(server_->Command({"STRLEN", "big:1"}).value(), std::to_string(kTwoMiB));

  // Put replaces.
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"big:1", "small"}}).ok());
  EXPECT_EQ(store->Get(std::vector<std::string>{"big:1"}).value()[0], "small");
}

// A value far larger than the record a fetch wants (30 MiB under a victim's
// key, against 2 MiB records) was read whole; bounded, at most bound + 1 bytes
// come back (GETRANGE) and the value is refused, while records of the right
// size are served in the same call.
TEST_F(RedisStandaloneTest, AValueLongerThanTheBoundIsRefusedWithoutBeingReadWhole) {
  ASSERT_NE(server_, nullptr);
  auto store = MustOpen(OptionsFor({server_->address()}, false));
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"rec:0", "huge:1", "rec:2"};
  std::vector<StoreItem> items = Items(keys, kTwoMiB);
  items[1].value.assign(30u << 20, 'x');
  ASSERT_TRUE(store->Put(items).ok());
  auto got = store->Get(keys, kTwoMiB);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_TRUE((*got)[0].has_value() && *(*got)[0] == items[0].value);
  EXPECT_FALSE((*got)[1].has_value()) << "30 MiB where at most 2 MiB was asked for";
  EXPECT_TRUE((*got)[2].has_value() && *(*got)[2] == items[2].value);
  EXPECT_EQ(CounterOf(*store, "oversized"), 1u);
  // A key gone since Present reads as absent, not as an empty value.
  auto gone = store->Get(std::vector<std::string>{"never-set"}, kTwoMiB);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE((*gone)[0].has_value());
  // Unbounded, the whole value comes back as before.
  auto whole = store->Get(std::vector<std::string>{"huge:1"});
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE((*whole)[0].has_value());
  EXPECT_EQ((*whole)[0]->size(), size_t{30} << 20);
}

TEST_F(RedisStandaloneTest, PresentCountsTheLeadingKeysUpToTheFirstMissingOne) {
  ASSERT_NE(server_, nullptr);
  auto store = MustOpen(OptionsFor({server_->address()}, false));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"k0", "v0"}, {"k1", "v1"}, {"k3", "v3"}}).ok());

  EXPECT_EQ(store->Present(std::vector<std::string>{"k0", "k1", "k2", "k3"}).value(), 2u);
  EXPECT_EQ(store->Present(std::vector<std::string>{"k2", "k0"}).value(), 0u);
  EXPECT_EQ(store->Present(std::vector<std::string>{"k0", "k1", "k3"}).value(), 3u);
  EXPECT_EQ(store->Present(std::vector<std::string>{}).value(), 0u);

  auto got = store->Get(std::vector<std::string>{"k3", "k2", "k0"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0], "v3");
  EXPECT_EQ((*got)[1], std::nullopt);
  EXPECT_EQ((*got)[2], "v0");
}

TEST_F(RedisStandaloneTest, AValueWithATtlExpires) {
  ASSERT_NE(server_, nullptr);
  RedisStoreOptions o = OptionsFor({server_->address()}, false);
  o.ttl_seconds = 1;
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"ttl:a"};
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"ttl:a", "short-lived"}}).ok());
  EXPECT_EQ(store->Get(keys).value()[0], "short-lived");
  const int pttl = std::atoi(server_->Command({"PTTL", "ttl:a"}).value().c_str());
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 1000);

  std::this_thread::sleep_for(milliseconds(2100));
  EXPECT_EQ(store->Get(keys).value()[0], std::nullopt);
  EXPECT_EQ(store->Present(keys).value(), 0u);
}

TEST_F(RedisStandaloneTest, AuthWithTheServersPasswordLetsTheStoreIn) {
  RedisServerOptions with_password;
  with_password.password = "pa ss\"word";
  auto server = Start(with_password);
  ASSERT_NE(server, nullptr);
  RedisStoreOptions o = OptionsFor({server->address()}, false);
  o.password = "pa ss\"word";
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"auth:a", "x"}}).ok());
  EXPECT_EQ(store->Get(std::vector<std::string>{"auth:a"}).value()[0], "x");
  EXPECT_EQ(server->Command({"GET", "auth:a"}).value(), "x");
}

TEST_F(RedisStandaloneTest, AuthAsAnAclUserLetsTheStoreIn) {
  RedisServerOptions with_user;
  with_user.acl_user = "kvtier";
  with_user.acl_password = "acl-secret";
  auto server = Start(with_user);
  ASSERT_NE(server, nullptr);
  RedisStoreOptions o = OptionsFor({server->address()}, false);
  o.user = "kvtier";
  o.password = "acl-secret";
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"acl:a", "y"}}).ok());
  EXPECT_EQ(store->Present(std::vector<std::string>{"acl:a"}).value(), 1u);
  EXPECT_EQ(server->Command({"GET", "acl:a"}).value(), "y");
}

TEST_F(RedisStandaloneTest, AWrongOrMissingPasswordIsPermissionDeniedWithoutTheSecretInTheMessage) {
  RedisServerOptions with_both;
  with_both.password = "right-secret";
  with_both.acl_user = "kvtier";
  with_both.acl_password = "acl-secret";
  auto server = Start(with_both);
  ASSERT_NE(server, nullptr);
  RedisStoreOptions o = OptionsFor({server->address()}, false);

  o.password = "wrong-secret-123";
  auto wrong = OpenRedisStore(o);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_EQ(wrong.status().message().find("wrong-secret-123"), std::string::npos) << wrong.status().message();
  EXPECT_NE(wrong.status().message().find(server->address()), std::string::npos) << wrong.status().message();

  o.user = "kvtier";
  auto wrong_user = OpenRedisStore(o);
  ASSERT_FALSE(wrong_user.ok());
  EXPECT_EQ(wrong_user.status().code(), StatusCode::kPermissionDenied) << wrong_user.status().ToString();
  EXPECT_NE(wrong_user.status().message().find("kvtier"), std::string::npos) << wrong_user.status().message();

  o.user.clear();
  o.password.clear();
  auto missing = OpenRedisStore(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kPermissionDenied) << missing.status().ToString();
}

TEST_F(RedisStandaloneTest, ClusterSetForAServerNotInClusterModeIsRejectedAtOpen) {
  ASSERT_NE(server_, nullptr);
  auto store = OpenRedisStore(OptionsFor({server_->address()}, true));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << store.status().ToString();
  EXPECT_NE(store.status().message().find("not in cluster mode"), std::string::npos) << store.status().message();
}

TEST_F(RedisStandaloneTest, AKilledServerFailsEveryCallPromptlyWithoutCrashing) {
  ASSERT_NE(server_, nullptr);
  auto store = MustOpen(OptionsFor({server_->address()}, false));
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"kill:a"};
  ASSERT_TRUE(store->Put(Items(keys, 1000)).ok());
  server_->Kill(SIGKILL);

  // A 2 MiB write into a connection whose server is gone (SIGPIPE), then the rest.
  for (int round = 0; round < 2; ++round) {
    auto t0 = Clock::now();
    const Status put = store->Put(Items(keys, kTwoMiB));
    EXPECT_TRUE(IsOutage(put)) << put.ToString();
    EXPECT_NE(put.message().find(server_->address()), std::string::npos) << put.message();
    EXPECT_LT(SecondsSince(t0), 2.0);

    t0 = Clock::now();
    auto got = store->Get(keys);
    ASSERT_FALSE(got.ok());
    EXPECT_TRUE(IsOutage(got.status())) << got.status().ToString();
    EXPECT_LT(SecondsSince(t0), 2.0);

    t0 = Clock::now();
    auto held = store->Present(keys);
    ASSERT_FALSE(held.ok());
    EXPECT_TRUE(IsOutage(held.status())) << held.status().ToString();
    EXPECT_LT(SecondsSince(t0), 2.0);
  }
  EXPECT_GE(CounterOf(*store, "node_errors"), 1u);
}

TEST_F(RedisStandaloneTest, AServerThatStopsAnsweringTimesOutOnceThenFailsAtOnceUntilTheInterval) {
  ASSERT_NE(server_, nullptr);
  RedisStoreOptions o = OptionsFor({server_->address()}, false);
  o.io_timeout = milliseconds(300);
  o.reconnect_interval = milliseconds(1000);
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"pause:a"};
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"pause:a", "p"}}).ok());

  server_->Pause();
  auto t0 = Clock::now();
  auto got = store->Get(keys);
  const double first = SecondsSince(t0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().ToString();
  EXPECT_GE(first, 0.25);
  EXPECT_LT(first, 2.0);

  t0 = Clock::now();
  auto again = store->Get(keys);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kTimeout) << again.status().ToString();
  EXPECT_LT(SecondsSince(t0), 0.1) << "a down node is not asked again before reconnect_interval";

  server_->Resume();
  std::this_thread::sleep_for(milliseconds(1050));
  auto back = store->Get(keys);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)[0], "p");
  EXPECT_GE(CounterOf(*store, "reconnects"), 1u);
}

TEST_F(RedisStandaloneTest, ARestartedServerIsUsedAgainAfterTheReconnectInterval) {
  ASSERT_NE(server_, nullptr);
  RedisStoreOptions o = OptionsFor({server_->address()}, false);
  o.reconnect_interval = milliseconds(1000);
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"restart:a"};
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"restart:a", "before"}}).ok());

  server_->Kill(SIGKILL);
  EXPECT_FALSE(store->Get(keys).ok());
  const auto failed_at = Clock::now();
  ASSERT_TRUE(server_->Restart().ok());
  if (SecondsSince(failed_at) < 0.8) {
    EXPECT_FALSE(store->Get(keys).ok()) << "still within reconnect_interval";
  }

  std::this_thread::sleep_until(failed_at + milliseconds(1050));
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0], std::nullopt) << "the restarted server kept nothing";
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"restart:a", "after"}}).ok());
  EXPECT_EQ(store->Get(keys).value()[0], "after");
  EXPECT_GE(CounterOf(*store, "reconnects"), 1u);
}

TEST_F(RedisStandaloneTest, AServerRestartedBetweenCallsIsReconnectedWithoutAFailedCall) {
  ASSERT_NE(server_, nullptr);
  auto store = MustOpen(OptionsFor({server_->address()}, false));
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys = {"idle:a"};
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{"idle:a", "1"}}).ok());
  ASSERT_TRUE(server_->Restart().ok());

  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0], std::nullopt);
  EXPECT_EQ(CounterOf(*store, "reconnects"), 1u);
}

// --------------------------------------------------------------------- cluster

// One 3-master cluster without replicas, shared by the tests that do not kill nodes.
class RedisClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::RedisInstalled()) return;
    auto c = RedisCluster::Start(3, 0);
    if (c.ok()) {
      cluster_ = std::move(c).value().release();
    } else {
      start_error_ = new std::string(c.status().ToString());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(testing::RedisInstalled()) << testing::kRedisRequired;
    ASSERT_NE(cluster_, nullptr) << (start_error_ != nullptr ? *start_error_ : "");
  }

  static RedisCluster* cluster_;
  static std::string* start_error_;
};
RedisCluster* RedisClusterTest::cluster_ = nullptr;
std::string* RedisClusterTest::start_error_ = nullptr;

TEST_F(RedisClusterTest, BatchesOf64KeysSpreadOverEveryMasterAndRoundTrip) {
  auto store = MustOpen(OptionsFor({cluster_->seeds()[1]}, true));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Describe(), "redis cluster " + cluster_->seeds()[1] + " (3 masters)");
  const std::vector<std::string> keys = Keys("spread:", 64);
  const std::vector<StoreItem> items = Items(keys, 4096);
  ASSERT_TRUE(store->Put(items).ok());

  auto held = store->Present(keys);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held.value(), 64u);
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE((*got)[i] == items[i].value) << keys[i];
  for (int m = 0; m < 3; ++m) {
    EXPECT_GT(std::atoi(cluster_->master(m).Command({"DBSIZE"}).value().c_str()), 0) << "master " << m;
  }
  EXPECT_EQ(CounterOf(*store, "redirects"), 0u) << "the slot map routes every key to its master";
  EXPECT_GE(CounterOf(*store, "topology_refreshes"), 1u);

  std::vector<std::string> with_missing = keys;
  with_missing.insert(with_missing.begin() + 40, "spread:absent");
  EXPECT_EQ(store->Present(with_missing).value(), 40u);
}

TEST_F(RedisClusterTest, KeySlotsAgreeWithTheServersClusterKeyslot) {
  for (const std::string key :
       {"a", "kvtier:0123456789abcdef:00112233445566778899aabbccddeeff", "{tag}x", "x{}y", "spread:17", "\xff\xfe"}) {
    auto slot = cluster_->master(0).Command({"CLUSTER", "KEYSLOT", key});
    ASSERT_TRUE(slot.ok()) << slot.status().ToString();
    EXPECT_EQ(std::to_string(redis::KeySlot(key)), slot.value()) << key;
  }
}

TEST_F(RedisClusterTest, AMigratingSlotIsFollowedThroughAskAndThenMoved) {
  auto store = MustOpen(OptionsFor(cluster_->seeds(), true));
  ASSERT_NE(store, nullptr);
  const std::string k1 = "{migrate}1", k2 = "{migrate}2";
  const std::string slot = std::to_string(redis::KeySlot(k1));
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{k1, "one"}}).ok());

  int src = -1;
  for (int m = 0; m < 3; ++m) {
    if (cluster_->master(m).Command({"EXISTS", k1}).value() == "1") src = m;
  }
  ASSERT_GE(src, 0);
  RedisServer& from = cluster_->master(src);
  RedisServer& to = cluster_->master((src + 1) % 3);
  const std::string from_id = from.Command({"CLUSTER", "MYID"}).value();
  const std::string to_id = to.Command({"CLUSTER", "MYID"}).value();
  ASSERT_EQ(to.Command({"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id}).value(), "OK");
  ASSERT_EQ(from.Command({"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id}).value(), "OK");

  // Migrating: a key the old owner lacks is asked of the new one (ASK).
  const uint64_t redirects_before = CounterOf(*store, "redirects");
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{k2, "two"}}).ok());
  EXPECT_EQ(to.Command({"CLUSTER", "COUNTKEYSINSLOT", slot}).value(), "1") << "written at the importing node";
  auto during = store->Get(std::vector<std::string>{k1, k2});
  ASSERT_TRUE(during.ok()) << during.status().ToString();
  EXPECT_EQ((*during)[0], "one");
  EXPECT_EQ((*during)[1], "two");
  EXPECT_EQ(store->Present(std::vector<std::string>{k1, k2, "{migrate}3"}).value(), 2u);
  const uint64_t after_ask = CounterOf(*store, "redirects");
  EXPECT_GE(after_ask, redirects_before + 2);

  // Moved: the old owner answers MOVED; the store reads the map again.
  ASSERT_EQ(from.Command({"MIGRATE", "127.0.0.1", std::to_string(to.port()), "", "0", "5000", "KEYS", k1}).value(),
            "OK");
  for (int m = 0; m < 3; ++m) {
    ASSERT_EQ(cluster_->master(m).Command({"CLUSTER", "SETSLOT", slot, "NODE", to_id}).value(), "OK");
  }
  const uint64_t refreshes_before = CounterOf(*store, "topology_refreshes");
  auto after = store->Get(std::vector<std::string>{k1, k2});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ((*after)[0], "one");
  EXPECT_EQ((*after)[1], "two");
  EXPECT_GT(CounterOf(*store, "redirects"), after_ask);
  EXPECT_GT(CounterOf(*store, "topology_refreshes"), refreshes_before);

  // The map now routes the slot directly.
  const uint64_t settled = CounterOf(*store, "redirects");
  EXPECT_EQ(store->Present(std::vector<std::string>{k1, k2}).value(), 2u);
  EXPECT_EQ(CounterOf(*store, "redirects"), settled);
}

TEST_F(RedisClusterTest, AStandaloneStoreNamesAClusterNodeAsSuch) {
  auto store = MustOpen(OptionsFor({cluster_->seeds()[0]}, false));
  ASSERT_NE(store, nullptr);
  // Some keys live on the node asked; the rest are MOVED, which a standalone store does not follow.
  auto put = store->Put(Items(Keys("standalone-on-cluster:", 8), 10));
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.message().find("set cluster"), std::string::npos) << put.message();
}

// One 3-master cluster with a replica each, whose master 0 is killed.
TEST(RedisClusterAuthTest, AClusterThatRequiresAPasswordServesEveryMasterAndRefusesAWrongOne) {
  ASSERT_TRUE(testing::RedisInstalled()) << testing::kRedisRequired;
  RedisServerOptions with_password;
  with_password.password = "cluster-secret";
  auto started = RedisCluster::Start(3, 0, with_password);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  RedisCluster& cluster = *started.value();
  RedisStoreOptions o = OptionsFor({cluster.seeds()[0]}, true);
  o.password = "cluster-secret";
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  EXPECT_NE(store->Describe().find("(3 masters)"), std::string::npos) << store->Describe();
  // Every master is reached (the slot map's nodes are authenticated as the seed was).
  const std::vector<std::string> keys = Keys("auth-cluster:", 64);
  const std::vector<StoreItem> items = Items(keys, 1024);
  ASSERT_TRUE(store->Put(items).ok());
  EXPECT_EQ(store->Present(keys).value(), 64u);
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE((*got)[i] == items[i].value) << keys[i];
  for (int m = 0; m < 3; ++m) {
    EXPECT_GT(std::atoi(cluster.master(m).Command({"DBSIZE"}).value().c_str()), 0) << "master " << m;
  }
  // A wrong password: every call is refused, and the message does not carry it.
  RedisStoreOptions wrong = o;
  wrong.password = "not-the-secret";
  auto refused = OpenRedisStore(wrong);
  if (refused.ok()) {
    auto st = (*refused)->Present(keys);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kPermissionDenied) << st.status().ToString();
    EXPECT_EQ(st.status().message().find("not-the-secret"), std::string::npos);
  } else {
    EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
    EXPECT_EQ(refused.status().message().find("not-the-secret"), std::string::npos);
  }
}

TEST(RedisClusterFailoverTest, AKilledMastersKeysFailUntilItsReplicaTakesOverThenEveryKeyIsServed) {
  ASSERT_TRUE(testing::RedisInstalled()) << testing::kRedisRequired;
  auto started = RedisCluster::Start(3, 1);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  RedisCluster& cluster = *started.value();
  RedisStoreOptions o = OptionsFor(cluster.seeds(), true);
  o.reconnect_interval = milliseconds(200);
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  EXPECT_NE(store->Describe().find("(3 masters)"), std::string::npos) << store->Describe();

  const std::vector<std::string> keys = Keys("failover:", 64);
  const std::vector<StoreItem> items = Items(keys, 1024);
  ASSERT_TRUE(store->Put(items).ok());
  ASSERT_TRUE(cluster.WaitForReplication().ok());
  const int on_killed = std::atoi(cluster.master(0).Command({"DBSIZE"}).value().c_str());
  ASSERT_GT(on_killed, 0);
  const std::string killed = cluster.master(0).address();
  cluster.KillMaster(0);

  // While it is down: its keys miss, the others are served, writes to it fail.
  auto t0 = Clock::now();
  auto got = store->Get(keys);
  EXPECT_LT(SecondsSince(t0), 2.0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  int missing = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!(*got)[i]) {
      ++missing;
    } else {
      EXPECT_TRUE(*(*got)[i] == items[i].value) << keys[i];
    }
  }
  EXPECT_EQ(missing, on_killed);
  t0 = Clock::now();
  EXPECT_TRUE(store->Present(keys).ok());
  const Status put = store->Put(Items(Keys("during:", 64), 100));
  EXPECT_LT(SecondsSince(t0), 2.0);
  EXPECT_TRUE(IsOutage(put)) << put.ToString();
  EXPECT_NE(put.message().find(killed), std::string::npos) << put.message();

  ASSERT_TRUE(cluster.WaitForFailover().ok());
  // The first call after the failover may still meet the dead master's
  // reconnect_interval; within a second every key is served from the replica.
  std::optional<std::vector<std::optional<StoreValue>>> after;
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  do {
    auto r = store->Get(keys);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    after = std::move(r).value();
    if (std::all_of(after->begin(), after->end(), [](const auto& v) { return v.has_value(); })) break;
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() < deadline);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE((*after)[i].has_value()) << keys[i] << " not served after the failover";
    EXPECT_TRUE(*(*after)[i] == items[i].value) << keys[i];
  }

  const std::vector<std::string> later = Keys("after-failover:", 64);
  const std::vector<StoreItem> later_items = Items(later, 512);
  ASSERT_TRUE(store->Put(later_items).ok());
  auto read_back = store->Get(later);
  ASSERT_TRUE(read_back.ok()) << read_back.status().ToString();
  for (size_t i = 0; i < later.size(); ++i) EXPECT_TRUE((*read_back)[i] == later_items[i].value) << later[i];
  EXPECT_EQ(store->Present(later).value(), 64u);
  EXPECT_GE(CounterOf(*store, "topology_refreshes"), 2u);
  EXPECT_GE(CounterOf(*store, "node_errors"), 1u);
}

}  // namespace
}  // namespace kvtier::stores
