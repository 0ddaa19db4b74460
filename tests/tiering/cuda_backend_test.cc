// CudaBackend on a real GPU (label `gpu`): the gather kernel and the copy
// engines against a reference copy, a GPU pool read through CUDA IPC from
// another process, and fence ordering across the two streams. Without a GPU
// every test skips, saying so.
#include "kvtier/tiering/cuda_backend.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "copy_kernels.h"
#include "kvtier/tiering/backend_select.h"
#include "kvtier/gpu_pool_handle.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

constexpr auto kWait = std::chrono::seconds(30);
constexpr size_t kKiB = 1024;
constexpr const char* kChildHandleEnv = "KVTIER_TEST_IPC_HANDLE";
constexpr const char* kChildSeedEnv = "KVTIER_TEST_IPC_SEED";

#define ASSERT_CUDA(expr)                                                  \
  do {                                                                     \
    const cudaError_t _e = (expr);                                         \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)

std::vector<std::byte> Pattern(size_t bytes, uint64_t seed) {
  std::vector<std::byte> v(bytes);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  return v;
}

std::string Hex(const std::vector<uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::vector<uint8_t> Unhex(const std::string& s) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuInfo gpu = DetectGpu();
    if (gpu.devices == 0) {
      std::printf("needs a GPU: %s\n", gpu.error.c_str());
      GTEST_SKIP() << "needs a GPU (" << gpu.error << ")";
    }
    CudaBackendOptions o;
    o.name_prefix = testing::UniqueShmPrefix("cuda-backend");
    o.pin_chunk_bytes = 64 << 20;  // Several chunks per pool: runs must not cross them.
    auto b = CreateCudaBackend(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    std::printf("%s\n", backend_->Describe().c_str());
  }

  std::unique_ptr<Pool> MakePool(Tier tier, size_t slot_bytes, uint32_t slots, const std::string& name) {
    auto p = backend_->CreatePool(PoolSpec{tier, slot_bytes, slots, name});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }

  static std::vector<std::byte> ReadGpu(const Pool& p) {
    std::vector<std::byte> v(p.slot_bytes() * p.slots());
    EXPECT_EQ(cudaMemcpy(v.data(), p.base(), v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

  std::unique_ptr<CudaBackend> backend_;
};

// The one test that runs only without a GPU: creation fails with a status, not a crash.
TEST(CudaBackendWithoutGpuTest, CreationFailsAsUnavailable) {
  const GpuInfo gpu = DetectGpu();
  if (gpu.devices > 0) GTEST_SKIP() << "this machine has a GPU";
  CudaBackendOptions o;
  o.name_prefix = testing::UniqueShmPrefix("cuda-backend-none");
  auto b = CreateCudaBackend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().ToString();
  EXPECT_NE(b.status().message().find("cudaSetDevice"), std::string::npos) << b.status().ToString();
}

// The promotion fence ring: kFenceEventRing distinct interprocess event
// handles; the export carries the device's UUID; a writer event that is no
// live process's event is refused, and the demotion stream still works after.
TEST_F(CudaBackendTest, ExportsFenceEventsAndRefusesABogusWriterEvent) {
  const std::vector<wire::IpcEventHandle> events = backend_->PromotionFenceEvents();
  ASSERT_EQ(events.size(), kFenceEventRing);
  for (size_t i = 0; i < events.size(); ++i) {
    for (size_t j = i + 1; j < events.size(); ++j) EXPECT_NE(events[i], events[j]) << i << " " << j;
  }
  auto gpu = MakePool(Tier::kGpu, 64 * kKiB, 8, "fence-gpu");
  auto host = MakePool(Tier::kHost, 64 * kKiB, 8, "fence-host");
  ASSERT_TRUE(gpu && host);
  auto decoded = DecodeGpuPoolHandle(gpu->Export().ipc_handle);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  cudaDeviceProp prop{};
  ASSERT_CUDA(cudaGetDeviceProperties(&prop, 0));
  EXPECT_EQ(std::memcmp(decoded->device_uuid.data(), &prop.uuid, kGpuUuidBytes), 0);
  std::printf("pool on %s\n", FormatGpuUuid(decoded->device_uuid).c_str());

  wire::IpcEventHandle bogus{};
  for (size_t i = 0; i < bogus.size(); ++i) bogus[i] = static_cast<uint8_t>(0x5a ^ i);
  const Status st = backend_->WatchClientEvent(/*client=*/1, bogus).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  const std::vector<CopyOp> ops = {{0, 1}, {2, 3}};
  auto fence = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, ops);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  EXPECT_TRUE(backend_->Wait(*fence, std::chrono::seconds(10)).ok());
}

// Batch shapes: one block, a contiguous run, scattered, reversed, and a batch
// larger than one submission.
std::vector<std::vector<CopyOp>> Shapes(uint32_t slots, std::mt19937& rng) {
  std::vector<std::vector<CopyOp>> shapes;
  shapes.push_back({{3, slots - 1}});
  std::vector<CopyOp> run;
  for (uint32_t i = 0; i < 8; ++i) run.push_back({10 + i, 20 + i});
  shapes.push_back(run);
  std::vector<uint32_t> perm(slots);
  for (uint32_t i = 0; i < slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<CopyOp> scattered;
  for (uint32_t i = 0; i < slots / 2; ++i) scattered.push_back({perm[i], perm[slots - 1 - i]});
  shapes.push_back(scattered);
  std::vector<CopyOp> reversed;
  for (uint32_t i = 0; i < slots; ++i) reversed.push_back({i, slots - 1 - i});
  shapes.push_back(reversed);
  return shapes;
}

TEST_F(CudaBackendTest, CopiesMatchAReferenceCopyForEveryBlockSize) {
  std::mt19937 rng(7);
  for (size_t slot_bytes : {4 * kKiB, 32 * kKiB, 64 * kKiB, 2048 * kKiB}) {
    // 1,100 slots of 4 KiB need two kernel launches for the reversed batch.
    const uint32_t slots = slot_bytes <= 32 * kKiB ? 1100 : 96;
    SCOPED_TRACE("slot_bytes " + std::to_string(slot_bytes));
    auto host = MakePool(Tier::kHost, slot_bytes, slots, "h" + std::to_string(slot_bytes));
    auto back = MakePool(Tier::kHost, slot_bytes, slots, "b" + std::to_string(slot_bytes));
    auto gpu = MakePool(Tier::kGpu, slot_bytes, slots, "g" + std::to_string(slot_bytes));
    ASSERT_TRUE(host && back && gpu);
    const size_t bytes = slot_bytes * slots;
    int shape_no = 0;
    for (const std::vector<CopyOp>& ops : Shapes(slots, rng)) {
      SCOPED_TRACE("shape " + std::to_string(shape_no++) + " (" + std::to_string(ops.size()) + " ops)");
      const std::vector<std::byte> src = Pattern(bytes, rng());
      std::memcpy(host->base(), src.data(), bytes);
      ASSERT_CUDA(cudaMemset(gpu->base(), 0, bytes));
      std::memset(back->base(), 0, bytes);

      auto up = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, ops);
      ASSERT_TRUE(up.ok()) << up.status().ToString();
      ASSERT_TRUE(backend_->Wait(*up, kWait).ok());
      std::vector<std::byte> want_gpu(bytes, std::byte{0});
      for (const CopyOp& op : ops) {
        std::memcpy(&want_gpu[op.dst_slot * slot_bytes], &src[op.src_slot * slot_bytes], slot_bytes);
      }
      ASSERT_TRUE(ReadGpu(*gpu) == want_gpu);

      // And back down, same op list with the sides swapped.
      std::vector<CopyOp> down;
      for (const CopyOp& op : ops) down.push_back({op.dst_slot, op.src_slot});
      auto dn = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *back, down);
      ASSERT_TRUE(dn.ok()) << dn.status().ToString();
      ASSERT_TRUE(backend_->Wait(*dn, kWait).ok());
      for (const CopyOp& op : ops) {
        ASSERT_EQ(std::memcmp(back->slot_data(op.src_slot), &src[op.src_slot * slot_bytes], slot_bytes), 0);
      }
    }
  }
  EXPECT_GT(backend_->copy_stats(CopyDirection::kHostToGpu).bytes, 0u);
}

// The kernel alone, with sizes and offsets that defeat the 16-byte path.
TEST_F(CudaBackendTest, GatherKernelHandlesUnalignedCopies) {
  constexpr size_t kBytes = 1 << 20;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_CUDA(cudaMalloc(&a, kBytes));
  ASSERT_CUDA(cudaMalloc(&b, kBytes));
  const std::vector<std::byte> src = Pattern(kBytes, 11);
  ASSERT_CUDA(cudaMemcpy(a, src.data(), kBytes, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(b, 0, kBytes));
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto batch = std::make_unique<GatherCopyBatch>();
  std::vector<std::byte> want(kBytes, std::byte{0});
  const size_t sizes[] = {1, 15, 16, 17, 1000, 4096, 65537};
  size_t at = 0;
  for (size_t n : sizes) {
    const size_t src_at = at + 3;
    const size_t dst_at = kBytes / 2 + at + 1;
    batch->copies[batch->count++] =
        GatherCopy{static_cast<std::byte*>(a) + src_at, static_cast<std::byte*>(b) + dst_at, n};
    std::memcpy(&want[dst_at], &src[src_at], n);
    at += n + 64;
  }
  ASSERT_TRUE(LaunchGatherCopy(*batch, stream).ok());
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  std::vector<std::byte> got(kBytes);
  ASSERT_CUDA(cudaMemcpy(got.data(), b, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(got == want);

  batch->count = 0;
  EXPECT_EQ(LaunchGatherCopy(*batch, stream).code(), StatusCode::kInvalidArgument);
  batch->count = 1;
  EXPECT_EQ(LaunchGatherCopy(*batch, nullptr).code(), StatusCode::kInvalidArgument);
  cudaStreamDestroy(stream);
  cudaFree(a);
  cudaFree(b);
}

// A child process started from this binary opens the exported handle and
// compares the pool with the pattern it recomputes from the seed. The child is
// exec'd, not just forked: CUDA is unusable in a forked child of a CUDA process.
TEST_F(CudaBackendTest, ExportedPoolReadsIdenticallyInAnotherProcess) {
  constexpr size_t kSlot = 64 * kKiB;
  constexpr uint32_t kSlots = 64;
  constexpr uint64_t kSeed = 1234;
  auto gpu = MakePool(Tier::kGpu, kSlot, kSlots, "ipc");
  ASSERT_TRUE(gpu);
  const std::vector<std::byte> src = Pattern(kSlot * kSlots, kSeed);
  ASSERT_CUDA(cudaMemcpy(gpu->base(), src.data(), src.size(), cudaMemcpyHostToDevice));
  const PoolHandle h = gpu->Export();
  EXPECT_EQ(h.backend, BackendKind::kCuda);
  auto decoded = DecodeGpuPoolHandle(h.ipc_handle);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->bytes, kSlot * kSlots);

  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls (the CUDA runtime has threads that may hold malloc's lock).
  std::vector<std::string> env_strings = {std::string(kChildHandleEnv) + "=" + Hex(h.ipc_handle),
                                          std::string(kChildSeedEnv) + "=" + std::to_string(kSeed)};
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char arg0[] = "cuda_backend_test";
  char arg1[] = "--gtest_filter=CudaIpcChild.*";
  char* argv[] = {arg0, arg1, nullptr};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child could not read identical bytes";
}

TEST(CudaIpcChild, ReadsTheExportedPool) {
  const char* hex = std::getenv(kChildHandleEnv);
  if (hex == nullptr) GTEST_SKIP() << "runs only as the child of ExportedPoolReadsIdenticallyInAnotherProcess";
  auto h = DecodeGpuPoolHandle(Unhex(hex));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  cudaIpcMemHandle_t raw;
  std::memcpy(&raw, h->raw.data(), sizeof(raw));
  void* base = nullptr;
  ASSERT_CUDA(cudaIpcOpenMemHandle(&base, raw, cudaIpcMemLazyEnablePeerAccess));
  std::vector<std::byte> got(h->bytes);
  ASSERT_CUDA(cudaMemcpy(got.data(), base, got.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(got == Pattern(h->bytes, std::stoull(std::getenv(kChildSeedEnv))));
  ASSERT_CUDA(cudaIpcCloseMemHandle(base));
}

// A promotion submitted behind a long demotion backlog completes first: the
// two directions are independent streams served by separate copy engines
// (host-to-device and device-to-host); stream priority would not order
// copy-engine transfers, only kernels.
TEST_F(CudaBackendTest, PromotionIsNotQueuedBehindDemotions) {
  constexpr size_t kSlot = 2048 * kKiB;
  constexpr uint32_t kSlots = 128;
  auto host = MakePool(Tier::kHost, kSlot, kSlots, "fh");
  auto gpu = MakePool(Tier::kGpu, kSlot, kSlots, "fg");
  ASSERT_TRUE(host && gpu);
  std::atomic<int> notified{0};
  backend_->SetCompletionNotifier([&] { ++notified; });

  std::vector<CopyOp> all;
  for (uint32_t i = 0; i < kSlots; ++i) all.push_back({i, i});
  std::vector<Fence> demotions;
  for (int i = 0; i < 24; ++i) {  // 6 GiB: tens of milliseconds on any PCIe generation.
    auto f = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, all);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    demotions.push_back(*f);
  }
  const std::vector<CopyOp> one = {{0, 1}};
  auto promo = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, one);
  ASSERT_TRUE(promo.ok());
  ASSERT_TRUE(backend_->Wait(*promo, kWait).ok());
  EXPECT_FALSE(backend_->IsComplete(demotions.back())) << "the promotion waited for the demotion backlog";

  // Within a stream, fences complete in submission order.
  for (const Fence& f : demotions) {
    ASSERT_TRUE(backend_->Wait(f, kWait).ok());
    for (const Fence& earlier : demotions) {
      if (earlier.seq < f.seq) {
        EXPECT_TRUE(backend_->IsComplete(earlier));
      }
    }
  }
  // The notifier runs just after each counter advances: give the last one a moment.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (notified.load() < 25 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(notified.load(), 25);
  backend_->SetCompletionNotifier(nullptr);
  const CopyStats st = backend_->copy_stats(CopyDirection::kGpuToHost);
  EXPECT_EQ(st.batches, 24u);
  EXPECT_EQ(st.bytes, 24u * kSlots * kSlot);
}

}  // namespace
}  // namespace kvtier::tiering
