// HostBackend: shared-memory pools, the copy thread and its fences.
#include "kvtier/tiering/host_backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kvtier/fence_layout.h"
#include "kvtier/shm_segment.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

constexpr auto kWait = std::chrono::seconds(10);

class HostBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = testing::UniqueShmPrefix("host-backend");
    HostBackendOptions o;
    o.name_prefix = prefix_;
    auto b = CreateHostBackend(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
  }

  std::unique_ptr<Pool> MakePool(Tier tier, size_t slot_bytes, uint32_t slots, const std::string& name) {
    auto p = backend_->CreatePool(PoolSpec{tier, slot_bytes, slots, name});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }

  static void FillRandom(Pool& p, std::mt19937& rng) {
    for (size_t i = 0; i < p.slot_bytes() * p.slots(); ++i) p.base()[i] = static_cast<std::byte>(rng());
  }

  static std::vector<std::byte> Snapshot(const Pool& p) {
    return std::vector<std::byte>(p.base(), p.base() + p.slot_bytes() * p.slots());
  }

  // Applies `ops` to a snapshot of the destination, as the backend should.
  static void Apply(const std::vector<std::byte>& src, std::vector<std::byte>& dst, size_t slot_bytes,
                    const std::vector<CopyOp>& ops) {
    for (const CopyOp& op : ops) {
      std::memcpy(dst.data() + op.dst_slot * slot_bytes, src.data() + op.src_slot * slot_bytes, slot_bytes);
    }
  }

  // A batch of `n` ops with distinct destinations and random sources.
  static std::vector<CopyOp> RandomOps(std::mt19937& rng, uint32_t n, uint32_t src_slots, uint32_t dst_slots) {
    std::vector<uint32_t> dst(dst_slots);
    for (uint32_t i = 0; i < dst_slots; ++i) dst[i] = i;
    std::shuffle(dst.begin(), dst.end(), rng);
    std::vector<CopyOp> ops;
    for (uint32_t i = 0; i < n && i < dst_slots; ++i)
      ops.push_back(CopyOp{static_cast<uint32_t>(rng() % src_slots), dst[i]});
    return ops;
  }

  std::string prefix_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(HostBackendTest, DescribesItself) {
  EXPECT_EQ(backend_->kind(), BackendKind::kHost);
  EXPECT_STREQ(BackendKindName(BackendKind::kHost), "host");
  EXPECT_STREQ(BackendKindName(BackendKind::kCuda), "cuda");
  EXPECT_NE(backend_->Describe().find(prefix_), std::string::npos) << backend_->Describe();
  EXPECT_EQ(backend_->FenceSegmentName(), "memfd:" + prefix_ + ".fences");
  EXPECT_GE(backend_->FenceSegmentFd(), 0);
}

TEST_F(HostBackendTest, PoolsAreSharedSegmentsOthersCanMap) {
  auto gpu = MakePool(Tier::kGpu, 100, 5, "gpu");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->tier(), Tier::kGpu);
  EXPECT_EQ(gpu->slot_bytes(), 100u);
  EXPECT_EQ(gpu->slots(), 5u);
  EXPECT_EQ(gpu->slot_data(3), gpu->base() + 300);
  const PoolHandle h = gpu->Export();
  EXPECT_EQ(h.backend, BackendKind::kHost);
  EXPECT_EQ(h.tier, Tier::kGpu);
  EXPECT_EQ(h.slot_bytes, 100u);
  EXPECT_EQ(h.slots, 5u);
  EXPECT_EQ(h.shm_name, "memfd:" + prefix_ + ".gpu");
  EXPECT_TRUE(h.ipc_handle.empty());
  EXPECT_TRUE(h.clients_write);
  ASSERT_GE(h.fd, 0);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + prefix_ + ".gpu")) << "nothing in /dev/shm to open or squat";

  // Another process maps it from the descriptor, writable (the GPU tier is
  // what workers write), and cannot resize it.
  auto other = ShmSegment::MapPassed(h.fd, /*writable=*/true, 500, "gpu");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_EQ(other->size(), 500u);
  std::memset(gpu->slot_data(2), 0xab, 100);
  EXPECT_EQ(other->data()[250], std::byte{0xab});
  EXPECT_EQ(other->data()[199], std::byte{0});
  other->data()[0] = std::byte{1};
  EXPECT_EQ(gpu->slot_data(0)[0], std::byte{1});
  EXPECT_NE(::ftruncate(h.fd, 0), 0);
  EXPECT_NE(::ftruncate(h.fd, 1000), 0);
  EXPECT_EQ(ShmSegment::MapPassed(h.fd, false, 501, "gpu").status().code(), StatusCode::kCorrupt)
      << "shorter than announced";
}

