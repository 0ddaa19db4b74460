// Backend selection in a real kvtierd and what a client gets on each backend,
// on a machine with or without a GPU, plus libkvtier's CUDA driver loader.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cuda_driver.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/gpu_pool_handle.h"
#include "kvtier/wire.h"
#include "payload.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using client_internal::CudaDriver;

// kSmallDaemonConfig with another `backend:` line.
std::string ConfigWithBackend(const std::string& backend) {
  std::string c = kSmallDaemonConfig;
  const std::string first = "backend: host\n";
  EXPECT_EQ(c.rfind(first, 0), 0u);
  return "backend: " + backend + "\n" + c.substr(first.size());
}

// True when this machine has a CUDA driver and at least one device.
bool GpuPresent() {
  auto d = CudaDriver::Default();
  if (!d.ok()) return false;
  int n = 0;
  return (*d)->cuDeviceGetCount(&n) == client_internal::kCudaSuccess && n > 0;
}

TEST(CudaDriverTest, MissingLibraryIsAClearError) {
  auto d = CudaDriver::Load("libkvtier-no-such-cuda-driver.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status().message().find("libkvtier-no-such-cuda-driver.so.1"), std::string::npos)
      << d.status().ToString();
  EXPECT_NE(d.status().message().find("no NVIDIA driver"), std::string::npos) << d.status().ToString();
}

TEST(CudaDriverTest, ALibraryThatIsNotTheDriverNamesTheMissingEntryPoint) {
  auto d = CudaDriver::Load("libm.so.6");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status().message().find("no entry point cuInit"), std::string::npos) << d.status().ToString();
}

#ifdef KVTIER_CUDA_STUB_DRIVER
// The toolkit's stub libcuda has every entry point, and each fails: cuInit must
// be reported, not a crash or a half-loaded driver.
TEST(CudaDriverTest, TheToolkitStubLoadsButCannotInitialize) {
  if (!std::filesystem::exists(KVTIER_CUDA_STUB_DRIVER)) GTEST_SKIP() << "no stub " << KVTIER_CUDA_STUB_DRIVER;
  auto d = CudaDriver::Load(KVTIER_CUDA_STUB_DRIVER);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status().message().find("cuInit"), std::string::npos) << d.status().ToString();
}
#endif

TEST(CudaDriverTest, DefaultDriverLoadsOrSaysWhyNot) {
  auto d = CudaDriver::Default();
  if (d.ok()) {
    std::printf("CUDA driver loaded from %s\n", (*d)->library().c_str());
    return;
  }
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status().message().find("libcuda.so.1"), std::string::npos) << d.status().ToString();
  std::printf("no CUDA driver here: %s\n", d.status().ToString().c_str());
}

