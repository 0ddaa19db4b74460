// The stores below the host tier with real kvtierd processes: a disk tier that
// keeps blocks across a crash, and a Redis tier through which a second daemon
// ("host B") continues a session another ("host A") started. Every hit's bytes
// are checked; corrupt and foreign records are misses, counted, never served.
#include <dirent.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "payload.h"
#include "process.h"
#include "redis_server.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<TokenId> Tokens(uint32_t seed, uint32_t blocks) {
  std::vector<TokenId> t;
  for (uint32_t i = 0; i < blocks * 16; ++i) t.push_back(seed * 7919 + i);
  return t;
}

// Blocks of `tokens` an Acquire through `c` leases, each payload checked after promotion.
size_t VerifiedHitsOf(Client& c, const std::string& session, const std::vector<TokenId>& tokens,
                      Promote promote = Promote::kNow);

// A daemon with a client, and what a test does through it.
class Host {
 public:
  explicit Host(const std::string& config) : daemon_(config) {}
  ~Host() {
    client_.reset();
    const std::string log = daemon_.log();
    for (const char* bad : {"ThreadSanitizer", "AddressSanitizer", "LeakSanitizer", "runtime error:"}) {
      EXPECT_EQ(log.find(bad), std::string::npos) << "kvtierd's log reports " << bad;
    }
    if (!::testing::Test::HasFailure()) return;
    std::fprintf(stderr, "--- kvtierd log (%s) ---\n%s", daemon_.instance().c_str(), daemon_.log().c_str());
  }
  void Start() {
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
    Connect();
  }
  void Connect() { client_ = NewClient(); }
  void Disconnect() { client_.reset(); }
  // Another connection, as `tenant` (without tenants: configured, a free label).
  std::unique_ptr<Client> NewClient(const std::string& tenant = "") {
    ClientOptions o;
    o.socket_path = daemon_.socket();
    o.client_name = "stores-test";
    o.tenant = tenant;
    o.reconnect = false;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  void Kill(int signal) {
    client_.reset();
    daemon_.Kill(signal);
    ASSERT_TRUE(daemon_.Wait(15s).ok());
    daemon_.RemoveSegments();
  }
  Client& c() { return *client_; }
  DaemonProcess& daemon() { return daemon_; }

  std::map<std::string, double> Stats() {
    std::map<std::string, double> out;
    auto s = client_->Stats();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) {
      for (const auto& [k, v] : *s) out[k] = v;
    }
    return out;
  }
  // Waits until stats()[name] reaches `value`.
  bool WaitForStat(const std::string& name, double value, std::chrono::milliseconds limit = 10s) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      if (Stats()[name] >= value) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // Writes payloads (a function of each key) and commits `tokens` as `session`
  // (write-through stores get its blocks), then demotes it to the host tier
  // (so do write-back stores, should pressure drop them from there).
  void PutAndDemote(const std::string& session, const std::vector<TokenId>& tokens, bool demote = true) {
    const std::vector<BlockKey> keys = client_->Keys(tokens);
    auto w = client_->Allocate(static_cast<uint32_t>(keys.size()));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (size_t i = 0; i < keys.size(); ++i) FillPayload(keys[i], w->data(i), w->slot_bytes());
    auto r = client_->Commit(*w, session, BlockKey{}, 0, tokens);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!demote) return;
    // Blocks being copied for a write-through store are pinned meanwhile: the
    // demotion takes them once the copy landed.
    size_t demoted = 0;
    for (int i = 0; i < 500 && demoted < keys.size(); ++i) {
      auto d = client_->Demote(session);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      demoted += *d;
      if (demoted < keys.size()) std::this_thread::sleep_for(2ms);
    }
    ASSERT_EQ(demoted, keys.size());
  }

  // Blocks of `tokens` an Acquire leases, each payload checked after promotion.
  size_t VerifiedHits(const std::string& session, const std::vector<TokenId>& tokens,
                      Promote promote = Promote::kNow) {
    return VerifiedHitsOf(*client_, session, tokens, promote);
  }

 private:
  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
};

// Commits `tokens` as `session` through `c` 128 blocks at a time (a chain
// longer than the GPU tier), each piece demoted to the host tier: a
// write-through store gets every block.
void CommitLongChain(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
  const std::vector<BlockKey> keys = c.Keys(tokens);
  const size_t bt = tokens.size() / keys.size();
  for (size_t from = 0; from < keys.size(); from += 128) {
    const size_t n = std::min<size_t>(128, keys.size() - from);
    auto w = c.Allocate(static_cast<uint32_t>(n));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (size_t i = 0; i < n; ++i) FillPayload(keys[from + i], w->data(i), w->slot_bytes());
    auto r = c.Commit(*w, session, from == 0 ? BlockKey{} : keys[from - 1], static_cast<uint32_t>(from),
                      std::span(tokens).subspan(from * bt, n * bt));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    size_t demoted = 0;
    for (int i = 0; i < 500 && demoted < n; ++i) {
      auto d = c.Demote(session);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      demoted += *d;
      if (demoted < n) std::this_thread::sleep_for(2ms);
    }
    ASSERT_EQ(demoted, n);
  }
}

size_t VerifiedHitsOf(Client& c, const std::string& session, const std::vector<TokenId>& tokens,
                      Promote promote) {
  const std::vector<BlockKey> keys = c.Keys(tokens);
  auto lease = c.Acquire(session, tokens, promote);
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
  if (!lease.ok()) return 0;
  EXPECT_TRUE(lease->Wait(10s).ok());
  for (size_t i = 0; i < lease->size(); ++i) {
    EXPECT_TRUE(PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) << "block " << i;
  }
  return lease->size();
}

