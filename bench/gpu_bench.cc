// kvtier-bench gpu: the CUDA backend's copy speed on this machine's GPU.
//
//  batches  SubmitCopies of 64 and 512 scattered blocks per batch, 2 MiB blocks
//           (copy engines) and 32 KiB blocks (gather kernel), host->gpu and
//           gpu->host, batches back to back, GB/s over the whole run.
//  peak     one 1 GiB cudaMemcpyAsync between one cudaMallocHost buffer and the
//           GPU, each direction: what PCIe gives one large copy (the baseline).
// The JSON's summary keys h2d_gbps / d2h_gbps are the 2 MiB, 64-block batches.
//  promote  one 2,048-token session of a Llama-3-8B-like profile (32 layers, 8 KV
//           heads, head dim 128, bf16, 16 tokens/block: 128 blocks of 2 MiB) from
//           the host tier to the GPU, submit to fence, median of several.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "bench_util.h"
#include "kvtier/tiering/backend_select.h"
#include "kvtier/tiering/cuda_backend.h"

namespace kvtier::bench {
namespace {

using tiering::CopyOp;
using tiering::Pool;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
constexpr uint32_t kSlots = 512;         // Per pool: the largest batch, scattered over all of it.
constexpr uint32_t kPromptBlocks = 128;  // 2,048 tokens / 16 per block.
constexpr size_t kLlama8bBlockBytes = 2 * 32 * 8 * 128 * 2 * 16;  // K and V x layers x heads x dim x bf16 x tokens.
static_assert(kLlama8bBlockBytes == 2 * kMiB);
constexpr auto kWait = std::chrono::seconds(60);

struct Pools {
  std::unique_ptr<Pool> host;
  std::unique_ptr<Pool> gpu;
};

Result<Pools> MakePools(tiering::Backend& backend, size_t slot_bytes) {
  const std::string tag = std::to_string(slot_bytes >> 10) + "k";
  auto host = backend.CreatePool({Tier::kHost, slot_bytes, kSlots, "host-" + tag});
  if (!host.ok()) return host.status();
  auto gpu = backend.CreatePool({Tier::kGpu, slot_bytes, kSlots, "gpu-" + tag});
  if (!gpu.ok()) return gpu.status();
  return Pools{std::move(host).value(), std::move(gpu).value()};
}

// `batch` ops pairing random distinct slots on both sides, so few runs coalesce.
std::vector<CopyOp> Scattered(uint32_t batch, std::mt19937& rng) {
  std::vector<uint32_t> a(kSlots);
  std::vector<uint32_t> b(kSlots);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < batch; ++i) ops.push_back({a[i], b[i]});
  return ops;
}

// GB/s of `batches` back-to-back batches of `ops`, after one warm-up batch.
Result<double> BatchGbps(tiering::Backend& backend, CopyDirection dir, const Pools& p, const std::vector<CopyOp>& ops,
                         int batches) {
  const Pool& src = dir == CopyDirection::kHostToGpu ? *p.host : *p.gpu;
  const Pool& dst = dir == CopyDirection::kHostToGpu ? *p.gpu : *p.host;
  auto warm = backend.SubmitCopies(dir, src, dst, ops);
  if (!warm.ok()) return warm.status();
  KVTIER_RETURN_IF_ERROR(backend.Wait(*warm, kWait));
  const auto start = Clock::now();
  Fence last;
  for (int i = 0; i < batches; ++i) {
    auto f = backend.SubmitCopies(dir, src, dst, ops);
    if (!f.ok()) return f.status();
    last = *f;
  }
  KVTIER_RETURN_IF_ERROR(backend.Wait(last, kWait));
  const double seconds = NanosBetween(start, Clock::now()) * 1e-9;
  return double(batches) * ops.size() * src.slot_bytes() / seconds * 1e-9;
}

// One cudaMemcpyAsync of 1 GiB each way, between one cudaMallocHost buffer (a
// single pinned allocation: the pools are registered in 256 MiB chunks, which
// one copy must not span) and one device buffer; the best of `reps` runs per
// direction. Every CUDA call is checked.
struct Peak {
  double h2d = 0;
  double d2h = 0;
};
Result<Peak> PeakGbps(int reps) {
  constexpr size_t kBytes = 1024 * kMiB;
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  const auto check = [](cudaError_t err, const char* what) {
    return err == cudaSuccess ? Status::Ok()
                              : Internal(std::string("peak memcpy: ") + what + ": " + cudaGetErrorName(err) + ": " +
                                         cudaGetErrorString(err));
  };
  struct Cleanup {
    void*& host;
    void*& dev;
    cudaStream_t& stream;
    ~Cleanup() {
      if (stream != nullptr) cudaStreamDestroy(stream);
      if (dev != nullptr) cudaFree(dev);
      if (host != nullptr) cudaFreeHost(host);
    }
  } cleanup{host, dev, stream};
  KVTIER_RETURN_IF_ERROR(check(cudaMallocHost(&host, kBytes), "cudaMallocHost of 1 GiB"));
  KVTIER_RETURN_IF_ERROR(check(cudaMalloc(&dev, kBytes), "cudaMalloc of 1 GiB"));
  KVTIER_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  Peak peak;
  for (CopyDirection dir : {CopyDirection::kHostToGpu, CopyDirection::kGpuToHost}) {
    void* dst = dir == CopyDirection::kHostToGpu ? dev : host;
    const void* src = dir == CopyDirection::kHostToGpu ? host : dev;
    double best = 0;
    for (int i = 0; i <= reps; ++i) {  // The first is a warm-up.
      const auto start = Clock::now();
      KVTIER_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync"));
      KVTIER_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
      if (i > 0) best = std::max(best, double(kBytes) / (NanosBetween(start, Clock::now()) * 1e-9) * 1e-9);
    }
    (dir == CopyDirection::kHostToGpu ? peak.h2d : peak.d2h) = best;
  }
  return peak;
}

void PrintHelp() {
  std::printf(
      "usage: kvtier-bench gpu [--quick]\n\n"
      "Measures the CUDA backend on this machine's GPU (device 0):\n"
      "  batches  64 and 512 scattered blocks per SubmitCopies, 2 MiB (copy engines) and\n"
      "           32 KiB (gather kernel) blocks, host->gpu and gpu->host\n"
      "  peak     one 1 GiB cudaMemcpyAsync each way from one pinned buffer (the baseline)\n"
      "  promote  a 2,048-token Llama-3-8B-like session (128 x 2 MiB blocks) to the GPU\n"
      "Needs a CUDA device; exits 1 without one. The last line is one JSON object.\n\n"
      "  --quick  a few batches each: a smoke test, not a measurement\n");
}

}  // namespace

