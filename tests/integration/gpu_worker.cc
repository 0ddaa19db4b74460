// kvtier-gpu-test-worker: a model-worker stand-in for the gpu-labelled
// integration test. It reaches the GPU only through the CUDA driver (as
// libkvtier does), on a stream of its own, and prints one JSON line.
//
//   kvtier-gpu-test-worker SOCKET write SESSION SEED BLOCKS [gate|stuck]
//   kvtier-gpu-test-worker SOCKET read  SESSION SEED BLOCKS
//   kvtier-gpu-test-worker SOCKET hold  SESSION SEED BLOCKS   (then sleeps until killed)
//
// Block i of SEED holds tokens SEED*100000 + [i*bt, (i+1)*bt) and the payload
// FillPayload(key) (payload.h), so every process can check every byte.
// `write ... gate`: the writer's stream first waits on a flag in host memory,
// then copies the blocks in, records the writer event and commits. While the
// flag is down kvtierd must hold the blocks back (it polls the writer event):
// an Acquire matches none and a Demote moves none. After the flag is raised
// the session demotes, and the blocks promoted back hold the written bytes.
// `write ... stuck`: the same, but the flag is never raised: it prints its
// line after the commit and sleeps until the test kills it (kvtierd must drop
// the blocks it never finished writing). `read` releases its lease with
// ReleaseAfter(stream).
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cuda_driver.h"
#include "kvtier/client.h"
#include "payload.h"

using namespace kvtier;
using namespace std::chrono_literals;
using client_internal::CudaDriver;
using testing::FillPayload;
using testing::PayloadIntact;
using client_internal::CUdeviceptr;
using client_internal::CUresult;
using client_internal::CUstream;

namespace {

[[noreturn]] void Die(const std::string& why) {
  std::printf("{\"ok\":false,\"error\":\"%s\"}\n", why.c_str());
  std::fflush(stdout);
  std::exit(1);
}

void Check(const Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + st.ToString());
}

// Entry points only this tool needs, from the same driver library.
struct Extra {
  CUresult (*mem_host_alloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*host_device_pointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*wait_value32)(CUstream, CUdeviceptr, uint32_t, unsigned) = nullptr;
  CUresult (*htod_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*dtoh_async)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
};

Extra LoadExtra(const CudaDriver& d) {
  void* dl = ::dlopen(d.library().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) Die("dlopen " + d.library());
  Extra e;
  e.mem_host_alloc = reinterpret_cast<decltype(e.mem_host_alloc)>(::dlsym(dl, "cuMemHostAlloc"));
  e.host_device_pointer = reinterpret_cast<decltype(e.host_device_pointer)>(::dlsym(dl, "cuMemHostGetDevicePointer_v2"));
  e.wait_value32 = reinterpret_cast<decltype(e.wait_value32)>(::dlsym(dl, "cuStreamWaitValue32_v2"));
  e.htod_async = reinterpret_cast<decltype(e.htod_async)>(::dlsym(dl, "cuMemcpyHtoDAsync_v2"));
  e.dtoh_async = reinterpret_cast<decltype(e.dtoh_async)>(::dlsym(dl, "cuMemcpyDtoHAsync_v2"));
  if (!e.mem_host_alloc || !e.host_device_pointer || !e.wait_value32 || !e.htod_async || !e.dtoh_async) {
    Die("driver lacks cuMemHostAlloc/cuStreamWaitValue32_v2/async copies");
  }
  return e;
}