// fetch_budget_ms: these tests check what a fetch brings back, not how soon. At the default
// (100 ms) an O_DIRECT read on a loaded 2-core CI machine overran it once: the Acquire was
// answered with what had landed so far (nothing), and the test read that as a miss.
std::string DiskConfig(const std::string& dir, const char* write = "through", const std::string& stores_extra = "") {
  return std::string(kSmallDaemonConfig) + "stores:\n" + stores_extra + "  fetch_budget_ms: 2000\n  tiers:\n    - kind: disk\n      path: " +
         dir + "\n      max_bytes: 64MiB\n      write: " + write + "\n";
}

std::string FreshDir(const char* what) {
  std::string dir = "/tmp/kvtier-" + std::string(what) + "-" + std::to_string(::getpid()) + "-" +
                    std::to_string(Clock::now().time_since_epoch().count());
  return dir;
}

// The block file whose name holds `key`'s hex.
std::string FileOf(const std::string& dir, const BlockKey& key) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find(key.ToHex()) != std::string::npos) return e.path().string();
  }
  return "";
}

// --- A forger: writes to the store, holds no record key -----------------------

// `record` (a victim's record, as the store holds it) with its payload replaced
// by the forger's bytes and both checksums made right again: every check but
// the MAC passes (namespace, key, parent and tokens are the victim's own).
// Offsets as block_record.h's; whatever follows the payload (a signed
// record's key id and MAC) is left as it was.
std::string Forge(std::string record) {
  uint32_t tokens = 0;
  uint64_t payload_bytes = 0;
  std::memcpy(&tokens, record.data() + 12, 4);
  std::memcpy(&payload_bytes, record.data() + 72, 8);
  const size_t at = 96 + size_t{tokens} * 4;
  EXPECT_GE(record.size(), at + payload_bytes);
  std::memset(record.data() + at, 0x66, payload_bytes);
  const uint64_t payload_sum = XXH3_64bits(record.data() + at, payload_bytes);
  std::memcpy(record.data() + 80, &payload_sum, 8);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, record.data(), 88);
  XXH3_64bits_update(&st, record.data() + 96, size_t{tokens} * 4);
  const uint64_t header_sum = XXH3_64bits_digest(&st);
  std::memcpy(record.data() + 88, &header_sum, 8);
  return record;
}

// A record key file of 32 random bytes, mode 0600, in `dir`.
std::string WriteRecordKey(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/record.key";
  std::string secret(32, '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(secret.data(), 32);
  std::ofstream(path, std::ios::binary) << secret;
  ::chmod(path.c_str(), 0600);
  return path;
}

// The stores: section's line naming the key file.
std::string KeyLine(const std::string& key_file) { return "  record_key_file: " + key_file + "\n"; }

// Commits 4-block sessions (tokens from seed on) until the disk store writes
// one, for at most 10 s: the tokens of the one that landed, or none.
std::vector<TokenId> WriteUntilOneLands(Host& h, uint32_t seed) {
  const auto until = Clock::now() + 10s;
  while (Clock::now() < until) {
    const double before = h.Stats()["store.disk.put_blocks"];
    std::vector<TokenId> tokens = Tokens(seed++, 4);
    h.PutAndDemote("c" + std::to_string(seed), tokens);
    if (h.WaitForStat("store.disk.put_blocks", before + 4, 500ms)) return tokens;
  }
  return {};
}

class DiskTierTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_ = FreshDir("disk");
};

TEST_F(DiskTierTest, BlocksWrittenToTheDiskTierAreServedAfterTheDaemonIsKilled) {
  Host h(DiskConfig(dir_));
  h.Start();
  const auto tokens = Tokens(1, 6);
  h.PutAndDemote("chat", tokens);
  ASSERT_TRUE(h.WaitForStat("store.disk.put_blocks", 6)) << "the demoted blocks reach the disk tier";
  // The disk store's own counters are shown beside the chain's: its level of files and bytes held.
  const auto written = h.Stats();
  EXPECT_EQ(written.at("store.disk.files"), 6);
  EXPECT_GT(written.at("store.disk.held_bytes"), 6 * 16 * 4) << "six records, each with its 16 token ids and bytes";
  EXPECT_EQ(written.at("store.disk.evicted_files"), 0);
  h.Kill(SIGKILL);

  h.Start();
  EXPECT_EQ(h.Stats()["host_used"], 0) << "no warm restart: the host tier starts empty";
  EXPECT_EQ(h.VerifiedHits("chat", tokens), 6u);
  const auto st = h.Stats();
  EXPECT_EQ(st.at("store.disk.hit_blocks"), 6);
  EXPECT_EQ(st.at("imported_blocks"), 6);
  EXPECT_EQ(st.at("store_fetches"), 1);
  // The next turn finds them in the GPU tier: the stores are not asked again.
  EXPECT_EQ(h.VerifiedHits("chat", tokens), 6u);
  EXPECT_EQ(h.Stats().at("store_fetches"), 1);
}

