// Warm restart with a real kvtierd: a clean restart (SIGTERM) and a crash
// (SIGKILL) keep the host tier and its sessions; a changed profile, or a block
// whose bytes changed between runs, is not adopted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <thread>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "payload.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

const std::string kWarmConfig =
    std::string(kSmallDaemonConfig) + "warm_restart: true\ntiering:\n  warm_snapshot_ms: 50\n";

std::map<std::string, double> StatsOf(Client& c) {
  std::map<std::string, double> out;
  auto s = c.Stats();
  if (s.ok()) {
    for (const auto& [k, v] : *s) out[k] = v;
  }
  return out;
}

std::vector<TokenId> Tokens(uint32_t seed, uint32_t blocks) {
  std::vector<TokenId> t;
  for (uint32_t i = 0; i < blocks * 16; ++i) t.push_back(seed * 7919 + i);
  return t;
}

class WarmRestartTest : public ::testing::Test {
 protected:
  explicit WarmRestartTest(const std::string& config = kWarmConfig) : daemon_(config) {}
  void SetUp() override { ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log(); }
  void TearDown() override {
    const std::string log = daemon_.log();
    for (const char* bad : {"ThreadSanitizer", "AddressSanitizer", "LeakSanitizer", "runtime error:"}) {
      EXPECT_EQ(log.find(bad), std::string::npos) << "kvtierd's log reports " << bad;
    }
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }

