// DiskStore against real files: records round trip intact, damage done behind
// the store's back comes out as bytes verification rejects (never a crash),
// the byte cap holds with least recently used files going first, and a
// directory left by a killed writer opens clean.
#include "disk/disk_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "disk/block_file_name.h"
#include "kvtier/stores/block_record.h"

namespace kvtier::stores {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr uint64_t kFingerprint = 0x5eed0f0ddba11ULL;
constexpr size_t kBlockTokens = 16;
constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Block `i` of its own chain (parent null), with a payload of `payload_bytes`
// that depends on i.
struct Block {
  Namespace ns = Namespace::Make(kFingerprint, "tenant-a");
  BlockKey parent;
  std::vector<TokenId> tokens;
  std::vector<std::byte> payload;
  BlockKey key;

  Block(uint64_t i, size_t payload_bytes) : tokens(kBlockTokens), payload(payload_bytes) {
    for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<TokenId>(i * kBlockTokens + t);
    for (size_t b = 0; b < payload.size(); ++b) payload[b] = static_cast<std::byte>((b * 131 + i * 17) >> 3);
    key = ChainKey(parent, ns, tokens);
  }
  std::string Name() const { return StoreKey("kvt:", kFingerprint, key); }
  std::string Encode() const { return EncodeBlockRecord({kFingerprint, key, parent, ns}, tokens, payload); }
  StoreItem Item() const { return {Name(), Encode()}; }
  RecordExpectation Want() const { return {kFingerprint, ns, key, parent, tokens, payload.size()}; }
};

// A fresh directory under /tmp, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const char* base = "/tmp") {
    std::string tmpl = std::string(base) + "/kvtier-disk-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

uint64_t CounterOf(const BlockStore& store, std::string_view name) {
  for (const StoreCounter& c : store.Counters()) {
    if (c.name == name) return c.value;
  }
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

std::vector<std::string> NamesOf(std::span<const Block> blocks) {
  std::vector<std::string> names;
  for (const Block& b : blocks) names.push_back(b.Name());
  return names;
}

bool Holds(BlockStore& store, const std::string& key) {
  auto n = store.Present(std::span<const std::string>(&key, 1));
  return n.ok() && *n == 1;
}

class DiskStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<BlockStore> Open(uint64_t max_bytes = 64 * kMiB, bool direct_io = true) {
    return OpenAt(dir_.path(), max_bytes, direct_io);
  }
  static std::unique_ptr<BlockStore> OpenAt(const std::string& dir, uint64_t max_bytes, bool direct_io = true) {
    auto store = OpenDiskStore({dir, max_bytes, direct_io});
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }
  std::string PathOf(const std::string& key) const { return dir_.path() + "/" + *disk::BlockFileName(key); }

  // The index agrees with the directory: the files and bytes it counts are
  // the block files there, and no temporary file is left.
  void ExpectIndexMatchesDirectory(const BlockStore& store) const {
    uint64_t files = 0, bytes = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_.path())) {
      const std::string name = e.path().filename().string();
      EXPECT_FALSE(disk::IsTempFileName(name)) << name;
      if (name.front() == '.') continue;
      ++files;
      bytes += e.file_size();
    }
    EXPECT_EQ(CounterOf(store, "files"), files);
    EXPECT_EQ(CounterOf(store, "held_bytes"), bytes);
  }

  TempDir dir_;
};

// --- Round trips, in both I/O modes --------------------------------------------------

class DiskStoreIoModeTest : public DiskStoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(DiskStoreIoModeTest, RecordsOfWholeAndOddSizesComeBackIntactAndVerify) {
  auto store = Open(64 * kMiB, GetParam());
  ASSERT_NE(store, nullptr);
  const std::vector<Block> blocks{Block(1, 2 * kMiB), Block(2, 1000), Block(3, 0)};
  std::vector<StoreItem> items;
  items.reserve(blocks.size());
  for (const Block& b : blocks) items.push_back(b.Item());
  ASSERT_TRUE(store->Put(items).ok());