// A socket that answers one Hello with `welcome` (what a cuda-backend kvtierd
// says), so a client's attach runs here without a GPU.
class FakeDaemon {
 public:
  explicit FakeDaemon(wire::Welcome welcome)
      : path_("/tmp/kvtier-fake-" + std::to_string(::getpid()) + ".sock"), welcome_(std::move(welcome)) {
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 1), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDaemon() {
    thread_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  void Serve() {
    const int c = ::accept(fd_, nullptr, nullptr);
    if (c < 0) return;
    std::array<uint8_t, wire::kHeaderBytes> header{};
    if (::recv(c, header.data(), header.size(), MSG_WAITALL) == static_cast<ssize_t>(header.size())) {
      auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(header));
      std::vector<uint8_t> payload(h.ok() ? h->payload_length : 0);
      if (h.ok() && ::recv(c, payload.data(), payload.size(), MSG_WAITALL) == static_cast<ssize_t>(payload.size())) {
        const std::vector<uint8_t> reply = wire::EncodeFrame(h->request_id, welcome_);
        (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      }
    }
    uint8_t byte = 0;
    while (::recv(c, &byte, 1, 0) > 0) {
    }  // Until the client hangs up.
    ::close(c);
  }

  std::string path_;
  wire::Welcome welcome_;
  int fd_ = -1;
  std::thread thread_;
};

TEST(ClientAttachTest, CudaKvtierdWithoutADriverIsAClearErrorAtConnect) {
  if (CudaDriver::Default().ok()) GTEST_SKIP() << "this machine has a CUDA driver";
  wire::Welcome w;
  w.profile = ModelProfile{"it", 2, 2, 32, DType::kF16, 16};
  w.backend = wire::BackendKind::kCuda;
  GpuPoolHandle gpu;
  gpu.bytes = w.profile.BlockBytes() * 256;
  gpu.device_uuid.fill(0x42);
  gpu.raw.fill(7);
  w.pools.push_back(wire::PoolDesc{Tier::kGpu, w.profile.BlockBytes(), 256, "", EncodeGpuPoolHandle(gpu)});
  w.pools.push_back(wire::PoolDesc{Tier::kHost, w.profile.BlockBytes(), 1024, "/kvtier-fake.host", {}});
  w.index_segment = "/kvtier-fake.index";
  w.fence_segment = "/kvtier-fake.fences";
  w.fence_events.resize(64);
  FakeDaemon fake(w);
  ClientOptions o;
  o.socket_path = fake.path();
  o.reconnect = false;
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok()) << "attached to a GPU pool without a CUDA driver";
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
  EXPECT_NE(c.status().message().find("kvtierd runs the cuda backend"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("libcuda.so.1"), std::string::npos) << c.status().ToString();
}

TEST(BackendChoiceTest, CudaWithoutAGpuRefusesToStartAndSaysWhy) {
  if (GpuPresent()) GTEST_SKIP() << "a GPU is present: backend cuda starts (covered by the gpu-labelled tests)";
  DaemonProcess d(ConfigWithBackend("cuda"));
  const Status st = d.Start();
  ASSERT_FALSE(st.ok()) << "kvtierd started with backend: cuda and no GPU";
  auto rc = d.Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_NE(*rc, 0);
  const std::string log = d.log();
  EXPECT_NE(log.find("cannot start"), std::string::npos) << log;
  EXPECT_NE(log.find("backend: cuda:"), std::string::npos) << log;
  EXPECT_TRUE(log.find("no CUDA device") != std::string::npos ||
              log.find("without KVTIER_WITH_CUDA") != std::string::npos ||
              log.find("without the CUDA backend") != std::string::npos)
      << log;
  // Nothing was left behind: no socket.
  EXPECT_FALSE(std::filesystem::exists(d.socket()));
}

TEST(BackendChoiceTest, AutoLogsItsChoiceAndClientsWorkOnIt) {
  DaemonProcess d(ConfigWithBackend("auto"));
  ASSERT_TRUE(d.Start().ok()) << d.log();
  const bool gpu = GpuPresent();
  const std::string log = d.log();
  EXPECT_NE(log.find(gpu ? "backend cuda (auto:" : "backend host (auto:"), std::string::npos) << log;

  ClientOptions o;
  o.socket_path = d.socket();
  o.client_name = "backend-test";
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->backend(), gpu ? "cuda" : "host");
  if (gpu) return;  // The GPU path is the gpu-labelled integration test's.

  // Host backend: commit without a writer event, read back, wait on "a stream".
  const uint32_t bt = (*c)->block_tokens();
  std::vector<TokenId> tokens(4 * bt);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(1000 + i);
  const std::vector<BlockKey> keys = (*c)->Keys(tokens);
  auto w = (*c)->Allocate(4);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const Status rec = w->RecordWritten(nullptr);
  EXPECT_EQ(rec.code(), StatusCode::kFailedPrecondition) << rec.ToString();
  EXPECT_NE(rec.message().find("host"), std::string::npos) << rec.ToString();
  for (size_t i = 0; i < 4; ++i) FillPayload(keys[i], w->data(i), w->slot_bytes());
  auto committed = (*c)->Commit(*w, "s", BlockKey{}, 0, tokens);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_EQ(committed->stored, 4u);

  ASSERT_TRUE((*c)->Demote("s").ok());
  std::vector<Tier> tiers(4, Tier::kGpu);
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < deadline && tiers != std::vector<Tier>(4, Tier::kHost);) {
    tiers.assign(4, Tier::kGpu);
    (*c)->Probe(tokens, tiers);
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(tiers, std::vector<Tier>(4, Tier::kHost)) << "the demotion did not finish";
  auto lease = (*c)->Acquire("s", tokens, kvtier::Promote::kNow);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(lease->size(), 4u);
  EXPECT_EQ(lease->promoted(), 4u);
  // No GPU-side fence on the host backend: WaitOnStream waits on the CPU.
  ASSERT_TRUE(lease->WaitOnStream(nullptr, 5s).ok());
  ASSERT_TRUE(lease->Wait(0ms).ok()) << "WaitOnStream returned before the fence completed";
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) << "block " << i;
  }
}

}  // namespace
}  // namespace kvtier::testing