TEST_F(DiskTierTest, ACorruptOrTruncatedBlockFileIsAMissNeverServed) {
  Host h(DiskConfig(dir_));
  h.Start();
  const auto tokens = Tokens(2, 6);
  const std::vector<BlockKey> keys = h.c().Keys(tokens);
  h.PutAndDemote("chat", tokens);
  ASSERT_TRUE(h.WaitForStat("store.disk.put_blocks", 6));
  h.Kill(SIGKILL);
  // Block 2: a payload byte flipped. Block 4: cut short.
  const std::string flipped = FileOf(dir_, keys[2]), cut = FileOf(dir_, keys[4]);
  ASSERT_FALSE(flipped.empty());
  ASSERT_FALSE(cut.empty());
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char b = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.put(b);
  }
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) / 2);

  h.Start();
  EXPECT_EQ(h.VerifiedHits("chat", tokens), 2u) << "blocks 0 and 1, nothing from the corrupt block 2 on";
  EXPECT_EQ(h.Stats().at("store.disk.corrupt_records"), 1);
}

TEST_F(DiskTierTest, ACleanStopWritesTheCachedBlocksBackForTheNextStart) {
  Host h(DiskConfig(dir_, "back"));
  h.Start();
  const auto tokens = Tokens(13, 10);
  h.PutAndDemote("chat", tokens, /*demote=*/false);  // In the GPU tier when the daemon stops.
  EXPECT_EQ(h.Stats()["store.disk.put_blocks"], 0) << "a write-back store gets nothing while there is room";
  h.Kill(SIGTERM);
  EXPECT_NE(h.daemon().log().find("stores: offered 10 host-tier blocks to the write-back stores at shutdown"),
            std::string::npos);
  h.Start();
  EXPECT_EQ(h.VerifiedHits("chat", tokens), 10u);
  EXPECT_EQ(h.Stats().at("store.disk.hit_blocks"), 10);
}

TEST_F(DiskTierTest, BlocksPressureDropsFromTheHostTierAreWrittenBack) {
  // 16 host slots: a second session's demotion drops the first's blocks, which
  // a write-back disk tier keeps.
  std::string config = DiskConfig(dir_, "back");
  config.replace(config.find("host_blocks: 1024"), 17, "host_blocks: 16");
  // No watermark drops on top of the demotion's (their write-back would race the test's reads).
  config += "tiering:\n  host_high_watermark: 1.0\n  host_low_watermark: 1.0\n";
  Host h(config);
  h.Start();
  const auto a = Tokens(3, 12), b = Tokens(4, 12);
  h.PutAndDemote("a", a);
  h.PutAndDemote("b", b);
  ASSERT_TRUE(h.WaitForStat("store.disk.put_blocks", 8)) << "a's dropped blocks";
  // The session says where each of its blocks went.
  const std::vector<BlockKey> keys = h.c().Keys(a);
  auto info = h.c().GetSession("a");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->summary.blocks, 4u);
  EXPECT_EQ(info->chain, keys);
  const std::vector<std::string>& stores = info->stores;
  ASSERT_EQ(stores, std::vector<std::string>{"disk"}) << "the reply names the stores";
  std::vector<std::string> places;
  for (uint8_t t : info->tiers) places.push_back(PlaceName(t, stores));
  std::vector<std::string> want(4, "host");
  want.resize(12, "disk");
  EXPECT_EQ(places, want);
  // One file lost behind kvtierd's back: the fetch finds it missing, the disk tier forgets it.
  ASSERT_TRUE(std::filesystem::remove(FileOf(dir_, keys[11])));
  EXPECT_EQ(h.VerifiedHits("a", a), 11u) << "a's prefix from the host tier, its tail from the disk tier";
  EXPECT_GE(h.Stats().at("store.disk.hit_blocks"), 7);
  info = h.c().GetSession("a");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->summary.blocks, 11u);
  ASSERT_EQ(info->chain.size(), 12u) << "the lost block is still below the fetched ones";
  EXPECT_EQ(PlaceName(info->tiers[11], stores), "nowhere");
}