  const std::vector<std::string> names = NamesOf(blocks);
  auto got = store->Get(names);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE((*got)[i].has_value()) << i;
    EXPECT_EQ(*(*got)[i], items[i].value) << i;
    const RecordCheck check = VerifyBlockRecord(*(*got)[i], blocks[i].Want());
    EXPECT_TRUE(check.ok()) << i << ": " << check.reason;
  }
  ExpectIndexMatchesDirectory(*store);
  EXPECT_EQ(CounterOf(*store, "files"), 3u);
  EXPECT_EQ(CounterOf(*store, "io_errors"), 0u);
}

TEST_P(DiskStoreIoModeTest, AReopenedStoreServesWhatTheFirstWrote) {
  const std::vector<Block> blocks{Block(1, 2 * kMiB), Block(2, 1000), Block(3, 4096)};
  {
    auto first = Open(64 * kMiB, GetParam());
    ASSERT_NE(first, nullptr);
    for (const Block& b : blocks) ASSERT_TRUE(first->Put(std::vector<StoreItem>{b.Item()}).ok());
  }
  auto second = Open(64 * kMiB, GetParam());
  ASSERT_NE(second, nullptr);
  ExpectIndexMatchesDirectory(*second);
  const std::vector<std::string> names = NamesOf(blocks);
  EXPECT_EQ(*second->Present(names), blocks.size());
  auto got = second->Get(names);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE((*got)[i].has_value()) << i;
    EXPECT_TRUE(VerifyBlockRecord(*(*got)[i], blocks[i].Want()).ok()) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(IoModes, DiskStoreIoModeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Direct" : "Buffered"; });

TEST_F(DiskStoreTest, DescribeNamesTheDirectoryTheCapAndTheIoMode) {
  {
    auto store = Open(12 * kKiB * kMiB, true);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->kind(), "disk");
    EXPECT_NE(store->Describe().find("disk " + dir_.path() + " (12.0 GiB cap, "), std::string::npos)
        << store->Describe();
  }
  auto buffered = Open(512 * kKiB, false);
  ASSERT_NE(buffered, nullptr);
  EXPECT_EQ(buffered->Describe(), "disk " + dir_.path() + " (512.0 KiB cap, buffered)");
}

// Whether the file system under `dir` opens files with O_DIRECT, asked directly.
bool TakesODirect(const std::string& dir) {
  const std::string path = dir + "/o-direct-check";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  const bool takes = fd >= 0;
  if (takes) ::close(fd);
  ::unlink(path.c_str());
  return takes;
}

// On ext4 (/tmp here) that is O_DIRECT; tmpfs refused it before Linux 6.6 and
// takes it since, so /dev/shm shows the fallback on older kernels only.
TEST_F(DiskStoreTest, DescribeSaysWhetherTheFileSystemTookODirectAndEitherWayWorks) {
  TempDir shm("/dev/shm");
  for (const std::string& dir : {dir_.path(), shm.path()}) {
    auto store = OpenAt(dir, 16 * kMiB, true);
    ASSERT_NE(store, nullptr);
    const Block b(7, 1000);
    ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
    const std::vector<std::string> names{b.Name()};
    auto got = store->Get(names);
    ASSERT_TRUE(got.ok());
    ASSERT_TRUE((*got)[0].has_value());
    EXPECT_TRUE(VerifyBlockRecord(*(*got)[0], b.Want()).ok());
    EXPECT_EQ(CounterOf(*store, "io_errors"), 0u);
    // Said after a write and a read, so a mode dropped on the way would show.
    const std::string mode = TakesODirect(dir) ? "O_DIRECT)" : "buffered: the file system refuses O_DIRECT)";
    EXPECT_NE(store->Describe().find(mode), std::string::npos) << store->Describe();
  }
}

// --- Presence, replacement and counters -------------------------------------------

TEST_F(DiskStoreTest, PresentCountsFromTheFirstKeyAndStopsAtTheFirstMissing) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<Block> blocks{Block(0, 100), Block(1, 100), Block(2, 100), Block(3, 100)};
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{blocks[0].Item(), blocks[1].Item(), blocks[3].Item()}).ok());
  const std::vector<std::string> names = NamesOf(blocks);
  EXPECT_EQ(*store->Present(names), 2u);  // Block 3 is held, but block 2 is not.
  EXPECT_EQ(*store->Present(std::span<const std::string>(names).subspan(3)), 1u);
  EXPECT_EQ(*store->Present(std::span<const std::string>(names).subspan(2)), 0u);
  EXPECT_EQ(*store->Present({}), 0u);
}