// The host tier and the fences are the daemon's to write: a descriptor of
// them maps read-only and nothing upgrades it (mmap, mprotect, write, resizing,
// punching holes).
TEST_F(HostBackendTest, HostPoolAndFencesAreSealedReadOnlyForOthers) {
  auto host = MakePool(Tier::kHost, 4096, 4, "host");
  ASSERT_NE(host, nullptr);
  const PoolHandle h = host->Export();
  EXPECT_FALSE(h.clients_write);
  for (const int fd : {h.fd, backend_->FenceSegmentFd()}) {
    ASSERT_GE(fd, 0);
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    const size_t bytes = static_cast<size_t>(st.st_size);
    EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    void* ro = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(ro, MAP_FAILED);
    EXPECT_NE(::mprotect(ro, bytes, PROT_READ | PROT_WRITE), 0) << "a read-only mapping cannot be upgraded";
    ::munmap(ro, bytes);
    const char byte = 1;
    EXPECT_LT(::pwrite(fd, &byte, 1, 0), 0);
    EXPECT_NE(::ftruncate(fd, 0), 0);
    EXPECT_NE(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
    EXPECT_NE(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0) << "sealed against further seals";
    EXPECT_FALSE(ShmSegment::MapPassed(fd, /*writable=*/true, 1, "x").ok());
    EXPECT_TRUE(ShmSegment::MapPassed(fd, /*writable=*/false, 1, "x").ok());
  }
  // The daemon's own mapping still writes them.
  std::memset(host->slot_data(1), 0x5a, 4096);
  auto view = ShmSegment::MapPassed(h.fd, false, 4 * 4096, "host");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data()[4096], std::byte{0x5a});
}

TEST_F(HostBackendTest, CreatePoolRejectsEmptyPools) {
  EXPECT_EQ(backend_->CreatePool(PoolSpec{Tier::kGpu, 0, 4, "a"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->CreatePool(PoolSpec{Tier::kGpu, 64, 0, "b"}).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(HostBackendTest, SegmentsAreNamelessAndEndWithTheirLastDescriptor) {
  auto pool = MakePool(Tier::kHost, 64, 2, "host");
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + prefix_ + ".host"));
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + prefix_ + ".fences"));
  const int kept = ::dup(backend_->FenceSegmentFd());
  ASSERT_GE(kept, 0);
  pool.reset();
  backend_.reset();
  // A client's mapping (here its descriptor) keeps the memory until it lets go.
  auto still = ShmSegment::MapPassed(kept, false, sizeof(FenceSegment), "fences");
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ(reinterpret_cast<const FenceSegment*>(still->data())->magic, kFenceMagic);
  ::close(kept);
}