// Before: records carried checksums only, and a forger who can write the
// directory made one that every check passed: its bytes were served. With
// stores.record_key_file, a record without a valid MAC is a miss (forged).
TEST_F(DiskTierTest, ARecordForgedInTheDirectoryWithoutTheKeyIsNeverServed) {
  const std::string key_file = WriteRecordKey(dir_ + "-key");
  Host h(DiskConfig(dir_, "through", KeyLine(key_file)));
  h.Start();
  const auto tokens = Tokens(14, 6);
  const std::vector<BlockKey> keys = h.c().Keys(tokens);
  h.PutAndDemote("chat", tokens);
  ASSERT_TRUE(h.WaitForStat("store.disk.put_blocks", 6));
  h.Kill(SIGKILL);
  // The forger rewrites block 2's file with bytes of its own.
  const std::string file = FileOf(dir_, keys[2]);
  ASSERT_FALSE(file.empty());
  std::string record;
  {
    std::ifstream in(file, std::ios::binary);
    record.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << Forge(record);

  h.Start();
  EXPECT_EQ(h.VerifiedHits("chat", tokens), 2u) << "blocks 0 and 1; the forged block 2 stops the prefix";
  const auto st = h.Stats();
  EXPECT_EQ(st.at("store.disk.forged_records"), 1);
  EXPECT_EQ(st.at("store.disk.corrupt_records") + st.at("store.disk.foreign_records"), 0);
  std::filesystem::remove_all(dir_ + "-key");
}

// Before: a deleted store directory failed every write until kvtierd restarted,
// even once it was there again.
TEST_F(DiskTierTest, ADeletedDirectoryIsMadeAgainAndWritesLandThere) {
  Host h(DiskConfig(dir_));
  h.Start();
  h.PutAndDemote("a", Tokens(15, 4));
  ASSERT_TRUE(h.WaitForStat("store.disk.put_blocks", 4));
  std::filesystem::remove_all(dir_);
  h.PutAndDemote("b", Tokens(16, 4));
  ASSERT_TRUE(h.WaitForStat("store.disk.errors", 1)) << "writes into the deleted directory fail, counted";
  // kvtierd makes the directory again (its parent is there) within a second or so.
  const std::vector<TokenId> landed = WriteUntilOneLands(h, 100);
  ASSERT_FALSE(landed.empty()) << "no write landed after the directory was deleted";
  EXPECT_TRUE(std::filesystem::is_directory(dir_));
  EXPECT_GE(h.Stats().at("store.disk.reopens"), 1);
  h.Kill(SIGKILL);
  h.Start();
  EXPECT_EQ(h.VerifiedHits("again", landed), 4u) << "fetched back from the new directory";
}

// Before: a directory kvtierd could not use at start refused the start (a Redis
// server that is down did not). A path under a regular file: mkdir fails with
// ENOTDIR even for root, which mode bits would not stop.
TEST_F(DiskTierTest, AnUnusableDirectoryAtStartIsAStoreThatIsDownUntilItCanBeUsed) {
  const std::string parent = dir_, store_dir = dir_ + "/store";
  std::ofstream(parent) << "a file where the parent directory should be";
  Host h(DiskConfig(store_dir));
  h.Start();
  EXPECT_NE(h.daemon().log().find(store_dir), std::string::npos) << "the start log names the directory";
  h.PutAndDemote("a", Tokens(17, 4));
  ASSERT_TRUE(h.WaitForStat("store.disk.errors", 1));
  EXPECT_EQ(h.Stats().at("store.disk.down"), 1);
  EXPECT_EQ(h.Stats().at("store.disk.put_blocks"), 0);
  std::filesystem::remove(parent);
  std::filesystem::create_directory(parent);
  const std::vector<TokenId> landed = WriteUntilOneLands(h, 200);
  ASSERT_FALSE(landed.empty()) << "the store never came up";
  EXPECT_EQ(h.Stats().at("store.disk.down"), 0);
  h.Kill(SIGKILL);
  h.Start();
  EXPECT_EQ(h.VerifiedHits("again", landed), 4u);
}

// --- The remote tier: two daemons ("hosts") sharing one Redis -----------------

std::string RemoteConfig(const std::vector<std::string>& nodes, bool cluster, int fetch_budget_ms = 2000,
                         const std::string& stores_extra = "") {
  std::string list;
  for (const auto& n : nodes) list += (list.empty() ? "" : ", ") + n;
  return std::string(kSmallDaemonConfig) + "stores:\n" + stores_extra + "  fetch_budget_ms: " + std::to_string(fetch_budget_ms) +
         "\n  tiers:\n    - kind: redis\n      nodes: [" + list +
         "]\n      cluster: " + (cluster ? "true" : "false") + "\n      timeout_ms: 300\n";
}

// The store budget of the tests that need a fetch to outlast it: a victim's 8-block fetch (or a
// first 4 MiB chunk) must fit it while a 256 MiB fetch does not; sanitizer builds are slower.
TEST_F(DiskTierTest, ALocateBringsInWhatOnlyTheDiskHoldsAndLeasesNothing) {
  Host h(DiskConfig(dir_));
  h.Start();
  const auto tokens = Tokens(3, 6);
  h.PutAndDemote("chat", tokens);
  ASSERT_TRUE(h.WaitForStat("store.disk.put_blocks", 6));
  h.Kill(SIGKILL);
  h.Start();
  std::unique_ptr<Client> c = h.NewClient();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->StoresBelow());
  ASSERT_EQ(c->Probe(tokens), 0u) << "a cold kvtierd: its index holds nothing";
  auto more = tokens;  // Two blocks no store holds after the six.
  for (int i = 0; i < 8; ++i) more.push_back(700000 + i);
  auto found = c->Locate(more);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, 6u);
  EXPECT_EQ(c->Probe(tokens), 6u) << "in the host tier now, seen by the index";
  auto st = h.Stats();
  EXPECT_EQ(st.at("read_leases"), 0) << "a locate leases nothing";
  EXPECT_EQ(st.at("imported_blocks"), 6);
  EXPECT_EQ(st.at("store_fetches"), 1);
  EXPECT_EQ(h.VerifiedHits("chat", tokens), 6u) << "a session reads them, every payload checked";
  EXPECT_EQ(h.Stats().at("store_fetches"), 1) << "from the host tier: the stores are not asked again";
  // Once more: what the tiers hold is answered without the stores' answer changing it.
  found = c->Locate(tokens);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 6u);
}

#if defined(__SANITIZE_THREAD__)
constexpr int kSlowFetchBudgetMs = 400;
#elif defined(__SANITIZE_ADDRESS__)
constexpr int kSlowFetchBudgetMs = 120;
#else
constexpr int kSlowFetchBudgetMs = 50;
#endif

