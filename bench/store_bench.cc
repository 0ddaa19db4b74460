// kvtier-bench stores: fetching blocks from the stores below the host tier,
// each beside the plain way of reading the same bytes, interleaved round by
// round in one run (alternating which goes first):
//  - remote: kvtier's fetch (StoreChain: one pipelined EXISTS batch, one
//    pipelined GET batch, every record verified: checksums and key) of a batch
//    of 2 MiB blocks from a local redis-server, against a raw pipelined hiredis
//    GET of the same values over its own connection (target >= 0.8x);
//  - disk: kvtier's fetch of the same batch from the disk store (O_DIRECT),
//    against a plain loop that opens each block file with O_DIRECT and reads it
//    into an aligned buffer (target >= 0.8x).
// With --signed, records are signed (stores.record_key_file) and every fetch
// checks each one's HMAC-SHA-256 too: the MAC's cost on the fetch path.
// GB/s counts the records' bytes. Ratios are medians of per-round ratios with
// bootstrap 95% intervals.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "bench_commands.h"
#include "bench_util.h"
#include "disk/disk_store.h"
#include "kvtier/stores/allocator.h"
#include "kvtier/stores/block_record.h"
#include "kvtier/stores/store_chain.h"
#include "redis/redis_store.h"
#include "redis_server.h"

namespace kvtier::bench {
namespace {

using namespace std::chrono_literals;

constexpr double kRatioTarget = 0.8;
constexpr uint32_t kBlockTokens = 16;
constexpr size_t kBlockBytes = size_t{2} << 20;
constexpr uint64_t kFingerprint = 0x5eed5eed5eed5eedULL;

struct Sizes {
  uint32_t blocks;  // Per batch.
  int rounds;
};
constexpr Sizes kFull{32, 15};
constexpr Sizes kQuick{4, 3};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier-bench stores: %s\n", what.c_str());
  std::exit(1);
}

// A chain of blocks and their records.
// The record key with --signed; nullptr: unsigned records.
std::shared_ptr<const stores::RecordKey> g_record_key;

struct Blocks {
  Namespace ns = Namespace::Make(kFingerprint, "bench");
  std::vector<TokenId> tokens;
  std::vector<BlockKey> keys;
  std::vector<stores::StoreItem> items;
  uint64_t bytes = 0;

  explicit Blocks(uint32_t n) {
    Rng rng(7);
    for (uint32_t i = 0; i < n * kBlockTokens; ++i) tokens.push_back(static_cast<TokenId>(rng.Below(50000)));
    keys.resize(n);
    ComputeKeys(ns, BlockKey{}, tokens, kBlockTokens, keys);
    std::vector<std::byte> payload(kBlockBytes);
    for (uint32_t i = 0; i < n; ++i) {
      for (size_t j = 0; j + 8 <= payload.size(); j += 8) {
        const uint64_t x = rng.Next();
        std::memcpy(payload.data() + j, &x, 8);
      }
      const BlockKey parent = i == 0 ? BlockKey{} : keys[i - 1];
      const stores::BlockRecordHeader h{kFingerprint, keys[i], parent, ns};
      const auto block_tokens = std::span(tokens).subspan(i * kBlockTokens, kBlockTokens);
      std::string rec = g_record_key != nullptr ? stores::EncodeBlockRecord(h, block_tokens, payload, *g_record_key)
                                                : stores::EncodeBlockRecord(h, block_tokens, payload);
      bytes += rec.size();
      items.push_back({stores::StoreKey("kvtier:", kFingerprint, keys[i]), std::move(rec)});
    }
  }
  stores::FetchRequest Request() const {
    stores::FetchRequest r;
    r.profile_fingerprint = kFingerprint;
    r.payload_bytes = kBlockBytes;
    r.block_tokens = kBlockTokens;
    r.key_ns = ns;
    r.keys = keys;
    r.tokens = tokens;
    return r;
  }
};

// One store in a chain, and a blocking fetch through it.
class Fetcher {
 public:
  explicit Fetcher(std::unique_ptr<stores::BlockStore> store) {
    std::vector<stores::ChainedStore> s;
    s.push_back({std::move(store), false});
    stores::StoreChainOptions o;
    o.record_key = g_record_key;
    chain_ = std::make_unique<stores::StoreChain>(std::move(s), o, [this] {
      std::lock_guard<std::mutex> l(mu_);
      cv_.notify_all();
    });
  }
  // Seconds to fetch the whole chain; dies unless every block came back verified.
  double Fetch(const Blocks& b) {
    const auto t0 = Clock::now();
    const uint64_t id = chain_->StartFetch(b.Request());
    std::optional<stores::FetchResult> r;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, 30s, [&] { return (r = chain_->TakeFetch(id)).has_value(); });
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!r || r->blocks() != b.keys.size()) {
      Die("kvtier fetched " + std::to_string(r ? r->blocks() : 0) + " of " + std::to_string(b.keys.size()) + " blocks" +
          (r && !r->status.ok() ? ": " + r->status.ToString() : ""));
    }
    return s;
  }

 private:
  std::unique_ptr<stores::StoreChain> chain_;
  std::mutex mu_;
  std::condition_variable cv_;
};

