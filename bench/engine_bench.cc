// kvtier-bench engine: the engine's hot paths, each beside the baseline it must beat.
//
//  hash    ComputeKeys over a long token array (chained 16-token blocks).
//  lookup  random lookups of present keys in the block index (1k and 1M entries),
//          batched (FindBatch, the engine's lookup path) and one at a time, against
//          std::unordered_map holding the same keys, probed in the same order.
//  prompt  ComputeKeys + Engine::Match of a cached 2,048-token prompt in an engine
//          whose index holds 1M blocks committed over many multi-turn sessions.
//  mover   the host backend's SubmitCopies + Wait of 64 x 256 KiB blocks per batch
//          against std::memcpy of the same slot pairs, runs alternating, both on one CPU.
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_commands.h"
#include "bench_util.h"
#include "block_index.h"
#include "kvtier/block_key.h"
#include "kvtier/model_profile.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/tiering/host_backend.h"

namespace kvtier::bench {
namespace {

using tiering::BlockIndex;

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kPromptBlocks = 128;  // A 2,048-token prompt.
constexpr uint32_t kVocab = 128256;

// Targets the figures are held to (printed, not enforced).
constexpr double kLookupRatioTarget = 0.6;  // index <= 0.6 x unordered_map
constexpr double kPromptTargetUs = 5.0;
constexpr double kMoverRatioTarget = 0.8;  // mover >= 0.8 x memcpy

struct Sizes {
  size_t hash_tokens;
  int hash_reps;
  uint32_t index_small;
  uint32_t index_big;
  size_t lookups;
  int lookup_reps;
  uint32_t engine_blocks;
  int prompt_samples;
  uint32_t mover_slots;
  int mover_passes;
  int mover_runs;
};

constexpr Sizes kFull{
    .hash_tokens = size_t{1} << 20,
    .hash_reps = 15,
    .index_small = 1000,
    .index_big = 1000000,
    .lookups = size_t{1} << 22,
    .lookup_reps = 5,
    .engine_blocks = 1000000,
    .prompt_samples = 2000,
    .mover_slots = 512,
    .mover_passes = 2,
    .mover_runs = 11,
};

// Smoke-test sizes: every path runs, the figures are not comparable to a full run.
constexpr Sizes kQuick{
    .hash_tokens = size_t{1} << 16,
    .hash_reps = 5,
    .index_small = 1000,
    .index_big = 65536,
    .lookups = size_t{1} << 18,
    .lookup_reps = 3,
    .engine_blocks = 16384,
    .prompt_samples = 200,
    .mover_slots = 64,
    .mover_passes = 1,
    .mover_runs = 3,
};

// Every shared-memory segment of this process is named "/kvtier-bench.<pid>.*".
std::string SegmentPrefix() { return "kvtier-bench." + std::to_string(getpid()); }
std::string SegmentName(const std::string& what) { return "/" + SegmentPrefix() + "." + what; }

// Exiting skips the destructors that would unlink this process's segments: unlink them here.
void UnlinkOwnSegments() {
  const std::string prefix = SegmentPrefix() + ".";
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.emplace_back(e->d_name);
  }
  closedir(dir);
  for (const std::string& name : names) shm_unlink(("/" + name).c_str());
}

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "kvtier-bench engine: %s: %s\n", what.c_str(), st.ToString().c_str());
  UnlinkOwnSegments();
  std::exit(1);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier-bench engine: %s\n", what.c_str());
  UnlinkOwnSegments();
  std::exit(1);
}

void FillTokens(Rng& rng, std::span<TokenId> out) {
  for (TokenId& t : out) t = static_cast<TokenId>(rng.Below(kVocab));
}

// --- hash ---------------------------------------------------------------------------

double BenchHash(const Sizes& z, const Namespace& ns) {
  Rng rng(11);
  std::vector<TokenId> tokens(z.hash_tokens);
  FillTokens(rng, tokens);
  std::vector<BlockKey> keys(tokens.size() / kBlockTokens);
  std::vector<double> per_block;
  for (int rep = 0; rep < z.hash_reps; ++rep) {
    const auto t0 = Clock::now();
    const size_t n = ComputeKeys(ns, BlockKey{}, tokens, kBlockTokens, keys);
    const auto t1 = Clock::now();
    KeepAlive(keys[n - 1].lo);
    per_block.push_back(NanosBetween(t0, t1) / static_cast<double>(n));
  }
  const double ns_per_block = Median(per_block);
  Progress("hash:   %zu blocks x %d runs, %.1f ns/block (median; %.2f GB/s of tokens)\n", keys.size(), z.hash_reps,
           ns_per_block, kBlockTokens * sizeof(TokenId) / ns_per_block);
  return ns_per_block;
}