// Host w commits `a` as tenant a's session "a" and `b` as tenant b's "b", and
// waits (60 s at most) until its Redis store holds every block of both.
void WriteThroughAsTenants(Host& w, const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  std::unique_ptr<Client> wa = w.NewClient("a"), wb = w.NewClient("b");
  ASSERT_TRUE(wa && wb);
  const double before = w.Stats()["store.redis.put_blocks"];
  CommitLongChain(*wa, "a", a);
  CommitLongChain(*wb, "b", b);
  const size_t blocks = wa->Keys(a).size() + wb->Keys(b).size();
  ASSERT_TRUE(w.WaitForStat("store.redis.put_blocks", before + static_cast<double>(blocks), 60s));
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(RedisInstalled()) << kRedisRequired;
    auto r = RedisServer::Start();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    redis_ = std::move(r).value();
  }
  // The Redis key of block `key` (a record's name holds its key's hex).
  std::string RedisKey(const BlockKey& key) {
    auto k = redis_->Command({"--raw", "KEYS", "*" + key.ToHex()});
    EXPECT_TRUE(k.ok());
    return k.ok() ? *k : "";
  }
  std::unique_ptr<RedisServer> redis_;
};

TEST_F(RemoteTierTest, ASessionStartedOnHostAContinuesOnHostBWithTheSameBytes) {
  Host a(RemoteConfig({redis_->address()}, false)), b(RemoteConfig({redis_->address()}, false));
  a.Start();
  b.Start();
  const auto tokens = Tokens(5, 8);
  a.PutAndDemote("chat", tokens, /*demote=*/false);  // Written through at commit, from the GPU tier.
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 8));
  EXPECT_EQ(a.Stats()["gpu_used"], 8) << "host A keeps its blocks where they are";
  EXPECT_EQ(b.VerifiedHits("chat", tokens), 8u);
  const auto st = b.Stats();
  EXPECT_EQ(st.at("store.redis.hit_blocks"), 8);
  EXPECT_EQ(st.at("imported_blocks"), 8);
  EXPECT_EQ(st.at("promoted_blocks"), 8) << "fetched into the host tier, promoted to the GPU tier";
  EXPECT_EQ(st.at("store_hit_tokens"), 128);
  EXPECT_EQ(st.at("hit_tokens_gpu") + st.at("hit_tokens_host"), 0);
  // A longer conversation on host B: the remote prefix, then a miss.
  auto longer = tokens;
  for (int i = 0; i < 32; ++i) longer.push_back(900000 + i);
  EXPECT_EQ(b.VerifiedHits("chat", longer), 8u);
  const auto after = b.Stats();
  EXPECT_EQ(after.at("hit_tokens_gpu"), 128) << "the second turn found them in host B's GPU tier";
  EXPECT_EQ(after.at("store_hit_tokens"), 128);
  EXPECT_EQ(after.at("miss_tokens"), 32);
}

TEST_F(RemoteTierTest, AValueCorruptedOrTakenFromAnotherBlockIsAMissNeverServed) {
  Host a(RemoteConfig({redis_->address()}, false)), b(RemoteConfig({redis_->address()}, false));
  a.Start();
  b.Start();
  const auto x = Tokens(6, 4), y = Tokens(7, 4);
  const std::vector<BlockKey> xk = a.c().Keys(x), yk = a.c().Keys(y);
  a.PutAndDemote("x", x);
  a.PutAndDemote("y", y);
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 8));
  // x's block 1 holds y's block 1 record; y's block 2 has a payload byte changed.
  ASSERT_TRUE(redis_->Command({"COPY", RedisKey(yk[1]), RedisKey(xk[1]), "REPLACE"}).ok());
  auto len = redis_->Command({"STRLEN", RedisKey(yk[2])});
  ASSERT_TRUE(len.ok());
  ASSERT_TRUE(redis_->Command({"SETRANGE", RedisKey(yk[2]), std::to_string(std::stoll(*len) - 1), "#"}).ok());
  EXPECT_EQ(b.VerifiedHits("x", x), 1u);
  EXPECT_EQ(b.VerifiedHits("y", y), 2u);
  const auto st = b.Stats();
  EXPECT_EQ(st.at("store.redis.foreign_records"), 1);
  EXPECT_EQ(st.at("store.redis.corrupt_records"), 1);
}

// Before: whoever could write to the shared Redis (another host's process)
// wrote a record every check passed under a victim's key, and its bytes were
// served to the victim. With stores.record_key_file on both hosts, the forged
// block is a miss counted as forged, and the prefix stops before it.
TEST_F(RemoteTierTest, ARecordForgedInRedisWithoutTheKeyIsNeverServed) {
  const std::string key_dir = FreshDir("record-key");
  const std::string key_file = WriteRecordKey(key_dir);
  Host a(RemoteConfig({redis_->address()}, false, 2000, KeyLine(key_file)));
  Host b(RemoteConfig({redis_->address()}, false, 2000, KeyLine(key_file)));
  a.Start();
  b.Start();
  const auto tokens = Tokens(18, 6);
  const std::vector<BlockKey> keys = a.c().Keys(tokens);
  a.PutAndDemote("chat", tokens, /*demote=*/false);
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 6));
  // The forger: a plain Redis client, binary-safe, without the key.
  redisContext* r = redisConnect("127.0.0.1", redis_->port());
  ASSERT_TRUE(r != nullptr && r->err == 0);
  const std::string name = RedisKey(keys[3]);
  auto* got = static_cast<redisReply*>(redisCommand(r, "GET %b", name.data(), name.size()));
  ASSERT_TRUE(got != nullptr && got->type == REDIS_REPLY_STRING);
  const std::string forged = Forge(std::string(got->str, got->len));
  freeReplyObject(got);
  auto* set = static_cast<redisReply*>(
      redisCommand(r, "SET %b %b", name.data(), name.size(), forged.data(), forged.size()));
  ASSERT_TRUE(set != nullptr && set->type == REDIS_REPLY_STATUS);
  freeReplyObject(set);
  redisFree(r);

  EXPECT_EQ(b.VerifiedHits("chat", tokens), 3u) << "blocks 0-2; not one byte of the forged block 3";
  const auto st = b.Stats();
  EXPECT_EQ(st.at("store.redis.forged_records"), 1);
  EXPECT_EQ(st.at("store.redis.corrupt_records") + st.at("store.redis.foreign_records"), 0);
  std::filesystem::remove_all(key_dir);
}