TEST_F(DiskStoreTest, APutReplacesTheValueAndItsBytesInTheCount) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string key = Block(1, 0).Name();
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{key, std::string(1000, 'a')}}).ok());
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{{key, std::string(5000, 'b')}}).ok());
  auto got = store->Get(std::span<const std::string>(&key, 1));
  ASSERT_TRUE(got.ok() && (*got)[0].has_value());
  EXPECT_EQ(*(*got)[0], std::string(5000, 'b'));
  EXPECT_EQ(CounterOf(*store, "files"), 1u);
  EXPECT_EQ(CounterOf(*store, "held_bytes"), 5000u);
  EXPECT_EQ(CounterOf(*store, "evicted_files"), 0u);
  ExpectIndexMatchesDirectory(*store);
}

TEST_F(DiskStoreTest, CountersNameTheirGauges) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::set<std::string> gauges, totals;
  for (const StoreCounter& c : store->Counters()) (c.gauge ? gauges : totals).insert(c.name);
  EXPECT_EQ(gauges, (std::set<std::string>{"held_bytes", "files", "down"}));
  EXPECT_EQ(totals, (std::set<std::string>{"evicted_files", "evicted_bytes", "io_errors", "reopens"}));
}

// --- The directory going away ------------------------------------------------------

// Before: a deleted directory failed every write until kvtierd restarted, even
// once it was there again (the store wrote through a descriptor of the
// deleted one).
TEST_F(DiskStoreTest, ADeletedDirectoryIsMadeAgainAndUsedWithinASecond) {
  const std::string d = dir_.path() + "/store";
  auto store = OpenAt(d, kMiB);
  ASSERT_NE(store, nullptr);
  const Block a(1, 100), b(2, 100);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{a.Item()}).ok());
  fs::remove_all(d);
  // Writes fail (counted) until the store looks at its directory again.
  const Status failed = store->Put(std::vector<StoreItem>{b.Item()});
  EXPECT_FALSE(failed.ok());
  EXPECT_GE(CounterOf(*store, "io_errors"), 1u);
  // Within a second or so, the store sees it gone, makes it again (mode 0700) and writes there.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!store->Put(std::vector<StoreItem>{b.Item()}).ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(d + "/" + b.Name())) << "written into the new directory";
  EXPECT_EQ(fs::status(d).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(CounterOf(*store, "reopens"), 1u);
  EXPECT_FALSE(Holds(*store, a.Name())) << "the old directory's block went with it";
  auto got = store->Get(std::vector<std::string>{b.Name()});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE((*got)[0].has_value());
  EXPECT_EQ(*(*got)[0], b.Item().value);
}

// Replaced by an admin (another directory now under the path, with blocks of
// its own): the store indexes what is in the new one.
TEST_F(DiskStoreTest, ADirectoryReplacedUnderTheStoreIsReindexed) {
  const std::string d = dir_.path() + "/store", spare = dir_.path() + "/spare";
  const Block a(1, 100), b(2, 100);
  {
    auto other = OpenAt(spare, kMiB);
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(other->Put(std::vector<StoreItem>{b.Item()}).ok());
  }
  auto store = OpenAt(d, kMiB);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{a.Item()}).ok());
  fs::remove_all(d);
  fs::rename(spare, d);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!Holds(*store, b.Name()) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(Holds(*store, b.Name())) << "the new directory's block is indexed";
  EXPECT_FALSE(Holds(*store, a.Name()));
}