// --- lookup -------------------------------------------------------------------------

using KeyMap = std::unordered_map<BlockKey, uint32_t, BlockKeyHash>;

struct LookupFigures {
  double batched_1k = 0;
  double batched_1m = 0;
  double single_1m = 0;
  double map_1m = 0;
};

// `count` keys chained from the null key, as ComputeKeys would produce them for
// one long token stream.
std::vector<BlockKey> MakeKeys(Rng& rng, const Namespace& ns, uint32_t count) {
  std::vector<BlockKey> keys(count);
  TokenId block[kBlockTokens];
  BlockKey prev;
  for (uint32_t i = 0; i < count; ++i) {
    FillTokens(rng, block);
    prev = keys[i] = ChainKey(prev, ns, block);
  }
  return keys;
}

std::vector<BlockKey> MakeQueries(Rng& rng, const std::vector<BlockKey>& keys, size_t count) {
  std::vector<BlockKey> q(count);
  for (BlockKey& k : q) k = keys[rng.Below(keys.size())];
  return q;
}

BlockIndex MakeIndex(const std::string& name, const std::vector<BlockKey>& keys, uint32_t ns_tag) {
  auto index =
      BlockIndex::Create(SegmentName(name), kBlockTokens, static_cast<uint32_t>(keys.size()), 0x6b76746965726265ULL);
  if (!index.ok()) Die("create index " + name, index.status());
  for (uint32_t i = 0; i < keys.size(); ++i) index->Insert(keys[i], i, ns_tag, Tier::kGpu);
  return std::move(index).value();
}

// Each lookup loop sums what it found (so nothing is optimized away) and fails
// loudly on a miss: every query is of a present key.
double TimeBatched(const BlockIndex& index, std::span<const BlockKey> q) {
  constexpr size_t kBatch = kPromptBlocks;  // The engine looks a prompt's keys up at once.
  uint32_t out[kBatch];
  uint64_t sum = 0, missing = 0;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < q.size(); i += kBatch) {
    const size_t n = std::min(kBatch, q.size() - i);
    index.FindBatch(q.subspan(i, n), std::span<uint32_t>(out, n));
    for (size_t j = 0; j < n; ++j) {
      missing += out[j] == kNoRecord;
      sum += out[j];
    }
  }
  const auto t1 = Clock::now();
  if (missing != 0) Die("FindBatch missed " + std::to_string(missing) + " present keys");
  KeepAlive(sum);
  return NanosBetween(t0, t1) / static_cast<double>(q.size());
}

double TimeSingle(const BlockIndex& index, std::span<const BlockKey> q) {
  uint64_t sum = 0, missing = 0;
  const auto t0 = Clock::now();
  for (const BlockKey& k : q) {
    const uint32_t r = index.Find(k);
    missing += r == kNoRecord;
    sum += r;
  }
  const auto t1 = Clock::now();
  if (missing != 0) Die("Find missed " + std::to_string(missing) + " present keys");
  KeepAlive(sum);
  return NanosBetween(t0, t1) / static_cast<double>(q.size());
}

double TimeMap(const KeyMap& map, std::span<const BlockKey> q) {
  uint64_t sum = 0, missing = 0;
  const auto t0 = Clock::now();
  for (const BlockKey& k : q) {
    const auto it = map.find(k);
    if (it == map.end()) {
      ++missing;
    } else {
      sum += it->second;
    }
  }
  const auto t1 = Clock::now();
  if (missing != 0) Die("unordered_map missed " + std::to_string(missing) + " present keys");
  KeepAlive(sum);
  return NanosBetween(t0, t1) / static_cast<double>(q.size());
}

