// kvtierd on the cuda backend with worker processes (label `gpu`): the GPU pool
// shared through CUDA IPC, promotion fences waited for on a worker's own
// stream, demotions ordered after the writer's event, a worker killed while it
// holds a lease. Without a GPU every test skips and says so.
#include <signal.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "cuda_driver.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

std::string CudaConfig() {
  std::string c = kSmallDaemonConfig;
  const std::string first = "backend: host\n";
  EXPECT_EQ(c.rfind(first, 0), 0u);
  return "backend: cuda\n" + c.substr(first.size());
}

std::string NoGpuReason() {
  auto d = client_internal::CudaDriver::Default();
  if (!d.ok()) return d.status().ToString();
  int n = 0;
  if ((*d)->cuDeviceGetCount(&n) != client_internal::kCudaSuccess || n == 0) return "the driver sees no device";
  return "";
}

Result<std::string> RunGpuWorker(const std::string& socket, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {GpuWorkerPath(), socket};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Process::Spawn(argv);
  if (!p.ok()) return p.status();
  auto line = p->ReadLine(60s);
  auto rc = p->Wait(60s);
  if (!line.ok()) return line.status();
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return Internal("gpu worker exited " + std::to_string(*rc) + ": " + *line);
  return line;
}

class GpuIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << "needs a GPU: " << why;
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
    ASSERT_NE(daemon_.log().find("backend cuda (configured"), std::string::npos) << daemon_.log();
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  DaemonProcess daemon_{CudaConfig()};
};

TEST_F(GpuIntegrationTest, TwoProcessesReadIdenticalBytesThroughIpc) {
  auto w = RunGpuWorker(daemon_.socket(), {"write", "a", "7", "16"});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(JsonNumber(*w, "stored"), 16);
  for (const char* session : {"b", "c"}) {
    auto r = RunGpuWorker(daemon_.socket(), {"read", session, "7", "16"});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(JsonNumber(*r, "matched"), 16) << *r;
    EXPECT_EQ(JsonNumber(*r, "intact"), 16) << *r;
  }
}

TEST_F(GpuIntegrationTest, ReaderWaitsForThePromotionOnItsOwnStream) {
  ASSERT_TRUE(RunGpuWorker(daemon_.socket(), {"write", "a", "8", "64"}).ok());
  ClientOptions o;
  o.socket_path = daemon_.socket();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto demoted = (*c)->Demote("a");
  ASSERT_TRUE(demoted.ok()) << demoted.status().ToString();
  EXPECT_EQ(*demoted, 64u);
  // Wait until every block is in the host tier, so the reader's acquire promotes.
  const uint32_t bt = (*c)->block_tokens();
  std::vector<TokenId> tokens(64 * bt);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(8 * 100000 + i);
  std::vector<Tier> tiers(64, Tier::kGpu);
  for (auto deadline = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < deadline;) {
    tiers.assign(64, Tier::kGpu);
    if ((*c)->Probe(tokens, tiers) == 64 && tiers == std::vector<Tier>(64, Tier::kHost)) break;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(tiers, std::vector<Tier>(64, Tier::kHost));
  auto r = RunGpuWorker(daemon_.socket(), {"read", "b", "8", "64"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(JsonNumber(*r, "promoted"), 64) << *r;
  EXPECT_EQ(JsonNumber(*r, "intact"), 64) << *r;
}

TEST_F(GpuIntegrationTest, BlocksAreHeldBackUntilTheirWriterEventCompletes) {
  auto w = RunGpuWorker(daemon_.socket(), {"write", "a", "9", "32", "gate"});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(JsonTrue(*w, "held_back")) << "served or demoted before the writer ran: " << *w;
  EXPECT_EQ(JsonNumber(*w, "intact"), 32) << *w;
}

// A writer killed before its GPU wrote the blocks it committed: kvtierd drops
// them (never served), and everyone else is served as before.
TEST_F(GpuIntegrationTest, AWriterKilledMidWriteLosesItsBlocks) {
  auto writer = Process::Spawn({GpuWorkerPath(), daemon_.socket(), "write", "s", "11", "8", "stuck"});
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  auto line = writer->ReadLine(60s);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_TRUE(JsonTrue(*line, "held_back")) << *line;
  writer->Kill(SIGKILL);
  ASSERT_TRUE(writer->Wait(10s).ok());
  ClientOptions o;
  o.socket_path = daemon_.socket();
  o.open_gpu = false;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<TokenId> tokens(8 * (*c)->block_tokens());
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(11 * 100000 + i);
  double dropped = 0;
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    auto stats = (*c)->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    for (const auto& [name, value] : *stats) {
      if (name == "unfinished_writes_dropped") dropped = value;
    }
    if (dropped > 0) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(dropped, 8);
  EXPECT_EQ((*c)->Probe(tokens), 0u) << "no unwritten block is published";
  auto r = RunGpuWorker(daemon_.socket(), {"write", "t", "12", "8"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST_F(GpuIntegrationTest, WorkerKilledWhileHoldingALease) {
  ASSERT_TRUE(RunGpuWorker(daemon_.socket(), {"write", "a", "10", "16"}).ok());
  auto holder = Process::Spawn({GpuWorkerPath(), daemon_.socket(), "hold", "h", "10", "16"});
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  auto line = holder->ReadLine(60s);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(JsonNumber(*line, "intact"), 16) << *line;
  holder->Kill(SIGKILL);
  ASSERT_TRUE(holder->Wait(10s).ok());
  // The daemon drops the dead worker's lease and keeps serving everyone else.
  ClientOptions o;
  o.socket_path = daemon_.socket();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  bool released = false;
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    // Leased blocks are skipped by a demotion: all 16 move only once the lease is gone.
    auto demoted = (*c)->Demote("a");
    if (demoted.ok() && *demoted == 16u) {
      released = true;
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(released) << "blocks of the killed worker's lease never became movable";
  auto r = RunGpuWorker(daemon_.socket(), {"read", "b", "10", "16"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(JsonNumber(*r, "intact"), 16) << *r;
}

}  // namespace
}  // namespace kvtier::testing