// Before: a directory that could not be used at Open refused kvtierd's start.
// A path under a regular file fails for root too (ENOTDIR; mode bits would not).
TEST_F(DiskStoreTest, WithWaitForDirAnUnusableDirectoryStartsDownAndComesUpWhenFixed) {
  const std::string parent = dir_.path() + "/parent", d = parent + "/store";
  std::ofstream(parent) << "a file where the parent directory should be";
  DiskStoreOptions o{d, kMiB, true};
  EXPECT_EQ(OpenDiskStore(o).status().code(), StatusCode::kUnavailable) << "without wait_for_dir: an error";
  o.wait_for_dir = true;
  auto opened = OpenDiskStore(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  BlockStore& store = **opened;
  EXPECT_NE(DiskStoreDownReason(store).find(d), std::string::npos) << DiskStoreDownReason(store);
  EXPECT_EQ(CounterOf(store, "down"), 1u);
  const Block b(1, 100);
  const Status put = store.Put(std::vector<StoreItem>{b.Item()});
  EXPECT_EQ(put.code(), StatusCode::kUnavailable);
  EXPECT_NE(put.message().find("down"), std::string::npos) << put.message();
  EXPECT_FALSE(store.Present(std::vector<std::string>{b.Name()}).ok());
  fs::remove(parent);
  fs::create_directory(parent);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!store.Put(std::vector<StoreItem>{b.Item()}).ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(Holds(store, b.Name()));
  EXPECT_EQ(CounterOf(store, "down"), 0u);
  EXPECT_EQ(DiskStoreDownReason(store), "");
}

// --- Damage behind the store's back ----------------------------------------------

TEST_F(DiskStoreTest, ATruncatedFileComesBackAsBytesVerificationRejects) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<Block> blocks{Block(1, 2 * kMiB), Block(2, 1000)};
  for (const Block& b : blocks) ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
  fs::resize_file(PathOf(blocks[0].Name()), 1 * kMiB + 123);  // Mid-payload, off a block boundary.
  fs::resize_file(PathOf(blocks[1].Name()), 50);              // Mid-header.
  auto got = store->Get(NamesOf(blocks));
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE((*got)[0].has_value());
  ASSERT_TRUE((*got)[1].has_value());
  EXPECT_EQ((*got)[0]->size(), 1 * kMiB + 123);
  EXPECT_EQ((*got)[1]->size(), 50u);
  EXPECT_EQ(VerifyBlockRecord(*(*got)[0], blocks[0].Want()).fault, RecordFault::kCorrupt);
  EXPECT_EQ(VerifyBlockRecord(*(*got)[1], blocks[1].Want()).fault, RecordFault::kCorrupt);
  ExpectIndexMatchesDirectory(*store);  // The sizes read replaced the sizes written.
}

TEST_F(DiskStoreTest, AFileWithAFlippedPayloadByteComesBackAsBytesVerificationRejects) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const Block b(1, 1000);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
  const std::string path = PathOf(b.Name());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(-10, std::ios::end);
    f.write(&c, 1);
  }
  const std::vector<std::string> names{b.Name()};
  auto got = store->Get(names);
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE((*got)[0].has_value());
  const RecordCheck check = VerifyBlockRecord(*(*got)[0], b.Want());
  EXPECT_EQ(check.fault, RecordFault::kCorrupt) << check.reason;
}

TEST_F(DiskStoreTest, AFileDeletedBehindTheStoresBackIsAMissAndIsForgotten) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<Block> blocks{Block(0, 1000), Block(1, 1000), Block(2, 1000)};
  for (const Block& b : blocks) ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
  ASSERT_TRUE(fs::remove(PathOf(blocks[1].Name())));
  const std::vector<std::string> names = NamesOf(blocks);
  EXPECT_EQ(*store->Present(names), 3u);  // Present trusts the index: it touches no file.
  auto got = store->Get(names);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE((*got)[0].has_value());
  EXPECT_FALSE((*got)[1].has_value());
  EXPECT_TRUE((*got)[2].has_value());
  EXPECT_EQ(*store->Present(names), 1u);
  EXPECT_EQ(CounterOf(*store, "files"), 2u);
  EXPECT_EQ(CounterOf(*store, "io_errors"), 0u);
  ExpectIndexMatchesDirectory(*store);
}

TEST_F(DiskStoreTest, ASymbolicLinkUnderABlockNameIsNeverFollowed) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const Block b(1, 1000);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
  const TempDir outside;
  const std::string secret = outside.path() + "/secret";
  std::ofstream(secret) << "not a block";
  ASSERT_TRUE(fs::remove(PathOf(b.Name())));
  fs::create_symlink(secret, PathOf(b.Name()));
  const std::vector<std::string> names{b.Name()};
  auto got = store->Get(names);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)[0].has_value());
  store.reset();
  auto reopened = Open();  // Not indexed at Open either.
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(*reopened->Present(names), 0u);
  EXPECT_TRUE(fs::exists(secret));
}