LookupFigures BenchLookup(const Sizes& z, const Namespace& ns) {
  Rng rng(22);
  const uint32_t tag = NamespaceTag(ns);
  LookupFigures f;
  {
    const std::vector<BlockKey> keys = MakeKeys(rng, ns, z.index_small);
    const BlockIndex index = MakeIndex("index-small", keys, tag);
    const std::vector<BlockKey> q = MakeQueries(rng, keys, z.lookups);
    std::vector<double> runs;
    for (int rep = 0; rep < z.lookup_reps; ++rep) runs.push_back(TimeBatched(index, q));
    f.batched_1k = Median(runs);
    Progress("lookup: index of %u blocks, %zu random lookups x %d runs: batched %.2f ns/block\n", z.index_small,
             q.size(), z.lookup_reps, f.batched_1k);
  }
  const std::vector<BlockKey> keys = MakeKeys(rng, ns, z.index_big);
  const BlockIndex index = MakeIndex("index-big", keys, tag);
  KeyMap map;
  map.reserve(keys.size());
  for (uint32_t i = 0; i < keys.size(); ++i) map.emplace(keys[i], i);
  const std::vector<BlockKey> q = MakeQueries(rng, keys, z.lookups);
  std::vector<double> batched, single, baseline;
  for (int rep = 0; rep < z.lookup_reps; ++rep) {
    // Rotate the order so that no variant always runs right after the same other one.
    for (int k = 0; k < 3; ++k) {
      switch ((rep + k) % 3) {
        case 0:
          batched.push_back(TimeBatched(index, q));
          break;
        case 1:
          single.push_back(TimeSingle(index, q));
          break;
        default:
          baseline.push_back(TimeMap(map, q));
          break;
      }
    }
  }
  f.batched_1m = Median(batched);
  f.single_1m = Median(single);
  f.map_1m = Median(baseline);
  Progress(
      "lookup: index of %u blocks (%zu MiB table), %zu random lookups x %d runs:\n"
      "        batched %.2f ns/block, single Find %.2f ns/block, unordered_map %.2f ns/block\n",
      z.index_big, size_t{IndexGeometry::For(kBlockTokens, z.index_big).table_slots} * sizeof(IndexSlot) >> 20,
      q.size(), z.lookup_reps, f.batched_1m, f.single_1m, f.map_1m);
  return f;
}

// --- prompt -------------------------------------------------------------------------

struct PromptFigures {
  double total_us = 0;
  double hash_us = 0;
  double match_us = 0;
  double p90_us = 0;
};