struct Pair {
  std::vector<double> kvtier_s, raw_s;
};

// Rounds of both, alternating which goes first.
template <typename A, typename B>
Pair Interleave(int rounds, A kvtier, B raw) {
  Pair p;
  kvtier();  // Warm-up of both, not counted.
  raw();
  for (int i = 0; i < rounds; ++i) {
    if (i % 2 == 0) {
      p.kvtier_s.push_back(kvtier());
      p.raw_s.push_back(raw());
    } else {
      p.raw_s.push_back(raw());
      p.kvtier_s.push_back(kvtier());
    }
  }
  return p;
}

struct Figures {
  double kvtier_gbps = -1, raw_gbps = -1;
  Interval ratio;
  double kvtier_gbps_min = -1, kvtier_gbps_max = -1, raw_gbps_min = -1, raw_gbps_max = -1;
};

Figures Summarize(const Pair& p, uint64_t bytes, uint64_t seed) {
  Figures f;
  auto gbps = [&](const std::vector<double>& s) {
    std::vector<double> g;
    for (double x : s) g.push_back(static_cast<double>(bytes) / x / 1e9);
    return g;
  };
  const auto k = gbps(p.kvtier_s), r = gbps(p.raw_s);
  f.kvtier_gbps = Median(k);
  f.raw_gbps = Median(r);
  f.kvtier_gbps_min = *std::min_element(k.begin(), k.end());
  f.kvtier_gbps_max = *std::max_element(k.begin(), k.end());
  f.raw_gbps_min = *std::min_element(r.begin(), r.end());
  f.raw_gbps_max = *std::max_element(r.begin(), r.end());
  // Throughput ratio kvtier/raw = time ratio raw/kvtier, per round.
  f.ratio = PairedMedianRatio(p.raw_s, p.kvtier_s, seed);
  return f;
}