// A fetch that overran stores.fetch_budget_ms was thrown away, and the next
// Acquire started it again: a cold host never got a prefix the stores take
// longer than the budget to give, and a tenant looping on one reread it each
// time, filling the store I/O thread. Now it lands in the session when it
// comes, and that tenant starts no second fetch meanwhile.
TEST_F(RemoteTierTest, AFetchPastTheBudgetLandsInTheSessionForItsNextAcquire) {
  Host a(RemoteConfig({redis_->address()}, false)), b(RemoteConfig({redis_->address()}, false, 50));
  a.Start();
  b.Start();
  const auto tokens = Tokens(11, 8);
  a.PutAndDemote("chat", tokens, /*demote=*/false);
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 8));
  redis_->Pause();  // Answers 250 ms late: past the 50 ms budget, within the 300 ms timeout.
  std::thread resume([this] {
    std::this_thread::sleep_for(250ms);
    redis_->Resume();
  });
  EXPECT_EQ(b.VerifiedHits("chat", tokens), 0u) << "the budget ran out";
  EXPECT_EQ(b.VerifiedHits("chat", tokens), 0u) << "no second fetch while the first is under way";
  resume.join();
  ASSERT_TRUE(b.WaitForStat("store_fetches_landed", 1));
  auto st = b.Stats();
  EXPECT_EQ(st.at("store_fetch_landed_blocks"), 8);
  EXPECT_EQ(st.at("store_fetches"), 1);
  EXPECT_EQ(st.at("store_fetch_timeouts"), 1);
  EXPECT_EQ(b.VerifiedHits("chat", tokens), 8u) << "from the host tier, bytes verified";
  st = b.Stats();
  EXPECT_EQ(st.at("store_fetches"), 1) << "the stores were not asked again";
  EXPECT_EQ(st.at("hit_tokens_host") + st.at("hit_tokens_gpu"), 8 * 16);
}

// The fetch read each store in one batched Get, so nothing of it was ready
// before all of it: a cold host whose fetch of a long prefix outlasted the
// budget got none of it in the first Acquire. Now the fetch reads chunk by
// chunk, and the Acquire past the budget is served the verified prefix, the
// rest landing in the session for the next.
TEST_F(RemoteTierTest, AColdHostsFirstAcquirePastTheBudgetGetsThePrefixFetchedSoFar) {
  // 128 KiB blocks: the 2,048-block prefix is 256 MiB. The budget must only let the first chunk
  // (4 MiB) be read and verified: Redis is paused from the first block read until past the budget,
  // so the fetch outlasts any budget. 50 ms was too short for that chunk while the test suite ran
  // vLLM engines beside it (a plain build got none of it once); 400 ms, as under TSan, everywhere.
  // Redis' timeout is well past the pause below.
  constexpr int kBudgetMs = std::max(kSlowFetchBudgetMs, 400);
  std::string config = RemoteConfig({redis_->address()}, false, kBudgetMs) + "tiering:\n  tick_ms: 5\n";
  config.replace(config.find("head_dim: 32"), 12, "head_dim: 512");
  config.replace(config.find("timeout_ms: 300"), 15, "timeout_ms: 3000");
  std::string writer = config, reader = config;
  writer.replace(writer.find("host_blocks: 1024"), 17, "host_blocks: 2560");
  reader.replace(reader.find("host_blocks: 1024"), 17, "host_blocks: 3072");  // No watermark drops the prefix.
  Host w(writer), r(reader);
  w.Start();
  r.Start();
  const auto tokens = Tokens(21, 2048);
  CommitLongChain(w.c(), "chat", tokens);
  ASSERT_TRUE(w.WaitForStat("store.redis.put_blocks", 2048, 60s));
  // Once the fetch verified some blocks, Redis stops answering until past the budget
  // (so that the budget ends mid-fetch however fast Redis reads here).
  std::unique_ptr<Client> watcher = r.NewClient();
  ASSERT_NE(watcher, nullptr);
  std::atomic<bool> paused{false};
  std::thread pause([&] {
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until) {
      auto st = watcher->Stats();
      if (!st.ok()) return;
      bool some = false;
      for (const auto& [k, v] : *st) some = some || (k == "store.redis.hit_blocks" && v > 0);
      if (some) {
        redis_->Pause();
        paused = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(kBudgetMs + 150));  // Past the budget.
        redis_->Resume();
        return;
      }
    }
  });
  // Leased where they lie: the prefix is longer than the GPU tier.
  const size_t first = r.VerifiedHits("chat", tokens, Promote::kNo);
  pause.join();
  EXPECT_TRUE(paused) << "the fetch verified blocks while the Acquire waited";
  EXPECT_GT(first, 0u) << "the first Acquire gets the prefix verified by the budget (it got none)";
  EXPECT_LT(first, 2048u) << "Redis was paused mid-fetch, past the budget";
  ASSERT_TRUE(r.WaitForStat("store_fetches_landed", 1));
  auto st = r.Stats();
  EXPECT_EQ(st.at("store_fetch_timeouts"), 1);
  EXPECT_EQ(st.at("store_fetch_ready_blocks"), first);
  EXPECT_EQ(st.at("store_fetch_landed_blocks"), 2048 - first) << "the rest, from where the ready prefix ended";
  EXPECT_EQ(r.VerifiedHits("chat", tokens, Promote::kNo), 2048u) << "the whole prefix, from the host tier";
  st = r.Stats();
  EXPECT_EQ(st.at("store_fetches"), 1) << "the stores were asked once";
  EXPECT_EQ(st.at("store.redis.hit_blocks"), 2048) << "each block read once";
  EXPECT_EQ(st.at("store_hit_tokens"), 2048 * 16);
}