// A FIFO under a block's name once blocked the store's I/O thread in open()
// for ever (no writer ever came): every later fetch waited its whole budget.
TEST_F(DiskStoreTest, AFifoUnderABlockNameIsAMissNotAHang) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const Block b(2, 1000), other(3, 1000);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item(), other.Item()}).ok());
  ASSERT_TRUE(fs::remove(PathOf(b.Name())));
  ASSERT_EQ(::mkfifo(PathOf(b.Name()).c_str(), 0600), 0) << std::strerror(errno);
  const std::vector<std::string> names{b.Name(), other.Name()};
  const auto start = std::chrono::steady_clock::now();
  auto got = store->Get(names);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "open() waited for a writer";
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)[0].has_value());
  EXPECT_TRUE((*got)[1].has_value()) << "the rest is read on";
}

// A 1 GiB (sparse) file under a block's name was read whole (763 ms): a fetch
// bounds what it reads by the record size it wants, and fstat says so first.
TEST_F(DiskStoreTest, AFileLargerThanTheRecordAskedForIsRefusedUnread) {
  auto store = Open(uint64_t{4} << 30);
  ASSERT_NE(store, nullptr);
  const Block b(4, 1000), other(5, 1000);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item(), other.Item()}).ok());
  const uint64_t record = b.Encode().size();
  ASSERT_EQ(::truncate(PathOf(b.Name()).c_str(), off_t{1} << 30), 0) << std::strerror(errno);
  const std::vector<std::string> names{b.Name(), other.Name()};
  const auto start = std::chrono::steady_clock::now();
  auto got = store->Get(names, record);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200)) << "read it whole?";
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)[0].has_value());
  EXPECT_TRUE((*got)[1].has_value());
  EXPECT_FALSE(fs::exists(PathOf(b.Name()))) << "no record of ours: evicted";
}

// --- The byte cap ---------------------------------------------------------------------

TEST_F(DiskStoreTest, TheCapHoldsUnderManyPutsAndARecentlyReadKeySurvives) {
  const Block sample(0, 100 * kKiB);
  const uint64_t record = sample.Encode().size();
  const uint64_t cap = 10 * record + record / 2;  // Ten records fit.
  auto store = Open(cap);
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> kept{sample.Name()};
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{sample.Item()}).ok());
  constexpr uint64_t kPuts = 100;
  for (uint64_t i = 1; i <= kPuts; ++i) {
    ASSERT_TRUE(store->Put(std::vector<StoreItem>{Block(i, 100 * kKiB).Item()}).ok()) << i;
    EXPECT_LE(CounterOf(*store, "held_bytes"), cap) << i;
    auto got = store->Get(kept);  // Keeps block 0 the most recently used but one.
    ASSERT_TRUE(got.ok());
    ASSERT_TRUE((*got)[0].has_value()) << "evicted at put " << i;
  }
  EXPECT_EQ(CounterOf(*store, "files"), 10u);
  EXPECT_EQ(CounterOf(*store, "evicted_files"), kPuts + 1 - 10);
  EXPECT_EQ(CounterOf(*store, "evicted_bytes"), (kPuts + 1 - 10) * record);
  EXPECT_FALSE(Holds(*store, Block(1, 0).Name()));  // The oldest unread went first.
  EXPECT_TRUE(Holds(*store, Block(kPuts, 0).Name()));
  ExpectIndexMatchesDirectory(*store);
}

TEST_F(DiskStoreTest, EvictionTakesTheLeastRecentlyUsedFirstAndNamesEachToItsObserver) {
  const std::vector<Block> b{Block(0, 1000), Block(1, 1000), Block(2, 1000), Block(3, 1000)};
  const uint64_t record = b[0].Encode().size();
  auto store = Open(3 * record);
  ASSERT_NE(store, nullptr);
  std::vector<std::string> evicted;
  store->OnEvicted([&](std::string_view key) { evicted.emplace_back(key); });
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(store->Put(std::vector<StoreItem>{b[i].Item()}).ok());
  const std::vector<std::string> first{b[0].Name()};
  ASSERT_TRUE(store->Get(first).ok());  // 0 is now newer than 1 and 2.
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b[3].Item()}).ok());
  EXPECT_TRUE(Holds(*store, b[0].Name()));
  EXPECT_FALSE(Holds(*store, b[1].Name()));
  EXPECT_TRUE(Holds(*store, b[2].Name()));
  EXPECT_TRUE(Holds(*store, b[3].Name()));
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b[2].Item()}).ok());  // Rewriting 2 is a use too.
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b[1].Item()}).ok());
  EXPECT_FALSE(Holds(*store, b[0].Name()));
  EXPECT_TRUE(Holds(*store, b[1].Name()));
  EXPECT_TRUE(Holds(*store, b[2].Name()));
  EXPECT_TRUE(Holds(*store, b[3].Name()));
  EXPECT_EQ(evicted, (std::vector<std::string>{b[1].Name(), b[0].Name()})) << "by key, as they went";
}