Figures BenchRemote(const Sizes& z, const Blocks& b) {
  auto redis = testing::RedisServer::Start();
  if (!redis.ok()) Die("redis-server: " + redis.status().ToString());
  const int port = (*redis)->port();
  redisContext* rc = redisConnect("127.0.0.1", port);
  if (rc == nullptr || rc->err) Die("cannot connect to redis-server");
  stores::RedisStoreOptions o;
  o.nodes = {(*redis)->address()};
  o.io_timeout = 10s;
  auto store = stores::OpenRedisStore(o);
  if (!store.ok()) Die("redis store: " + store.status().ToString());
  if (Status s = (*store)->Put(b.items); !s.ok()) Die("redis put: " + s.ToString());
  Fetcher kvtier(std::move(store).value());

  auto raw = [&] {
    const auto t0 = Clock::now();
    for (const auto& item : b.items) redisAppendCommand(rc, "GET %b", item.key.data(), item.key.size());
    uint64_t got = 0;
    for (size_t i = 0; i < b.items.size(); ++i) {
      void* reply = nullptr;
      if (redisGetReply(rc, &reply) != REDIS_OK || reply == nullptr) Die("raw GET failed");
      got += static_cast<redisReply*>(reply)->len;
      freeReplyObject(reply);
    }
    if (got != b.bytes) Die("raw GET returned other bytes");
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const Pair p = Interleave(
      z.rounds, [&] { return kvtier.Fetch(b); }, raw);
  redisFree(rc);
  return Summarize(p, b.bytes, 11);
}

Figures BenchDisk(const Sizes& z, const Blocks& b, const std::string& dir, std::string* how) {
  stores::DiskStoreOptions o;
  o.dir = dir + "/disk";
  o.max_bytes = uint64_t{1} << 34;
  auto store = stores::OpenDiskStore(o);
  if (!store.ok()) Die("disk store: " + store.status().ToString());
  *how = (*store)->Describe();
  if (Status s = (*store)->Put(b.items); !s.ok()) Die("disk put: " + s.ToString());
  // The plain reader reads the very files the store wrote.
  std::vector<std::string> files;
  for (const auto& item : b.items) {
    for (const auto& e : std::filesystem::directory_iterator(o.dir)) {
      if (e.path().filename().string().find(item.key.substr(item.key.size() - 32)) != std::string::npos) {
        files.push_back(e.path().string());
      }
    }
  }
  if (files.size() != b.items.size()) Die("block files not found");
  Fetcher kvtier(std::move(store).value());
  const size_t cap = (stores::BlockRecordBytes(kBlockTokens, kBlockBytes) + 4095) & ~size_t{4095};
  void* buf = nullptr;
  if (::posix_memalign(&buf, 4096, cap) != 0) Die("posix_memalign");
  auto raw = [&] {
    const auto t0 = Clock::now();
    uint64_t got = 0;
    for (const auto& f : files) {
      const int fd = ::open(f.c_str(), O_RDONLY | O_DIRECT);
      if (fd < 0) Die("open " + f);
      ssize_t n;
      while ((n = ::read(fd, static_cast<char*>(buf), cap)) > 0) got += static_cast<uint64_t>(n);
      ::close(fd);
    }
    if (got != b.bytes) Die("plain O_DIRECT read returned other bytes");
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const Pair p = Interleave(
      z.rounds, [&] { return kvtier.Fetch(b); }, raw);
  std::free(buf);
  return Summarize(p, b.bytes, 13);
}

void PrintHelp() {
  std::printf(
      "usage: kvtier-bench stores [--quick] [--signed]\n\n"
      "Fetches a batch of 32 blocks of 2 MiB from the stores below the host tier, each\n"
      "beside its plain baseline, interleaved round by round:\n"
      "  remote  kvtier's fetch from a local redis-server (pipelined check and GET, every\n"
      "          record verified) vs a raw pipelined hiredis GET of the same values\n"
      "  disk    kvtier's fetch from its disk store vs a plain O_DIRECT read of the same files\n"
      "Targets: kvtier >= %.1fx the baseline's GB/s in both. The last line of output is\n"
      "one JSON object with the figures.\n\n"
      "  --quick  4 blocks, 3 rounds: a smoke test, not a measurement\n"
      "  --signed records signed with a record key: each fetch checks their MAC too\n",
      kRatioTarget);
}

const char* Verdict(bool met) { return met ? "met" : "NOT met"; }

JsonObject Json(const Figures& f) {
  JsonObject o;
  o.Add("kvtier_gbps", f.kvtier_gbps, 3)
      .Add("kvtier_gbps_min", f.kvtier_gbps_min, 3)
      .Add("kvtier_gbps_max", f.kvtier_gbps_max, 3)
      .Add("raw_gbps", f.raw_gbps, 3)
      .Add("raw_gbps_min", f.raw_gbps_min, 3)
      .Add("raw_gbps_max", f.raw_gbps_max, 3)
      .Add("ratio", f.ratio, 3);
  return o;
}

}  // namespace

int RunStoreBench(int argc, char** argv) {
  bool quick = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--signed") == 0) {
      g_record_key = std::make_shared<const stores::RecordKey>(
          stores::RecordKey::FromSecret("kvtier-bench record key, 32 bytes or more").value());
    } else {
      args.push_back(argv[i]);
    }
  }
  if (const int rc = ParseQuickFlags(static_cast<int>(args.size()), args.data(), "stores", PrintHelp, &quick); rc >= 0) {
    return rc;
  }
  const Sizes& z = quick ? kQuick : kFull;
  const MachineInfo machine = ReadMachineInfo();
  Progress("kvtier-bench stores%s%s on %s (%u cores): batches of %u blocks of 2 MiB, %d rounds\n",
           quick ? " --quick (smoke-test sizes)" : "", g_record_key ? " --signed" : "", machine.cpu_model.c_str(), machine.cores, z.blocks, z.rounds);
  // As kvtierd does with stores configured: fetch buffers are kept for the next fetch.
  stores::KeepFetchBuffers(uint64_t{256} << 20);
  char tmpl[] = "/tmp/kvtier-store-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  const std::string dir = tmpl;
  const Blocks b(z.blocks);
  const Figures remote = BenchRemote(z, b);
  Progress(
      "remote: kvtier %.2f GB/s [%.2f, %.2f], raw GET %.2f GB/s [%.2f, %.2f]: ratio %.3f [%.3f, %.3f] (>= %.1f): %s\n",
      remote.kvtier_gbps, remote.kvtier_gbps_min, remote.kvtier_gbps_max, remote.raw_gbps, remote.raw_gbps_min,
      remote.raw_gbps_max, remote.ratio.value, remote.ratio.lo, remote.ratio.hi, kRatioTarget,
      Verdict(remote.ratio.value >= kRatioTarget));
  std::string how;
  const Figures disk = BenchDisk(z, b, dir, &how);
  Progress(
      "disk (%s): kvtier %.2f GB/s [%.2f, %.2f], plain O_DIRECT %.2f GB/s [%.2f, %.2f]: ratio %.3f [%.3f, %.3f] "
      "(>= %.1f): %s\n",
      how.c_str(), disk.kvtier_gbps, disk.kvtier_gbps_min, disk.kvtier_gbps_max, disk.raw_gbps, disk.raw_gbps_min,
      disk.raw_gbps_max, disk.ratio.value, disk.ratio.lo, disk.ratio.hi, kRatioTarget,
      Verdict(disk.ratio.value >= kRatioTarget));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  JsonObject machine_json;
  machine_json.Add("cpu_model", machine.cpu_model).Add("cores", uint64_t{machine.cores});
  JsonObject out;
  out.Add("blocks", uint64_t{z.blocks})
      .Add("block_bytes", uint64_t{kBlockBytes})
      .Add("rounds", uint64_t(z.rounds))
      .Add("remote_ratio", remote.ratio.value, 3)
      .Add("disk_ratio", disk.ratio.value, 3)
      .Add("remote", Json(remote))
      .Add("disk", Json(disk))
      .Add("disk_store", how)
      .Add("signed", g_record_key != nullptr ? "true" : "false")
      .Add("machine", machine_json);
  std::printf("%s\n", out.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