TEST_F(HostBackendTest, SubmitValidatesItsArguments) {
  auto gpu = MakePool(Tier::kGpu, 64, 4, "gpu");
  auto host = MakePool(Tier::kHost, 64, 4, "host");
  auto host_wide = MakePool(Tier::kHost, 128, 4, "host-wide");
  auto gpu2 = MakePool(Tier::kGpu, 64, 4, "gpu2");
  ASSERT_TRUE(gpu && host && host_wide && gpu2);
  const CopyOp ok[] = {{0, 1}};
  const CopyOp bad_src[] = {{4, 0}};
  const CopyOp bad_dst[] = {{0, 4}};
  auto code = [](const Result<Fence>& r) { return r.ok() ? StatusCode::kOk : r.status().code(); };
  EXPECT_EQ(code(backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host_wide, ok)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(backend_->SubmitCopies(CopyDirection::kGpuToHost, *host, *gpu, ok)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(backend_->SubmitCopies(CopyDirection::kHostToGpu, *gpu, *host, ok)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *gpu2, ok)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, bad_src)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, bad_dst)),
            StatusCode::kInvalidArgument);
  // Nothing was queued by the refused calls: the first accepted batch is sequence 1.
  auto f = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, ok);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->seq, 1u);
  EXPECT_EQ(f->stream, CopyDirection::kGpuToHost);
  EXPECT_TRUE(backend_->Wait(*f, kWait).ok());
}

TEST_F(HostBackendTest, NullAndUnknownFences) {
  EXPECT_TRUE(backend_->IsComplete(Fence{}));
  EXPECT_TRUE(backend_->Wait(Fence{}, milliseconds(0)).ok());
  // A fence past anything submitted never completes: Wait times out.
  const Fence future{100, CopyDirection::kHostToGpu};
  EXPECT_FALSE(backend_->IsComplete(future));
  const auto start = std::chrono::steady_clock::now();
  const Status st = backend_->Wait(future, milliseconds(30));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(25));
}

TEST_F(HostBackendTest, EmptyBatchCompletes) {
  auto gpu = MakePool(Tier::kGpu, 64, 4, "gpu");
  auto host = MakePool(Tier::kHost, 64, 4, "host");
  ASSERT_TRUE(gpu && host);
  auto f = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, {});
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->IsNull());
  EXPECT_TRUE(backend_->Wait(*f, kWait).ok());
}

TEST_F(HostBackendTest, CopiesLandByteExactForManyBatchShapes) {
  std::mt19937 rng(99);
  int pool_id = 0;
  for (size_t slot_bytes : {size_t{1}, size_t{3}, size_t{64}, size_t{4096 + 7}, size_t{65536}}) {
    const uint32_t gpu_slots = 17, host_slots = 29;
    auto gpu = MakePool(Tier::kGpu, slot_bytes, gpu_slots, "gpu" + std::to_string(pool_id));
    auto host = MakePool(Tier::kHost, slot_bytes, host_slots, "host" + std::to_string(pool_id));
    ++pool_id;
    ASSERT_TRUE(gpu && host);
    FillRandom(*gpu, rng);
    FillRandom(*host, rng);

    // Many demotion batches in flight at once: one stream, applied in order.
    std::vector<std::byte> want_host = Snapshot(*host);
    const std::vector<std::byte> gpu_bytes = Snapshot(*gpu);
    Fence last;
    for (uint32_t n : {1u, 0u, 2u, 17u, 5u, 16u, 1u, 9u}) {
      const auto ops = RandomOps(rng, n, gpu_slots, host_slots);
      Apply(gpu_bytes, want_host, slot_bytes, ops);
      auto f = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, ops);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      EXPECT_GT(f->seq, last.seq);
      last = *f;
    }
    ASSERT_TRUE(backend_->Wait(last, kWait).ok());
    ASSERT_EQ(Snapshot(*host), want_host) << "slot_bytes " << slot_bytes;
    ASSERT_EQ(Snapshot(*gpu), gpu_bytes) << "the source is left alone";

    // Then promotions.
    std::vector<std::byte> want_gpu = Snapshot(*gpu);
    const std::vector<std::byte> host_bytes = Snapshot(*host);
    for (uint32_t n : {3u, 17u, 1u, 8u}) {
      const auto ops = RandomOps(rng, n, host_slots, gpu_slots);
      Apply(host_bytes, want_gpu, slot_bytes, ops);
      auto f = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, ops);
      ASSERT_TRUE(f.ok());
      last = *f;
    }
    ASSERT_TRUE(backend_->Wait(last, kWait).ok());
    ASSERT_EQ(Snapshot(*gpu), want_gpu) << "slot_bytes " << slot_bytes;

    // Both streams at once on disjoint slots: each lands byte-exact.
    FillRandom(*gpu, rng);
    FillRandom(*host, rng);
    want_gpu = Snapshot(*gpu);
    want_host = Snapshot(*host);
    // gpu slots [0, 8) and host slots [0, 14) are demotion sources/targets; the rest promote.
    std::vector<CopyOp> down, up;
    for (uint32_t i = 0; i < 8; ++i) down.push_back(CopyOp{i, 13 - i});
    for (uint32_t i = 8; i < gpu_slots; ++i) up.push_back(CopyOp{14 + (i - 8), i});
    Apply(Snapshot(*gpu), want_host, slot_bytes, down);
    Apply(Snapshot(*host), want_gpu, slot_bytes, up);
    auto fd = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, down);
    auto fu = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, up);
    ASSERT_TRUE(fd.ok() && fu.ok());
    ASSERT_TRUE(backend_->Wait(*fd, kWait).ok());
    ASSERT_TRUE(backend_->Wait(*fu, kWait).ok());
    EXPECT_EQ(Snapshot(*gpu), want_gpu);
    EXPECT_EQ(Snapshot(*host), want_host);
  }
}