TEST_F(DiskStoreTest, AValueLargerThanTheCapIsRefusedAndTheRestOfTheBatchIsStored) {
  auto store = Open(1 * kMiB);
  ASSERT_NE(store, nullptr);
  const Block small1(1, 1000), big(2, 2 * kMiB), small2(3, 1000);
  const Status st = store->Put(std::vector<StoreItem>{small1.Item(), big.Item(), small2.Item()});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("cap of 1.0 MiB (max_bytes)"), std::string::npos) << st.message();
  EXPECT_TRUE(Holds(*store, small1.Name()));
  EXPECT_FALSE(Holds(*store, big.Name()));
  EXPECT_TRUE(Holds(*store, small2.Name()));
  EXPECT_EQ(CounterOf(*store, "evicted_files"), 0u);  // Refused before anything made room for it.
  ExpectIndexMatchesDirectory(*store);
}

// --- Open ---------------------------------------------------------------------------

// Sets the mtime of `path` to `seconds` after the epoch.
void SetMtime(const std::string& path, time_t seconds) {
  const struct timespec times[2] = {{0, UTIME_OMIT}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

TEST_F(DiskStoreTest, ReopeningWithASmallerCapTrimsTheOldestFiles) {
  std::vector<Block> blocks;
  for (uint64_t i = 0; i < 10; ++i) blocks.emplace_back(i, 1000);
  const uint64_t record = blocks[0].Encode().size();
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    // Written newest first; the mtimes say otherwise, and they rule at Open.
    for (size_t i = blocks.size(); i-- > 0;) ASSERT_TRUE(store->Put(std::vector<StoreItem>{blocks[i].Item()}).ok());
  }
  for (size_t i = 0; i < blocks.size(); ++i) SetMtime(PathOf(blocks[i].Name()), 1000000 + static_cast<time_t>(i));
  auto store = Open(4 * record);
  ASSERT_NE(store, nullptr);
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(Holds(*store, blocks[i].Name()), i >= 6) << i;
  EXPECT_EQ(CounterOf(*store, "evicted_files"), 6u);
  EXPECT_EQ(CounterOf(*store, "evicted_bytes"), 6 * record);
  ExpectIndexMatchesDirectory(*store);
}

TEST_F(DiskStoreTest, AReadIsRememberedAcrossARestart) {
  const std::vector<Block> b{Block(0, 1000), Block(1, 1000), Block(2, 1000)};
  const uint64_t record = b[0].Encode().size();
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (const Block& x : b) ASSERT_TRUE(store->Put(std::vector<StoreItem>{x.Item()}).ok());
    for (size_t i = 0; i < b.size(); ++i) SetMtime(PathOf(b[i].Name()), 1000000 + static_cast<time_t>(i));
    const std::vector<std::string> first{b[0].Name()};
    ASSERT_TRUE(store->Get(first).ok());
  }
  auto store = Open(2 * record);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(Holds(*store, b[0].Name()));
  EXPECT_FALSE(Holds(*store, b[1].Name()));
  EXPECT_TRUE(Holds(*store, b[2].Name()));
}