PromptFigures BenchPrompt(const Sizes& z) {
  using namespace tiering;
  constexpr uint32_t kPromptTokens = kPromptBlocks * kBlockTokens;
  constexpr uint32_t kTurnBlocks = 32;      // Blocks committed per turn of a session.
  constexpr uint32_t kSessionsAtOnce = 64;  // Sessions whose turns interleave.
  const uint32_t sessions = (z.engine_blocks + kPromptBlocks - 1) / kPromptBlocks;
  const uint32_t blocks = sessions * kPromptBlocks;

  HostBackendOptions bo;
  bo.name_prefix = SegmentPrefix() + ".engine";
  auto backend = CreateHostBackend(bo);
  if (!backend.ok()) Die("create host backend", backend.status());
  EngineOptions o;
  o.profile = ModelProfile{"bench-tiny", 1, 1, 8, DType::kF16, kBlockTokens};
  o.gpu_slots = blocks + blocks / 32 + 1024;  // Room for all: nothing is dropped while filling.
  o.host_slots = 4096;
  o.name = "engine";
  o.index_segment = SegmentName("engine-index");
  auto engine_or = Engine::Create(o, **backend);
  if (!engine_or.ok()) Die("create engine", engine_or.status());
  Engine& engine = **engine_or;
  const Tenant tenant = Tenant::Make(o.profile.Fingerprint(), "bench-tenant");
  const Namespace& ns = tenant.ns;

  // Every session is a distinct 2k prompt, committed in 32-block turns that
  // interleave with other sessions' turns, so one prompt's records are spread out.
  Rng rng(33);
  std::vector<TokenId> prompts(size_t{sessions} * kPromptTokens);
  FillTokens(rng, prompts);
  const auto fill_start = Clock::now();
  std::vector<BlockKey> keys(size_t{kSessionsAtOnce} * kPromptBlocks);
  for (uint32_t first = 0; first < sessions; first += kSessionsAtOnce) {
    const uint32_t group = std::min(kSessionsAtOnce, sessions - first);
    for (uint32_t s = 0; s < group; ++s) {
      ComputeKeys(ns, BlockKey{}, std::span<const TokenId>(&prompts[size_t{first + s} * kPromptTokens], kPromptTokens),
                  kBlockTokens, std::span<BlockKey>(&keys[size_t{s} * kPromptBlocks], kPromptBlocks));
    }
    for (uint32_t start = 0; start < kPromptBlocks; start += kTurnBlocks) {
      for (uint32_t s = 0; s < group; ++s) {
        auto lease = engine.Allocate(tenant, kTurnBlocks);
        if (!lease.ok()) Die("allocate", lease.status());
        const BlockKey parent = start == 0 ? BlockKey{} : keys[size_t{s} * kPromptBlocks + start - 1];
        const TokenId* toks = &prompts[size_t{first + s} * kPromptTokens + size_t{start} * kBlockTokens];
        auto c = engine.Commit(lease->id, tenant, "session-" + std::to_string(first + s), parent, start,
                               std::span<const TokenId>(toks, size_t{kTurnBlocks} * kBlockTokens), lease->slots);
        if (!c.ok()) Die("commit", c.status());
        if (c->stored != kTurnBlocks) Die("commit stored " + std::to_string(c->stored) + " blocks, not 32");
        const Status st = engine.Release(lease->id);
        if (!st.ok()) Die("release", st);
      }
    }
  }
  const double fill_s = NanosBetween(fill_start, Clock::now()) / 1e9;
  const EngineStats stats = engine.stats();
  if (stats.blocks != blocks)
    Die("engine holds " + std::to_string(stats.blocks) + " blocks, not " + std::to_string(blocks));
  Progress("prompt: engine filled with %u blocks in %u sessions in %.2f s (%.0f ns/block committed)\n", stats.blocks,
           stats.sessions, fill_s, fill_s * 1e9 / blocks);

  // Each sample is another cached prompt. Its tokens are copied into the request
  // buffer first, untimed: a request's tokens have just arrived, the index has not.
  std::vector<TokenId> request(kPromptTokens);
  std::vector<BlockKey> request_keys(kPromptBlocks);
  std::vector<double> total, hash, match;
  for (int i = 0; i < z.prompt_samples; ++i) {
    const uint64_t s = rng.Below(sessions);
    std::memcpy(request.data(), &prompts[s * kPromptTokens], kPromptTokens * sizeof(TokenId));
    const auto t0 = Clock::now();
    const size_t n = ComputeKeys(ns, BlockKey{}, request, kBlockTokens, request_keys);
    const auto t1 = Clock::now();
    const uint32_t matched = engine.Match(ns, std::span<const BlockKey>(request_keys.data(), n), request);
    const auto t2 = Clock::now();
    if (matched != kPromptBlocks) Die("a cached prompt matched " + std::to_string(matched) + " of 128 blocks");
    total.push_back(NanosBetween(t0, t2) / 1e3);
    hash.push_back(NanosBetween(t0, t1) / 1e3);
    match.push_back(NanosBetween(t1, t2) / 1e3);
  }
  PromptFigures f;
  f.total_us = Median(total);
  f.hash_us = Median(hash);
  f.match_us = Median(match);
  f.p90_us = Percentile(total, 90);
  Progress("prompt: %d cached 2k-token prompts: %.2f us median (hash %.2f + match %.2f), p90 %.2f us\n",
           z.prompt_samples, f.total_us, f.hash_us, f.match_us, f.p90_us);
  return f;
}

// --- mover --------------------------------------------------------------------------

struct MoverFigures {
  double mover_gbps = 0;
  double memcpy_gbps = 0;
};

// Pins the calling thread to the CPU it runs on, for its lifetime; threads it
// starts meanwhile inherit the pin. Restores the previous CPU set when it ends.
class PinToCurrentCpu {
 public:
  PinToCurrentCpu() {
    cpu_ = sched_getcpu();
    if (cpu_ < 0 || sched_getaffinity(0, sizeof(saved_), &saved_) != 0) {
      cpu_ = -1;
      return;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu_, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) cpu_ = -1;
  }
  ~PinToCurrentCpu() {
    if (cpu_ >= 0) (void)sched_setaffinity(0, sizeof(saved_), &saved_);
  }
  PinToCurrentCpu(const PinToCurrentCpu&) = delete;
  PinToCurrentCpu& operator=(const PinToCurrentCpu&) = delete;
  int cpu() const { return cpu_; }