int RunGpuBench(int argc, char** argv) {
  bool quick = false;
  if (const int rc = ParseQuickFlags(argc, argv, "gpu", PrintHelp, &quick); rc >= 0) return rc;
  const tiering::GpuInfo gpu = tiering::DetectGpu();
  if (gpu.devices == 0) {
    std::fprintf(stderr, "kvtier-bench gpu: no CUDA device (%s)\n", gpu.error.c_str());
    return 1;
  }
  const MachineInfo machine = ReadMachineInfo();
  Progress("kvtier-bench gpu%s on %s (%u cores), %s\n", quick ? " --quick" : "", machine.cpu_model.c_str(),
           machine.cores, gpu.device_name.c_str());

  tiering::CudaBackendOptions o;
  o.name_prefix = "kvtier-bench-gpu." + std::to_string(getpid());
  o.pin_progress = [](const std::string& pool, size_t pinned, size_t total) {
    if (pinned == total) Progress("pinned %s: %zu MiB\n", pool.c_str(), total / kMiB);
  };
  auto backend = tiering::CreateCudaBackend(o);
  if (!backend.ok()) {
    std::fprintf(stderr, "kvtier-bench gpu: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  Progress("%s\n", (*backend)->Describe().c_str());

  const int batches = quick ? 3 : 20;
  std::mt19937 rng(42);
  JsonObject out;
  const auto fail = [](const Status& st) {
    std::fprintf(stderr, "kvtier-bench gpu: %s\n", st.ToString().c_str());
    return 1;
  };
  std::optional<Pools> big;  // The 2 MiB pools, kept for the promote run.
  double summary_h2d = 0, summary_d2h = 0;
  for (size_t slot : {2 * kMiB, 32 * kKiB}) {
    auto pools = MakePools(**backend, slot);
    if (!pools.ok()) return fail(pools.status());
    const std::string size = slot == 2 * kMiB ? "2mib" : "32kib";
    for (uint32_t batch : {64u, 512u}) {
      const std::vector<CopyOp> ops = Scattered(batch, rng);
      for (CopyDirection dir : {CopyDirection::kHostToGpu, CopyDirection::kGpuToHost}) {
        const char* name = dir == CopyDirection::kHostToGpu ? "h2d" : "d2h";
        auto gbps = BatchGbps(**backend, dir, *pools, ops, batches);
        if (!gbps.ok()) return fail(gbps.status());
        Progress("%s %s blocks x %u per batch, %d batches: %.2f GB/s\n", name, size.c_str(), batch, batches, *gbps);
        out.Add(std::string(name) + "_gbps_" + size + "_b" + std::to_string(batch), *gbps, 2);
        if (slot == 2 * kMiB && batch == 64) (dir == CopyDirection::kHostToGpu ? summary_h2d : summary_d2h) = *gbps;
      }
    }
    if (slot == 2 * kMiB) big = std::move(pools).value();
  }

  auto peak = PeakGbps(quick ? 1 : 5);
  if (!peak.ok()) return fail(peak.status());
  Progress("peak: one 1 GiB cudaMemcpyAsync from one pinned buffer: h2d %.2f GB/s, d2h %.2f GB/s\n", peak->h2d,
           peak->d2h);

  std::vector<CopyOp> session;
  for (uint32_t i = 0; i < kPromptBlocks; ++i) session.push_back({i * 2, kSlots - 1 - i * 3});
  std::vector<double> ms;
  for (int i = 0; i < (quick ? 3 : 21); ++i) {
    const auto start = Clock::now();
    auto f = (*backend)->SubmitCopies(CopyDirection::kHostToGpu, *big->host, *big->gpu, session);
    if (!f.ok()) return fail(f.status());
    const Status st = (*backend)->Wait(*f, kWait);
    if (!st.ok()) return fail(st);
    ms.push_back(NanosBetween(start, Clock::now()) * 1e-6);
  }
  const double promote_ms = Median(ms);
  Progress("promote: 2,048-token session, %u x %zu MiB blocks: %.3f ms median (%.2f GB/s)\n", kPromptBlocks,
           kLlama8bBlockBytes / kMiB, promote_ms, kPromptBlocks * kLlama8bBlockBytes / (promote_ms * 1e-3) * 1e-9);

  JsonObject machine_json;
  machine_json.Add("cpu_model", machine.cpu_model).Add("cores", uint64_t{machine.cores});
  // The summary: the backend's speed at the daemon's batch size (64) with 2 MiB blocks.
  out.Add("h2d_gbps", summary_h2d, 2)
      .Add("d2h_gbps", summary_d2h, 2)
      .Add("memcpy_peak_h2d_gbps", peak->h2d, 2)
      .Add("memcpy_peak_d2h_gbps", peak->d2h, 2)
      .Add("promote_2k_ms", promote_ms, 3)
      .Add("batched_memcpy",
           std::string_view((*backend)->batched_memcpy() ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync"))
      .Add("gpu", gpu.device_name)
      .Add("machine", machine_json);
  std::printf("%s\n", out.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