TEST_F(DiskStoreTest, OpenRemovesStrayTempFilesAndSkipsWhatIsNotABlockFile) {
  const Block b(1, 1000);
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
  }
  const std::string d = dir_.path();
  std::ofstream(d + "/.tmp.7") << "half a record";
  std::ofstream(d + "/.tmp." + b.Name() + ".3") << "half a record";
  std::ofstream(d + "/%zz") << "no key has this name";
  std::ofstream(d + "/%2E") << "upper-case hex is never written";
  std::ofstream(d + "/.hidden") << "not ours";
  fs::create_directory(d + "/subdir");
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(fs::exists(d + "/.tmp.7"));
  EXPECT_FALSE(fs::exists(d + "/.tmp." + b.Name() + ".3"));
  EXPECT_TRUE(fs::exists(d + "/%zz"));
  EXPECT_TRUE(fs::exists(d + "/subdir"));
  EXPECT_EQ(CounterOf(*store, "files"), 1u);
  EXPECT_EQ(CounterOf(*store, "held_bytes"), b.Encode().size());
  EXPECT_TRUE(Holds(*store, b.Name()));
}

TEST_F(DiskStoreTest, OpenCreatesAPrivateDirectoryOneLevelDeep) {
  const std::string d = dir_.path() + "/store";
  auto store = OpenAt(d, kMiB);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(fs::status(d).permissions() & fs::perms::all, fs::perms::owner_all);
  const Block b(1, 100);
  ASSERT_TRUE(store->Put(std::vector<StoreItem>{b.Item()}).ok());
  EXPECT_EQ(fs::status(d + "/" + b.Name()).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(OpenDiskStore({dir_.path() + "/a/b", kMiB, true}).status().code(), StatusCode::kUnavailable);
}

TEST_F(DiskStoreTest, OpenRefusesBadOptionsAndPathsItCannotUse) {
  EXPECT_EQ(OpenDiskStore({"", kMiB, true}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenDiskStore({dir_.path(), 0, true}).status().code(), StatusCode::kInvalidArgument);
  const std::string file = dir_.path() + "/a-file";
  std::ofstream(file) << "x";
  EXPECT_EQ(OpenDiskStore({file, kMiB, true}).status().code(), StatusCode::kUnavailable);
}

TEST_F(DiskStoreTest, ASecondStoreOnTheSameDirectoryIsRefusedWhileTheFirstIsOpen) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  auto second = OpenDiskStore({dir_.path(), kMiB, true});
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status().message();
  first.reset();
  EXPECT_NE(Open(), nullptr);
}

TEST_F(DiskStoreTest, OpeningThousandsOfFilesIndexesThemAllWithoutReadingThem) {
  constexpr int kFiles = 2000;
  for (int i = 0; i < kFiles; ++i) {
    const std::string path = dir_.path() + "/kvt:" + std::to_string(i);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::write(fd, "0123456789", 10), 10);
    ::close(fd);
  }
  const auto started = std::chrono::steady_clock::now();
  auto store = Open();
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(CounterOf(*store, "files"), static_cast<uint64_t>(kFiles));
  EXPECT_EQ(CounterOf(*store, "held_bytes"), 10u * kFiles);
  EXPECT_LT(took, 5s);  // A stat per file (100k take ~0.3 s on ext4): far under this even when loaded.
}

// --- Keys ---------------------------------------------------------------------------

TEST(BlockFileNameTest, StoreKeysAreTheirOwnNamesAndEveryOtherKeyIsEncodedReversibly) {
  const std::string store_key = StoreKey("kvt:", kFingerprint, BlockKey{1, 2});
  EXPECT_EQ(disk::BlockFileName(store_key), store_key);
  for (const std::string& key : {std::string("../x"), std::string("a/b"), std::string(".hidden"), std::string(),
                                 std::string("%2e"), std::string("sp ace"), std::string("nul\0byte", 8)}) {
    const std::optional<std::string> name = disk::BlockFileName(key);
    ASSERT_TRUE(name.has_value()) << key;
    EXPECT_EQ(name->find('/'), std::string::npos) << *name;
    EXPECT_NE(name->front(), '.') << *name;
    EXPECT_EQ(disk::KeyOfBlockFileName(*name), key) << *name;
  }
  EXPECT_FALSE(disk::KeyOfBlockFileName("%61").has_value());  // "a" would be its own name.
  EXPECT_FALSE(disk::KeyOfBlockFileName("%6").has_value());
  EXPECT_FALSE(disk::KeyOfBlockFileName(".lock").has_value());
  EXPECT_FALSE(disk::KeyOfBlockFileName(".tmp.1").has_value());
  EXPECT_EQ(disk::BlockFileName(std::string(255, 'a')), std::string(255, 'a'));
  EXPECT_FALSE(disk::BlockFileName(std::string(256, 'a')).has_value());
  EXPECT_FALSE(disk::BlockFileName(std::string(128, '/')).has_value());
}