 private:
  int cpu_ = -1;
  cpu_set_t saved_;
};

MoverFigures BenchMover(const Sizes& z) {
  using namespace tiering;
  constexpr size_t kSlotBytes = size_t{256} << 10;
  constexpr uint32_t kBatch = 64;
  // The backend's copy thread (started below, so it inherits the pin) and the
  // memcpy baseline on this thread run on the same CPU: the figure then compares
  // the mover with memcpy, not two CPUs (virtual CPUs can differ by a third in
  // copy bandwidth). While this thread waits for a fence, the copy thread has the CPU.
  const PinToCurrentCpu pin;
  HostBackendOptions bo;
  bo.name_prefix = SegmentPrefix() + ".mover";
  auto backend_or = CreateHostBackend(bo);
  if (!backend_or.ok()) Die("create host backend", backend_or.status());
  Backend& backend = **backend_or;
  auto src_or = backend.CreatePool(PoolSpec{Tier::kGpu, kSlotBytes, z.mover_slots, "gpu"});
  if (!src_or.ok()) Die("create pool", src_or.status());
  auto dst_or = backend.CreatePool(PoolSpec{Tier::kHost, kSlotBytes, z.mover_slots, "host"});
  if (!dst_or.ok()) Die("create pool", dst_or.status());
  const Pool& src = **src_or;
  const Pool& dst = **dst_or;
  for (uint32_t i = 0; i < z.mover_slots; ++i) std::memset(src.slot_data(i), static_cast<int>(i * 7 + 1), kSlotBytes);

  // Each pass copies every source slot once, to a shuffled destination, in batches of 64.
  Rng rng(44);
  std::vector<uint32_t> from(z.mover_slots), to(z.mover_slots);
  std::iota(from.begin(), from.end(), 0u);
  std::iota(to.begin(), to.end(), 0u);
  for (uint32_t i = z.mover_slots - 1; i > 0; --i) {
    std::swap(from[i], from[rng.Below(i + 1)]);
    std::swap(to[i], to[rng.Below(i + 1)]);
  }
  std::vector<std::vector<CopyOp>> batches;
  for (uint32_t b = 0; b < z.mover_slots; b += kBatch) {
    std::vector<CopyOp> ops;
    for (uint32_t i = b; i < std::min(b + kBatch, z.mover_slots); ++i) ops.push_back(CopyOp{from[i], to[i]});
    batches.push_back(std::move(ops));
  }
  const double bytes = static_cast<double>(z.mover_passes) * z.mover_slots * kSlotBytes;

  auto run_mover = [&] {
    const auto t0 = Clock::now();
    for (int pass = 0; pass < z.mover_passes; ++pass) {
      for (const auto& ops : batches) {
        auto fence = backend.SubmitCopies(CopyDirection::kGpuToHost, src, dst, ops);
        if (!fence.ok()) Die("submit copies", fence.status());
        const Status st = backend.Wait(*fence, std::chrono::seconds(30));
        if (!st.ok()) Die("wait for copies", st);
      }
    }
    return bytes / NanosBetween(t0, Clock::now());  // bytes per ns == GB/s
  };
  auto run_memcpy = [&] {
    const auto t0 = Clock::now();
    for (int pass = 0; pass < z.mover_passes; ++pass) {
      for (const auto& ops : batches) {
        for (const CopyOp& op : ops) std::memcpy(dst.slot_data(op.dst_slot), src.slot_data(op.src_slot), kSlotBytes);
      }
    }
    const double gbps = bytes / NanosBetween(t0, Clock::now());
    KeepAlive(*dst.base());
    return gbps;
  };

  (void)run_mover();  // Warm both paths (thread wake-up, page tables).
  (void)run_memcpy();
  std::vector<double> mover, plain;
  for (int r = 0; r < z.mover_runs; ++r) {
    if (r % 2 == 0) {
      mover.push_back(run_mover());
      plain.push_back(run_memcpy());
    } else {
      plain.push_back(run_memcpy());
      mover.push_back(run_mover());
    }
  }
  // The copies must have landed where they were asked to.
  (void)run_mover();
  for (const auto& ops : batches) {
    for (const CopyOp& op : {ops.front(), ops.back()}) {
      if (std::memcmp(dst.slot_data(op.dst_slot), src.slot_data(op.src_slot), kSlotBytes) != 0) {
        Die("mover copied slot " + std::to_string(op.src_slot) + " wrongly");
      }
    }
  }
  MoverFigures f;
  f.mover_gbps = Median(mover);
  f.memcpy_gbps = Median(plain);
  Progress(
      "mover:  %u x 256 KiB slots, batches of %u, %d passes x %d runs, both on cpu %d: mover %.2f GB/s, "
      "memcpy %.2f GB/s\n",
      z.mover_slots, kBatch, z.mover_passes, z.mover_runs, pin.cpu(), f.mover_gbps, f.memcpy_gbps);
  return f;
}