// One store I/O thread served fetches whole, oldest first: a tenant looping
// Acquire on a long prefix held only in Redis kept it busy with fetches of
// 256 MiB, and another tenant's fetch of 8 blocks waited behind each, past
// its budget (it got nothing). Now the tenants' fetches take turns a chunk
// (4 MiB) each. Latency is printed for the report, not asserted: every
// victim Acquire gets its blocks, quiet or not.
TEST_F(RemoteTierTest, ATenantLoopingOnALongPrefixInTheStoresDoesNotStarveAnotherTenantsFetches) {
  // 128 KiB blocks: tenant A's 2,048-block prefix is 256 MiB (stores.max_fetch_bytes).
  // A budget of kSlowFetchBudgetMs (50 ms; more in sanitizer builds): A's fetches (about 100 ms
  // here) outlast it, a chunk of them (2 ms) does not.
  std::string config = RemoteConfig({redis_->address()}, false, kSlowFetchBudgetMs);
  config.replace(config.find("head_dim: 32"), 12, "head_dim: 512");
  // Room in the host tiers for A's prefix and B's: the victim's blocks are never short of a slot.
  std::string writer = config, reader = config;
  writer.replace(writer.find("host_blocks: 1024"), 17, "host_blocks: 2560");
  reader.replace(reader.find("host_blocks: 1024"), 17, "host_blocks: 3072");
  Host w(writer), r(reader);
  w.Start();
  r.Start();
  const auto a_tokens = Tokens(31, 2048), b_tokens = Tokens(32, 8);
  WriteThroughAsTenants(w, a_tokens, b_tokens);
  std::unique_ptr<Client> a = r.NewClient("a"), b = r.NewClient("b");
  ASSERT_TRUE(a && b);
  // Tenant A, while `loaded`: its prefix, then evicts it, so each lands from Redis anew.
  std::atomic<bool> loaded{false}, stop{false};
  std::thread attacker([&] {
    while (!stop) {
      if (!loaded) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      { auto lease = a->Acquire("a", a_tokens, Promote::kNo); }
      (void)a->Evict("a");
      std::this_thread::sleep_for(1ms);
    }
  });
  std::vector<double> quiet_ms, loaded_ms;
  size_t b_short = 0;
  for (int round = 0; round < 6; ++round) {
    const bool load = round % 2 == 1;
    loaded = load;
    // A loaded round starts once A's fetch is under way; a quiet one once A's last fetch is over.
    std::this_thread::sleep_for(load ? 200ms : 1500ms);
    for (int i = 0; i < 10; ++i) {
      const auto t0 = Clock::now();
      const size_t got = VerifiedHitsOf(*b, "b", b_tokens);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      (load ? loaded_ms : quiet_ms).push_back(ms);
      if (got != 8) ++b_short;
      EXPECT_EQ(got, 8u) << (load ? "under A's load" : "quiet") << ", round " << round << ", " << ms << " ms";
      (void)b->Evict("b");  // Cold again: the next Acquire fetches from Redis.
    }
  }
  loaded = false;
  stop = true;
  attacker.join();
  auto p50 = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const auto st = r.Stats();
  std::printf("victim store-hit Acquire of 8 blocks: p50 quiet %.2f ms, under a looping tenant %.2f ms (%zu samples each); "
              "%zu short; store.redis.fetched_bytes %.0f MiB; A's timeouts %.0f, landed %.0f\n",
              p50(quiet_ms), p50(loaded_ms), quiet_ms.size(), b_short, st.at("store.redis.fetched_bytes") / (1 << 20),
              st.at("store_fetch_timeouts"), st.at("store_fetches_landed"));
  EXPECT_GE(st.at("store_fetch_timeouts"), 1) << "A's fetches outlasted the budget: the load was real";
}