TEST_F(HostBackendTest, FencesCompleteInSubmissionOrder) {
  auto gpu = MakePool(Tier::kGpu, 256 << 10, 8, "gpu");
  auto host = MakePool(Tier::kHost, 256 << 10, 8, "host");
  ASSERT_TRUE(gpu && host);
  std::vector<Fence> fences;
  for (int i = 0; i < 40; ++i) {
    const CopyOp ops[] = {{static_cast<uint32_t>(i % 8), static_cast<uint32_t>((i * 3) % 8)}};
    auto f = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, ops);
    ASSERT_TRUE(f.ok());
    if (!fences.empty()) {
      EXPECT_EQ(f->seq, fences.back().seq + 1);
    }
    fences.push_back(*f);
  }
  // Scanning newest to oldest: once a fence is seen complete, every older one must be.
  int violations = 0, scans = 0;
  while (!backend_->IsComplete(fences.back())) {
    bool seen_complete = false;
    for (size_t i = fences.size(); i-- > 0;) {
      const bool done = backend_->IsComplete(fences[i]);
      if (seen_complete && !done) ++violations;
      seen_complete = seen_complete || done;
    }
    ++scans;
  }
  EXPECT_EQ(violations, 0);
  for (const Fence& f : fences) EXPECT_TRUE(backend_->IsComplete(f));

  // The fence segment tells clients the same.
  auto seg = ShmSegment::MapPassed(backend_->FenceSegmentFd(), false, sizeof(FenceSegment), "fences");
  ASSERT_TRUE(seg.ok());
  const auto* fs = reinterpret_cast<const FenceSegment*>(seg->data());
  EXPECT_EQ(fs->magic, kFenceMagic);
  EXPECT_EQ(fs->abi_version, kShmAbiVersion);
  EXPECT_EQ(LoadRelaxed(fs->completed[static_cast<int>(CopyDirection::kGpuToHost)]), fences.back().seq);
  EXPECT_EQ(LoadRelaxed(fs->submitted[static_cast<int>(CopyDirection::kGpuToHost)]), fences.back().seq);
  EXPECT_EQ(LoadRelaxed(fs->completed[static_cast<int>(CopyDirection::kHostToGpu)]), 0u);
  RecordProperty("scans", std::to_string(scans));
}