const char* Verdict(bool met) { return met ? "met" : "NOT met"; }

void PrintHelp() {
  std::printf(
      "usage: kvtier-bench engine [--quick]\n\n"
      "Measures the engine's hot paths on this machine, each beside its baseline:\n"
      "  hash    key of one 16-token block, chaining included (ComputeKeys)\n"
      "  lookup  random lookups of present keys in the block index (1k and 1M blocks),\n"
      "          batched and single, vs std::unordered_map with the same keys\n"
      "  prompt  hash + longest-prefix match + token check of a cached 2,048-token\n"
      "          prompt in an engine holding 1M blocks (target <= %.0f us)\n"
      "  mover   host backend copies of 64 x 256 KiB blocks vs plain memcpy\n"
      "The last line of output is one JSON object with the figures.\n\n"
      "  --quick  small sizes, a few seconds: a smoke test, not a measurement\n",
      kPromptTargetUs);
}

}  // namespace

int RunEngineBench(int argc, char** argv) {
  bool quick = false;
  if (const int rc = ParseQuickFlags(argc, argv, "engine", PrintHelp, &quick); rc >= 0) return rc;
  const Sizes& z = quick ? kQuick : kFull;
  const MachineInfo machine = ReadMachineInfo();
  Progress("kvtier-bench engine%s on %s (%u cores)\n", quick ? " --quick (smoke-test sizes)" : "",
           machine.cpu_model.c_str(), machine.cores);

  const ModelProfile tiny{"bench-tiny", 1, 1, 8, DType::kF16, kBlockTokens};
  const Namespace ns = Namespace::Make(tiny.Fingerprint(), "bench-tenant");
  const double hash_ns = BenchHash(z, ns);
  const LookupFigures lookup = BenchLookup(z, ns);
  const PromptFigures prompt = BenchPrompt(z);
  const MoverFigures mover = BenchMover(z);

  const double lookup_ratio = lookup.batched_1m / lookup.map_1m;
  const double mover_ratio = mover.mover_gbps / mover.memcpy_gbps;
  Progress(
      "targets: lookup %.2f x unordered_map (<= %.1f): %s; prompt %.2f us (<= %.0f): %s; "
      "mover %.2f x memcpy (>= %.1f): %s\n",
      lookup_ratio, kLookupRatioTarget, Verdict(lookup_ratio <= kLookupRatioTarget), prompt.total_us, kPromptTargetUs,
      Verdict(prompt.total_us <= kPromptTargetUs), mover_ratio, kMoverRatioTarget,
      Verdict(mover_ratio >= kMoverRatioTarget));

  JsonObject machine_json;
  machine_json.Add("cpu_model", machine.cpu_model).Add("cores", uint64_t{machine.cores});
  JsonObject out;
  out.Add("hash_ns_per_block", hash_ns, 2)
      .Add("lookup_ns_per_block_1k", lookup.batched_1k, 2)
      .Add("lookup_ns_per_block_1m", lookup.batched_1m, 2)
      .Add("lookup_single_ns_per_block_1m", lookup.single_1m, 2)
      .Add("unordered_map_ns_per_block_1m", lookup.map_1m, 2)
      .Add("lookup_ratio_vs_unordered_map", lookup_ratio, 3)
      .Add("prompt_2k_us", prompt.total_us, 2)
      .Add("mover_gbps", mover.mover_gbps, 2)
      .Add("memcpy_gbps", mover.memcpy_gbps, 2)
      .Add("mover_ratio_vs_memcpy", mover_ratio, 3)
      .Add("machine", machine_json);
  std::printf("%s\n", out.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