CUdeviceptr Dev(std::byte* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

std::vector<Tier> TiersOf(Client& c, const std::vector<TokenId>& tokens, size_t n) {
  std::vector<Tier> tiers(n, Tier::kGpu);
  const size_t found = c.Probe(tokens, tiers);
  tiers.resize(found);
  return tiers;
}

bool AllIn(const std::vector<Tier>& tiers, size_t n, Tier t) {
  if (tiers.size() != n) return false;
  for (Tier x : tiers) {
    if (x != t) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s SOCKET write|read|hold SESSION SEED BLOCKS [gate|stuck]\n", argv[0]);
    return 2;
  }
  const std::string socket = argv[1], mode = argv[2], session = argv[3];
  const uint64_t seed = std::stoull(argv[4]);
  const size_t n = std::stoul(argv[5]);
  const bool stuck = argc > 6 && std::string(argv[6]) == "stuck";
  const bool gate = stuck || (argc > 6 && std::string(argv[6]) == "gate");

  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "gpu-test-worker";
  auto client = Client::Connect(o);
  if (!client.ok()) Die("connect: " + client.status().ToString());
  Client& c = **client;
  if (c.backend() != "cuda") Die("kvtierd runs the " + c.backend() + " backend");
  auto driver = CudaDriver::Default();
  if (!driver.ok()) Die(driver.status().ToString());
  const CudaDriver& d = **driver;
  const Extra x = LoadExtra(d);

  // libkvtier retained the primary context at attach; work in it here too.
  client_internal::CUdevice dev = 0;
  client_internal::CUcontext ctx = nullptr;
  Check(d.Check(d.cuDeviceGet(&dev, 0), "cuDeviceGet"), "device");
  Check(d.Check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"), "context");
  client_internal::ScopedContext scope(d, ctx);
  CUstream stream = nullptr;
  Check(d.Check(d.cuStreamCreate(&stream, client_internal::kCuStreamNonBlocking), "cuStreamCreate"), "stream");

  const uint32_t bt = c.block_tokens();
  std::vector<TokenId> tokens(n * bt);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(seed * 100000 + i);
  const std::vector<BlockKey> keys = c.Keys(tokens);
  const size_t slot_bytes = c.profile().BlockBytes();

  // Pinned host staging: async copies stay async, the gate flag is device-visible.
  void* staging = nullptr;
  Check(d.Check(x.mem_host_alloc(&staging, n * slot_bytes + 64, 0x02 /*DEVICEMAP*/), "cuMemHostAlloc"), "staging");
  auto* host = static_cast<std::byte*>(staging);
  volatile uint32_t* flag = reinterpret_cast<volatile uint32_t*>(host + n * slot_bytes);
  *flag = 0;

  const auto read_back = [&](Lease& lease) {
    // The promotion fence, waited for on this stream; then copies on the same stream.
    Check(lease.WaitOnStream(stream, 10s), "WaitOnStream");
    for (size_t i = 0; i < lease.size(); ++i) {
      Check(d.Check(x.dtoh_async(host + i * slot_bytes, Dev(lease.block(i).data), slot_bytes, stream), "DtoH"), "read");
    }
    Check(d.Check(d.cuStreamSynchronize(stream), "cuStreamSynchronize"), "sync");
    size_t intact = 0;
    for (size_t i = 0; i < lease.size(); ++i) intact += PayloadIntact(keys[i], host + i * slot_bytes, slot_bytes);
    Check(lease.ReleaseAfter(stream), "ReleaseAfter");
    return intact;
  };

  if (mode == "write") {
    auto w = c.Allocate(static_cast<uint32_t>(n));
    if (!w.ok()) Die("allocate: " + w.status().ToString());
    CUdeviceptr flag_dev = 0;
    if (gate) {
      Check(d.Check(x.host_device_pointer(&flag_dev, const_cast<uint32_t*>(flag), 0), "cuMemHostGetDevicePointer"),
            "flag");
      Check(d.Check(x.wait_value32(stream, flag_dev, 1, 0 /*GEQ*/), "cuStreamWaitValue32"), "gate");
    }
    for (size_t i = 0; i < n; ++i) {
      FillPayload(keys[i], host + i * slot_bytes, slot_bytes);
      Check(d.Check(x.htod_async(Dev(w->data(i)), host + i * slot_bytes, slot_bytes, stream), "HtoD"), "write");
    }
    Check(w->RecordWritten(stream), "RecordWritten");
    auto r = c.Commit(*w, session, BlockKey{}, 0, tokens);
    if (!r.ok()) Die("commit: " + r.status().ToString());
    bool held_back = true;
    if (gate) {
      // The writer has not run yet: neither served nor demoted.
      std::this_thread::sleep_for(100ms);
      auto early = c.Acquire("", tokens, kvtier::Promote::kNo);
      if (!early.ok()) Die("acquire while writing: " + early.status().ToString());
      auto demoted = c.Demote(session);
      if (!demoted.ok()) Die("demote: " + demoted.status().ToString());
      held_back = early->matched() == 0 && *demoted == 0 && AllIn(TiersOf(c, tokens, n), n, Tier::kGpu);
    }
    if (stuck) {
      std::printf("{\"ok\":true,\"stored\":%u,\"held_back\":%s}\n", r->stored, held_back ? "true" : "false");
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(1s);  // Killed by the test with its writes unfinished.
    }
    *flag = 1;
    Check(d.Check(d.cuStreamSynchronize(stream), "cuStreamSynchronize"), "sync");
    size_t intact = n;
    if (gate) {
      // Written now; kvtierd sees the event complete at its next poll.
      const auto settled_by = std::chrono::steady_clock::now() + 20s;
      uint32_t scheduled = 0;
      while (scheduled == 0 && std::chrono::steady_clock::now() < settled_by) {
        auto demoted = c.Demote(session);
        if (!demoted.ok()) Die("demote: " + demoted.status().ToString());
        scheduled = *demoted;
        if (scheduled == 0) std::this_thread::sleep_for(1ms);
      }
      if (scheduled != n) Die("the session did not demote whole once written: " + std::to_string(scheduled));
      const auto deadline = std::chrono::steady_clock::now() + 20s;
      while (!AllIn(TiersOf(c, tokens, n), n, Tier::kHost) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
      }
      if (!AllIn(TiersOf(c, tokens, n), n, Tier::kHost)) Die("the demotion never finished after the gate opened");
      auto lease = c.Acquire(session, tokens, kvtier::Promote::kNow);
      if (!lease.ok()) Die("acquire: " + lease.status().ToString());
      intact = read_back(*lease);
    }
    std::printf("{\"ok\":true,\"stored\":%u,\"held_back\":%s,\"intact\":%zu}\n", r->stored,
                held_back ? "true" : "false", intact);
  } else if (mode == "read" || mode == "hold") {
    auto lease = c.Acquire(session, tokens, kvtier::Promote::kNow);
    if (!lease.ok()) Die("acquire: " + lease.status().ToString());
    const size_t intact = read_back(*lease);
    std::printf("{\"ok\":true,\"matched\":%u,\"promoted\":%u,\"intact\":%zu}\n", lease->matched(), lease->promoted(),
                intact);
    std::fflush(stdout);
    if (mode == "hold") {
      for (;;) std::this_thread::sleep_for(1s);  // Killed by the test while holding the lease.
    }
  } else {
    Die("unknown mode " + mode);
  }
  std::fflush(stdout);
  return 0;
}