// A tenant that evicts and refetches its prefix in a loop fetches as fast as
// the store goes while it is alone; once another tenant has a client
// connected, it asks for at most stores.tenant_fetch_bytes_per_second (a burst
// of max_fetch_bytes), and what that does not cover is not fetched (counted);
// the other tenant's own fetches have their own budget.
TEST_F(RemoteTierTest, ATenantRefetchingInALoopIsHeldToItsFetchBudgetWhileAnotherIsConnected) {
  // 8 KiB blocks: a burst of 1 MiB is 128 blocks, 64 KiB a second is 8.
  const std::string config = RemoteConfig({redis_->address()}, false, 2000,
                                          "  max_fetch_bytes: 1MiB\n  tenant_fetch_bytes_per_second: 64KiB\n");
  Host w(config), r(config);
  w.Start();
  r.Start();
  const auto a_tokens = Tokens(41, 64), b_tokens = Tokens(42, 8);
  WriteThroughAsTenants(w, a_tokens, b_tokens);
  std::unique_ptr<Client> a = r.NewClient("a");
  ASSERT_TRUE(a);
  r.Disconnect();  // Host r's own client (tenant "") goes: tenant a is alone.
  std::this_thread::sleep_for(100ms);
  auto refetch = [&](int times) {
    size_t got = 0;
    for (int i = 0; i < times; ++i) {
      got += VerifiedHitsOf(*a, "a", a_tokens, Promote::kNo);
      (void)a->Evict("a");
    }
    return got;
  };
  EXPECT_EQ(refetch(6), 6u * 64) << "alone, a tenant fetches as fast as the store goes";
  auto stat = [&](const char* name) {
    auto st = a->Stats();
    EXPECT_TRUE(st.ok());
    for (const auto& [k, v] : *st) {
      if (k == name) return v;
    }
    return -1.0;
  };
  EXPECT_EQ(stat("store_fetch_throttled_blocks"), 0);

  std::unique_ptr<Client> b = r.NewClient("b");
  ASSERT_TRUE(b);
  const auto start = Clock::now();
  const size_t loaded = refetch(10);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("  10 refetches of 64 blocks with another tenant connected: %zu blocks in %.2f s\n", loaded, took);
  EXPECT_LE(loaded, 128 + static_cast<size_t>(took * 8) + 1) << "the burst and 8 blocks a second";
  EXPECT_GE(loaded, 128u) << "the burst is fetched";
  EXPECT_GE(stat("store_fetch_throttled_blocks"), 10 * 64 - static_cast<double>(loaded) - 1);
  EXPECT_EQ(VerifiedHitsOf(*b, "b", b_tokens, Promote::kNo), 8u) << "b's fetches have their own budget";

  b.reset();
  std::this_thread::sleep_for(100ms);  // b's Disconnect is handled.
  EXPECT_EQ(refetch(2), 2u * 64) << "alone again: no limit";
}

TEST_F(RemoteTierTest, RedisDownCostsABoundedWaitAndIsUsedAgainWhenItIsBack) {
  Host a(RemoteConfig({redis_->address()}, false)), b(RemoteConfig({redis_->address()}, false));
  a.Start();
  b.Start();
  redis_->Kill(SIGKILL);
  const auto x = Tokens(8, 4);
  a.PutAndDemote("x", x);  // Its writes fail: counted, nothing else.
  ASSERT_TRUE(a.WaitForStat("store.redis.errors", 1));
  const auto t0 = Clock::now();
  EXPECT_EQ(b.VerifiedHits("x", x), 0u);
  EXPECT_LT(Clock::now() - t0, 1500ms) << "a Redis that is down costs at most a timeout";
  EXPECT_GE(b.Stats().at("store.redis.errors"), 1);

  ASSERT_TRUE(redis_->Restart().ok());
  std::this_thread::sleep_for(1100ms);  // The stores' reconnect interval.
  const auto y = Tokens(9, 4);
  a.PutAndDemote("y", y);
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 4));
  EXPECT_EQ(b.VerifiedHits("y", y), 4u);
  // The Redis store's own counters are shown: host A's connection to the restarted server was made anew.
  EXPECT_GE(a.Stats().at("store.redis.reconnects") + a.Stats().at("store.redis.node_errors"), 1);
}

TEST(RemoteClusterTest, HostBContinuesThroughARedisClusterAndAKilledMasterOnlyCostsItsKeysUntilFailover) {
  ASSERT_TRUE(RedisInstalled()) << kRedisRequired;
  auto cluster = RedisCluster::Start(3, 1);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  RedisCluster& rc = **cluster;
  Host a(RemoteConfig(rc.seeds(), true)), b(RemoteConfig(rc.seeds(), true));
  a.Start();
  b.Start();
  const auto x = Tokens(10, 16);
  a.PutAndDemote("x", x);
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 16));
  EXPECT_EQ(b.VerifiedHits("x", x), 16u);

  ASSERT_TRUE(rc.WaitForReplication().ok());
  rc.KillMaster(0);
  // Both hosts go on answering while the master is gone; its keys are misses.
  const auto y = Tokens(11, 16);
  a.PutAndDemote("y", y);
  EXPECT_TRUE(a.WaitForStat("store.redis.errors", 1)) << "the dead master's writes fail, counted";
  const auto t0 = Clock::now();
  const size_t partial = b.VerifiedHits("y", y);
  EXPECT_LE(partial, 16u);
  EXPECT_LT(Clock::now() - t0, 3s);

  ASSERT_TRUE(rc.WaitForFailover().ok());
  std::this_thread::sleep_for(1100ms);  // The stores' reconnect interval.
  const auto z = Tokens(12, 16);
  a.PutAndDemote("z", z);
  // x's and z's batches (y's failed on the dead master's keys: counted as an error).
  ASSERT_TRUE(a.WaitForStat("store.redis.put_blocks", 32));
  // Every block of z is readable through the cluster once the replica took over.
  const auto until = Clock::now() + 10s;
  size_t hits = 0;
  while ((hits = b.VerifiedHits("z", z)) < 16 && Clock::now() < until) {
    b.c().Evict("z");
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(hits, 16u);
}

}  // namespace
}  // namespace kvtier::testing