TEST_F(HostBackendTest, CopyStatsCountCompletedCopiesPerDirection) {
  auto gpu = MakePool(Tier::kGpu, 4096, 8, "gpu");
  auto host = MakePool(Tier::kHost, 4096, 8, "host");
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(host, nullptr);
  for (CopyDirection d : {CopyDirection::kGpuToHost, CopyDirection::kHostToGpu}) {
    const CopyStats st = backend_->copy_stats(d);
    EXPECT_EQ(st.batches, 0u);
    EXPECT_EQ(st.bytes, 0u);
    EXPECT_EQ(st.busy_seconds, 0.0);
  }
  const std::vector<CopyOp> three = {{0, 0}, {1, 1}, {2, 2}};
  ASSERT_TRUE(backend_->Wait(*backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, three), kWait).ok());
  auto last = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, std::vector<CopyOp>{{3, 3}});
  ASSERT_TRUE(backend_->Wait(*last, kWait).ok());
  auto up = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, std::vector<CopyOp>{{0, 5}, {1, 6}});
  ASSERT_TRUE(backend_->Wait(*up, kWait).ok());

  const CopyStats down = backend_->copy_stats(CopyDirection::kGpuToHost);
  EXPECT_EQ(down.batches, 2u);
  EXPECT_EQ(down.blocks, 4u);
  EXPECT_EQ(down.bytes, 4u * 4096);
  EXPECT_GT(down.busy_seconds, 0.0);
  const CopyStats promoted = backend_->copy_stats(CopyDirection::kHostToGpu);
  EXPECT_EQ(promoted.batches, 1u);
  EXPECT_EQ(promoted.blocks, 2u);
  EXPECT_EQ(promoted.bytes, 2u * 4096);
  EXPECT_LT(promoted.busy_seconds, 10.0);
}

TEST_F(HostBackendTest, StreamsNumberTheirFencesIndependently) {
  auto gpu = MakePool(Tier::kGpu, 64, 2, "gpu");
  auto host = MakePool(Tier::kHost, 64, 2, "host");
  ASSERT_TRUE(gpu && host);
  const CopyOp op[] = {{0, 0}};
  auto d1 = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, op);
  auto d2 = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, op);
  auto u1 = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, std::span<const CopyOp>());
  ASSERT_TRUE(d1.ok() && d2.ok() && u1.ok());
  EXPECT_EQ(d1->seq, 1u);
  EXPECT_EQ(d2->seq, 2u);
  EXPECT_EQ(u1->seq, 1u);
  EXPECT_EQ(u1->stream, CopyDirection::kHostToGpu);
  EXPECT_TRUE(backend_->Wait(*d2, kWait).ok());
  EXPECT_TRUE(backend_->Wait(*u1, kWait).ok());
}

TEST_F(HostBackendTest, CompletionNotifierRunsOnTheCopyThreadForEachBatch) {
  auto gpu = MakePool(Tier::kGpu, 64, 4, "gpu");
  auto host = MakePool(Tier::kHost, 64, 4, "host");
  ASSERT_TRUE(gpu && host);
  std::atomic<int> calls{0};
  std::mutex mu;
  std::vector<std::thread::id> threads;
  backend_->SetCompletionNotifier([&] {
    calls.fetch_add(1);
    std::lock_guard lock(mu);
    threads.push_back(std::this_thread::get_id());
  });
  constexpr int kBatches = 12;
  Fence last_down, last_up;
  for (int i = 0; i < kBatches; ++i) {
    const CopyOp op[] = {{static_cast<uint32_t>(i % 4), static_cast<uint32_t>((i + 1) % 4)}};
    auto f = i % 3 == 0 ? backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, op)
                        : backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, op);
    ASSERT_TRUE(f.ok());
    (i % 3 == 0 ? last_up : last_down) = *f;
  }
  ASSERT_TRUE(backend_->Wait(last_down, kWait).ok());
  ASSERT_TRUE(backend_->Wait(last_up, kWait).ok());
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (calls.load() < kBatches && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(calls.load(), kBatches);
  backend_->SetCompletionNotifier(nullptr);  // Not while holding `mu`: the notifier takes it.
  std::lock_guard lock(mu);
  for (const auto& id : threads) EXPECT_NE(id, std::this_thread::get_id());
}