  // As kvtierd's user (an admin), of tenant `tenant` ("": the default one).
  std::unique_ptr<Client> Connect(const std::string& tenant = "") {
    ClientOptions o;
    o.socket_path = daemon_.socket();
    o.client_name = "warm-restart-test";
    o.tenant = tenant;
    o.reconnect = false;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Writes payloads (a function of each key) and commits `tokens` as `session`.
  void Put(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
    const std::vector<BlockKey> keys = c.Keys(tokens);
    auto w = c.Allocate(static_cast<uint32_t>(keys.size()));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (size_t i = 0; i < keys.size(); ++i) FillPayload(keys[i], w->data(i), w->slot_bytes());
    auto r = c.Commit(*w, session, BlockKey{}, 0, tokens);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  // Blocks of `tokens` the daemon hits, each payload verified after promotion.
  size_t VerifiedHits(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
    const std::vector<BlockKey> keys = c.Keys(tokens);
    auto lease = c.Acquire(session, tokens);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    if (!lease.ok()) return 0;
    EXPECT_TRUE(lease->Wait(10s).ok());
    for (size_t i = 0; i < lease->size(); ++i) {
      EXPECT_TRUE(PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) << "block " << i;
    }
    return lease->matched();
  }

  void Stop(int signal) {
    daemon_.Kill(signal);
    auto rc = daemon_.Wait(15s);
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, signal == SIGTERM ? 0 : 128 + SIGKILL);
  }
  std::string Shm(const char* suffix) const { return "/dev/shm/" + daemon_.instance() + ".it." + suffix; }

  DaemonProcess daemon_;
};

TEST_F(WarmRestartTest, CleanRestartServesTheOldSessions) {
  const auto a = Tokens(1, 8), b = Tokens(2, 4);
  {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    Put(*c, "tenant-x/a", a);  // Session names are opaque, a tenant prefix included.
    Put(*c, "b", b);
    EXPECT_EQ(StatsOf(*c)["gpu_used"], 12);
  }
  Stop(SIGTERM);
  EXPECT_EQ(::access(Shm("host").c_str(), F_OK), 0) << "the host pool outlives a warm-restart daemon";
  EXPECT_EQ(::access(Shm("warm").c_str(), F_OK), 0);
  EXPECT_NE(::access(Shm("index").c_str(), F_OK), 0);
  EXPECT_NE(daemon_.log().find("saved 12 host blocks of 2 sessions"), std::string::npos);

  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  EXPECT_NE(daemon_.log().find("adopted 12 of 12 host blocks (0 dropped) and 2 sessions"), std::string::npos);
  EXPECT_NE(daemon_.log().find("clean-shutdown manifest"), std::string::npos);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto st = StatsOf(*c);
  EXPECT_EQ(st["warm_adopted_blocks"], 12);
  EXPECT_EQ(st["warm_dropped_blocks"], 0);
  EXPECT_EQ(st["sessions"], 2);
  EXPECT_EQ(c->Probe(a), 8u);  // The shared index was repopulated.
  EXPECT_EQ(VerifiedHits(*c, "tenant-x/a", a), 8u);
  EXPECT_EQ(VerifiedHits(*c, "b", b), 4u);
  EXPECT_EQ(StatsOf(*c)["hit_blocks"], 12);
}

// An isolated tenant's engine keeps its host tier across a restart in
// segments of its own (/<instance>.it.iso.{host,warm}), apart from the shared ones.
class IsolatedWarmRestartTest : public WarmRestartTest {
 protected:
  IsolatedWarmRestartTest()
      : WarmRestartTest(kWarmConfig +
                        "tenants:\n  - name: iso\n    isolated: true\n    gpu_blocks: 64\n"
                        "    host_blocks: 256\n") {}
};

TEST_F(IsolatedWarmRestartTest, AnIsolatedTenantsHostTierIsKeptInSegmentsOfItsOwn) {
  const auto mine = Tokens(3, 8), shared = Tokens(4, 4);
  {
    auto iso = Connect("iso"), other = Connect();
    ASSERT_NE(iso, nullptr);
    ASSERT_NE(other, nullptr);
    Put(*iso, "chat", mine);
    Put(*other, "chat", shared);
    EXPECT_EQ(other->Probe(mine), 0u) << "the default tenant's index is not the isolated one's";
  }
  Stop(SIGTERM);
  EXPECT_EQ(::access(Shm("iso.host").c_str(), F_OK), 0);
  EXPECT_EQ(::access(Shm("iso.warm").c_str(), F_OK), 0);
  EXPECT_EQ(::access(Shm("host").c_str(), F_OK), 0);
  EXPECT_NE(daemon_.log().find("profile 'it', tenant 'iso' (isolated): saved 8 host blocks of 1 sessions"),
            std::string::npos);
  EXPECT_NE(daemon_.log().find("profile 'it': saved 4 host blocks of 1 sessions"), std::string::npos);

  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  EXPECT_NE(daemon_.log().find("profile 'it', tenant 'iso' (isolated): adopted 8 of 8 host blocks"), std::string::npos);
  auto iso = Connect("iso"), other = Connect();
  ASSERT_NE(iso, nullptr);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(StatsOf(*iso)["warm_adopted_blocks"], 12) << "the profile's figure adds up its engines";
  EXPECT_EQ(iso->Probe(mine), 8u);
  EXPECT_EQ(VerifiedHits(*iso, "chat", mine), 8u);
  EXPECT_EQ(VerifiedHits(*other, "chat", shared), 4u);
  EXPECT_EQ(other->Probe(mine), 0u);
}

TEST_F(WarmRestartTest, CrashAdoptsOnlyWhatTheLastSnapshotProves) {
  const auto kept = Tokens(3, 6), on_gpu = Tokens(4, 3);
  {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    Put(*c, "kept", kept);
    auto d = c->Demote("kept");
    ASSERT_TRUE(d.ok());
    ASSERT_EQ(*d, 6u);
    for (int i = 0; i < 500 && StatsOf(*c)["demoted_blocks"] < 6; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(StatsOf(*c)["demoted_blocks"], 6);
    Put(*c, "on_gpu", on_gpu);  // Never leaves the GPU tier: a crash loses it.
    // Wait for a snapshot taken after everything above.
    const double before = StatsOf(*c)["warm_snapshots"];
    for (int i = 0; i < 500 && StatsOf(*c)["warm_snapshots"] <= before; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_GT(StatsOf(*c)["warm_snapshots"], before);
  }
  Stop(SIGKILL);
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  EXPECT_NE(daemon_.log().find("snapshot (unclean shutdown)"), std::string::npos);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto st = StatsOf(*c);
  EXPECT_EQ(st["warm_adopted_blocks"], 6);
  EXPECT_EQ(st["warm_dropped_blocks"], 0);
  EXPECT_EQ(VerifiedHits(*c, "kept", kept), 6u);
  EXPECT_EQ(VerifiedHits(*c, "on_gpu", on_gpu), 0u);
}

TEST_F(WarmRestartTest, ChangedProfileStartsColdAndRemovesTheStaleSegments) {
  const auto a = Tokens(5, 4);
  {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    Put(*c, "a", a);
  }
  Stop(SIGTERM);
  {
    std::string config = kWarmConfig;
    const std::string from = "host_blocks: 1024", to = "host_blocks: 512";
    config.replace(config.find(from), from.size(), to);
    std::ofstream(daemon_.config_path()) << "instance: " << daemon_.instance() << "\nsocket: " << daemon_.socket()
                                         << "\n"
                                         << config;
  }
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  EXPECT_NE(daemon_.log().find("removed stale segment"), std::string::npos);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(StatsOf(*c)["blocks"], 0);
  EXPECT_EQ(StatsOf(*c)["warm_adopted_blocks"], 0);
  EXPECT_EQ(VerifiedHits(*c, "a", a), 0u);
  // The replaced host pool has the new size.
  struct stat s {};
  ASSERT_EQ(::stat(Shm("host").c_str(), &s), 0);
  EXPECT_EQ(static_cast<size_t>(s.st_size), 512u * 8192u);
}

TEST_F(WarmRestartTest, BlockCorruptedBetweenRunsIsDroppedWithItsDescendants) {
  const auto a = Tokens(6, 5);
  std::vector<BlockKey> keys;
  {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    keys = c->Keys(a);
    Put(*c, "a", a);
  }
  Stop(SIGTERM);
  {
    // Find block 2 in the host pool by its payload and change one byte.
    const int fd = ::open(Shm("host").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    struct stat s {};
    ASSERT_EQ(::fstat(fd, &s), 0);
    auto* p = static_cast<std::byte*>(::mmap(nullptr, s.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    int found = 0;
    for (size_t slot = 0; slot < static_cast<size_t>(s.st_size) / 8192; ++slot) {
      if (PayloadIntact(keys[2], p + slot * 8192, 8192)) {
        p[slot * 8192 + 100] ^= std::byte{1};
        ++found;
      }
    }
    ::munmap(p, s.st_size);
    ASSERT_EQ(found, 1);
  }
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto st = StatsOf(*c);
  EXPECT_EQ(st["warm_adopted_blocks"], 2);
  EXPECT_EQ(st["warm_dropped_blocks"], 3);
  EXPECT_EQ(VerifiedHits(*c, "a", a), 2u);
}

TEST_F(WarmRestartTest, AGarbledManifestNeverBlocksAStart) {
  const auto a = Tokens(7, 2);
  {
    auto c = Connect();
    ASSERT_NE(c, nullptr);
    Put(*c, "a", a);
  }
  Stop(SIGTERM);
  std::ofstream(Shm("warm"), std::ios::trunc) << "not a manifest";
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  EXPECT_NE(daemon_.log().find("removed stale segment"), std::string::npos);
  EXPECT_NE(::access(Shm("warm").c_str(), F_OK), 0);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(VerifiedHits(*c, "a", a), 0u);
  Put(*c, "a", a);  // And it serves.
  EXPECT_EQ(VerifiedHits(*c, "a", a), 2u);
}

}  // namespace
}  // namespace kvtier::testing