TEST_F(DiskStoreTest, KeysWithOddCharactersAreStoredSafelyInsideTheDirectory) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys{"../escape",
                                      "a/b/c",
                                      "/etc/passwd",
                                      ".hidden",
                                      "",
                                      ".",
                                      "..",
                                      "%2e",
                                      "ü",
                                      "tab\there",
                                      std::string("nul\0byte", 8),
                                      std::string(255, 'k')};
  std::vector<StoreItem> items;
  for (size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], "value " + std::to_string(i)});
  ASSERT_TRUE(store->Put(items).ok());
  EXPECT_EQ(*store->Present(keys), keys.size());
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE((*got)[i].has_value()) << i;
    EXPECT_EQ(*(*got)[i], items[i].value) << i;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir_.path()).parent_path() / "escape"));
  size_t files = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_.path())) {
    EXPECT_TRUE(e.is_regular_file()) << e.path();
    if (e.path().filename().string().front() != '.') ++files;
  }
  EXPECT_EQ(files, keys.size());
  store.reset();
  auto reopened = Open();  // The encoded names index back to the same keys.
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(*reopened->Present(keys), keys.size());
}

TEST_F(DiskStoreTest, AKeyTooLongForAFileNameIsRefusedAndNeverPresent) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> keys{std::string(200, '/')};
  const Status st = store->Put(std::vector<StoreItem>{{keys[0], "v"}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_EQ(*store->Present(keys), 0u);
  auto got = store->Get(keys);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)[0].has_value());
}

// --- Crashes ------------------------------------------------------------------------

TEST_F(DiskStoreTest, AWriterKilledInTheMiddleOfPutsLeavesADirectoryThatOpensAndServesWholeRecords) {
  constexpr uint64_t kCap = 8 * kMiB;  // Small enough that the writer evicts as it goes.
  auto size_of = [](uint64_t i) { return 64 * kKiB + (i % 7) * 1000; };
  // How far the writer got: it bumps this before each put.
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* started = new (shared) std::atomic<uint64_t>(0);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    auto store = OpenDiskStore({dir_.path(), kCap, true});
    if (!store.ok()) ::_exit(2);
    for (uint64_t i = 0;; ++i) {
      started->store(i + 1);
      if (!(*store)->Put(std::vector<StoreItem>{Block(i, size_of(i)).Item()}).ok()) ::_exit(3);
      if (i == 0 && ::write(ready[1], "r", 1) != 1) ::_exit(4);
    }
  }
  ::close(ready[1]);
  char c = 0;
  const bool writing = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  if (writing) std::this_thread::sleep_for(50ms);
  ::kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(writing) << "the writer failed with status " << wstatus;
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;
  const uint64_t attempted = started->load();
  ::munmap(shared, 4096);

  auto store = Open(kCap);
  ASSERT_NE(store, nullptr);
  ExpectIndexMatchesDirectory(*store);  // Includes: no temporary file survived Open.
  std::vector<Block> blocks;
  for (uint64_t i = 0; i < attempted; ++i) blocks.emplace_back(i, size_of(i));
  auto got = store->Get(NamesOf(blocks));
  ASSERT_TRUE(got.ok());
  size_t whole = 0, rejected = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!(*got)[i]) continue;
    const RecordCheck check = VerifyBlockRecord(*(*got)[i], blocks[i].Want());
    (check.ok() ? whole : rejected)++;
  }
  // A killed process loses nothing it renamed into place: every file under a
  // block's name is whole (after a power loss some could be rejected instead).
  EXPECT_EQ(rejected, 0u);
  EXPECT_GE(whole, 1u);
  EXPECT_EQ(whole, CounterOf(*store, "files"));
  EXPECT_LE(CounterOf(*store, "held_bytes"), kCap);
  std::printf("[          ] writer started %llu puts before the kill; %zu whole records remain\n",
              static_cast<unsigned long long>(attempted), whole);
}

}  // namespace
}  // namespace kvtier::stores