TEST_F(HostBackendTest, PromotionsOvertakeQueuedDemotions) {
  // A long demotion D0 keeps the copy thread busy while demotion D1 and then promotion
  // P1 are queued behind it. When D0 finishes, P1 must run before D1. The setup holds
  // only if D0 is still running once both are queued; that is checked (and the test
  // retried with a longer D0) rather than assumed.
  uint64_t promotions = 0;  // Promotion fences are numbered 1, 2, ... on their own stream.
  for (uint32_t mib = 32; mib <= 256; mib *= 2) {
    const uint32_t slots = mib;  // 1 MiB slots.
    auto gpu = MakePool(Tier::kGpu, 1 << 20, slots, "gpu" + std::to_string(mib));
    auto host = MakePool(Tier::kHost, 1 << 20, slots, "host" + std::to_string(mib));
    ASSERT_TRUE(gpu && host);
    struct Seen {
      bool p1_done;
      bool d1_done;
    };
    std::mutex mu;
    std::vector<Seen> seen;
    Fence d1{}, p1{};
    std::atomic<bool> armed{false};
    backend_->SetCompletionNotifier([&] {
      if (!armed.load()) return;
      std::lock_guard lock(mu);
      seen.push_back(Seen{backend_->IsComplete(p1), backend_->IsComplete(d1)});
    });
    std::vector<CopyOp> big;
    for (uint32_t i = 0; i < slots; ++i) big.push_back(CopyOp{i, i});
    const CopyOp one[] = {{0, 0}};
    // Fences are set before `armed`; the notifier only reads them once armed.
    auto d0 = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, big);
    ASSERT_TRUE(d0.ok());
    const uint64_t next_down = d0->seq + 1;
    d1 = Fence{next_down, CopyDirection::kGpuToHost};
    p1 = Fence{++promotions, CopyDirection::kHostToGpu};
    armed = true;
    auto d1r = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, one);
    auto p1r = backend_->SubmitCopies(CopyDirection::kHostToGpu, *host, *gpu, one);
    ASSERT_TRUE(d1r.ok() && p1r.ok());
    ASSERT_EQ(d1r->seq, d1.seq);
    ASSERT_EQ(p1r->seq, p1.seq);
    const bool setup_held = !backend_->IsComplete(*d0);
    ASSERT_TRUE(backend_->Wait(*d1r, kWait).ok());
    ASSERT_TRUE(backend_->Wait(*p1r, kWait).ok());
    // Let the last notifier call finish before the locals it uses go.
    backend_->SetCompletionNotifier(nullptr);
    if (!setup_held) continue;
    std::lock_guard lock(mu);
    bool p1_first = false, d1_first = false;
    for (const Seen& s : seen) {
      if (s.p1_done && !s.d1_done) p1_first = true;
      if (s.d1_done && !s.p1_done) d1_first = true;
    }
    EXPECT_TRUE(p1_first) << "the promotion should have completed while the demotion still waited";
    EXPECT_FALSE(d1_first) << "a queued demotion ran before a queued promotion";
    return;
  }
  GTEST_SKIP() << "the copy thread finished the long demotion before the others were queued";
}

TEST_F(HostBackendTest, DestructionDrainsQueuedCopies) {
  auto gpu = MakePool(Tier::kGpu, 4096, 64, "gpu");
  auto host = MakePool(Tier::kHost, 4096, 64, "host");
  ASSERT_TRUE(gpu && host);
  std::mt19937 rng(5);
  FillRandom(*gpu, rng);
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < 64; ++i) ops.push_back(CopyOp{i, 63 - i});
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, ops).ok());
  backend_.reset();
  for (uint32_t i = 0; i < 64; ++i) {
    ASSERT_EQ(std::memcmp(host->slot_data(63 - i), gpu->slot_data(i), 4096), 0) << i;
  }
}

// Nothing named is created, so two backends never collide and nothing left in
// /dev/shm (a crashed run's, or a squatter's) stands in the way.
TEST(HostBackendCreateTest, NamesInDevShmDoNotStandInTheWay) {
  const std::string prefix = testing::UniqueShmPrefix("host-backend-create");
  {
    auto squat = ShmSegment::Create("/" + prefix + ".fences", 64);
    ASSERT_TRUE(squat.ok());
    HostBackendOptions o;
    o.name_prefix = prefix;
    auto first = CreateHostBackend(o);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    auto second = CreateHostBackend(o);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_NE((*first)->FenceSegmentFd(), (*second)->FenceSegmentFd());
  }
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + prefix + ".fences"));
}

// Pages of the pool's mapping in memory (mincore).
size_t ResidentPages(const Pool& p) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = p.slot_bytes() * p.slots();
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (::mincore(p.base(), bytes, vec.data()) != 0) return 0;
  return static_cast<size_t>(std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return (c & 1) != 0; }));
}

// populate: a pool is usable as soon as it is made, and faulted in on a thread
// meanwhile; what is written into its slots while that thread runs (the copy
// thread's demotions, the clients' writes) is kept, and the pool ends whole.
TEST_F(HostBackendTest, APoolFaultedInInTheBackgroundKeepsWhatIsWrittenMeanwhile) {
  constexpr size_t kSlot = size_t{1} << 20;
  constexpr uint32_t kSlots = 256;  // 256 MiB: faulting it in takes a while.
  auto gpu = MakePool(Tier::kGpu, kSlot, kSlots, "gpu");
  auto host = MakePool(Tier::kHost, kSlot, kSlots, "host");
  ASSERT_TRUE(gpu && host);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = kSlot * kSlots / page;
  // Writes from the back, where the populating thread comes last; and copies
  // through the copy thread into the host pool, while it is still being faulted in.
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < 32; ++i) {
    const uint32_t slot = kSlots - 1 - i * 7;
    std::memset(gpu->slot_data(slot), static_cast<int>(i + 1), kSlot);
    ops.push_back(CopyOp{slot, slot});
  }
  auto fence = backend_->SubmitCopies(CopyDirection::kGpuToHost, *gpu, *host, ops);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  ASSERT_TRUE(backend_->Wait(*fence, kWait).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((ResidentPages(*gpu) < pages || ResidentPages(*host) < pages) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(ResidentPages(*gpu), pages) << "the GPU pool was not faulted in whole";
  EXPECT_EQ(ResidentPages(*host), pages) << "the host pool was not faulted in whole";
  for (uint32_t i = 0; i < 32; ++i) {
    const uint32_t slot = kSlots - 1 - i * 7;
    for (const Pool* p : {gpu.get(), host.get()}) {
      const std::byte* b = p->slot_data(slot);
      EXPECT_TRUE(std::all_of(b, b + kSlot, [&](std::byte x) { return x == static_cast<std::byte>(i + 1); }))
          << "slot " << slot << " lost what was written while the pool was faulted in";
    }
  }
  // Untouched slots read zero.
  const std::byte* z = host->slot_data(0);
  EXPECT_TRUE(std::all_of(z, z + kSlot, [](std::byte x) { return x == std::byte{0}; }));
}

// A pool dropped while its pages are still being faulted in waits for that
// thread before it unmaps them (ASan and TSan builds would see it otherwise).
TEST_F(HostBackendTest, APoolDroppedWhileFaultingInStopsItsThreadFirst) {
  for (int i = 0; i < 4; ++i) {
    auto pool = MakePool(Tier::kHost, size_t{1} << 20, 256, "host" + std::to_string(i));
    ASSERT_NE(pool, nullptr);
  }
}

// No GPU work on the host backend: no fence events to export, and a request's
// GPU event is refused rather than silently ignored.
TEST_F(HostBackendTest, HasNoGpuFencesAndRefusesClientEvents) {
  EXPECT_TRUE(backend_->PromotionFenceEvents().empty());
  wire::IpcEventHandle event{};
  event[0] = 1;
  const Status st = backend_->WatchClientEvent(/*client=*/1, event).status();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("backend host"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace kvtier::tiering
