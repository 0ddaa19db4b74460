// DiskStore: a BlockStore in a local directory (disk_store.h).
#include "disk/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <tuple>

#include "disk/block_file_io.h"
#include "disk/block_file_name.h"
#include "disk/file_index.h"

namespace kvtier::stores {
namespace {

using disk::BlockFileIo;
using disk::UniqueFd;

constexpr const char* kLockFileName = ".lock";
constexpr const char* kProbeFileName = ".tmp.direct-io-probe";

std::string ErrnoText(int err) { return std::strerror(err); }

// "12.0 GiB", "512.0 KiB", "100 bytes".
std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double v = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", v, kUnits[unit]);
  return text;
}

using Clock = std::chrono::steady_clock;

class DiskStore final : public BlockStore {
 public:
  explicit DiskStore(const DiskStoreOptions& options) : options_(options), io_(-1, options.direct_io) {}

  // Opens (creating it one level deep) and locks the directory, then indexes
  // it. kFailedPrecondition when another store holds it, kUnavailable when it
  // cannot be used; the store is down (its reason set) after either.
  Status OpenDir();

  std::string DownReason() const {
    std::lock_guard<std::mutex> lock(down_mu_);
    return down_;
  }

  std::string_view kind() const override { return "disk"; }
  std::string Describe() const override;
  Result<size_t> Present(std::span<const std::string> keys) override;
  Result<std::vector<std::optional<StoreValue>>> Get(std::span<const std::string> keys,
                                                     uint64_t max_value_bytes) override;
  Status Put(std::span<const StoreItem> items) override;
  std::vector<StoreCounter> Counters() const override;
  void OnEvicted(std::function<void(std::string_view key)> evicted) override { evicted_ = std::move(evicted); }

 private:
  // Indexes the directory (removing temporary files), settles the I/O mode
  // and trims what is found to the cap.
  Status Load();
  // Whether the directory can be used now: at most once a kDirRecheckInterval,
  // checks that it is still the one open (else reopens it), or retries it while down.
  bool Usable();
  // The directory at options_.dir is still the one open, and still linked.
  bool StillOurs() const;
  // Down for `why`: the index and descriptors go.
  void GoDown(std::string why);
  Status Down() const { return Unavailable(Where() + "down: " + DownReason()); }
  Status PutOne(const StoreItem& item);
  // Evicts least recently used files until `bytes` more fit under the cap
  // with `name`'s present value replaced. REQUIRES: bytes <= max_bytes.
  void MakeRoom(const std::string& name, uint64_t bytes);
  // Removes file `name` and its index entry; counted as an eviction.
  void Evict(const std::string& name);
  // Drops `name` from the index, removing its file too when `unlink`.
  void Forget(const std::string& name, bool unlink);
  // Copies the index's gauges into the counters.
  void PublishGauges();
  std::string Where() const { return "disk " + options_.dir + ": "; }

  const DiskStoreOptions options_;
  UniqueFd dir_fd_;   // Empty while down.
  UniqueFd lock_fd_;  // flock()ed while the directory is open.
  dev_t dir_dev_ = 0;
  ino_t dir_ino_ = 0;
  Clock::time_point next_check_;  // Usable()'s next look at the directory.
  mutable std::mutex down_mu_;
  std::string down_;  // Why it is down; empty while up. Guarded by down_mu_.
  BlockFileIo io_;
  disk::FileIndex index_;
  uint64_t next_temp_ = 0;
  std::function<void(std::string_view key)> evicted_;  // OnEvicted's.

  std::atomic<uint64_t> held_bytes_{0}, files_{0}, evicted_files_{0}, evicted_bytes_{0}, io_errors_{0};
  std::atomic<uint64_t> down_gauge_{0}, reopens_{0};
};

Status DiskStore::OpenDir() {
  GoDown("not open yet");
  const std::string& path = options_.dir;
  Status st;
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    st = Unavailable("disk store: cannot create directory '" + path + "': " + ErrnoText(errno));
  }
  UniqueFd dir_fd;
  if (st.ok()) {
    dir_fd.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd) st = Unavailable("disk store: cannot open directory '" + path + "': " + ErrnoText(errno));
  }
  UniqueFd lock_fd;
  if (st.ok()) {
    lock_fd.reset(::openat(dir_fd.get(), kLockFileName, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!lock_fd) st = Unavailable("disk store: cannot create a lock in '" + path + "': " + ErrnoText(errno));
  }
  if (st.ok() && ::flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    st = errno == EWOULDBLOCK
             ? FailedPrecondition("disk store: '" + path + "' is in use by another store (another kvtierd?)")
             : Unavailable("disk store: cannot lock '" + path + "': " + ErrnoText(errno));
  }
  struct stat dst {};
  if (st.ok() && ::fstat(dir_fd.get(), &dst) != 0) {
    st = Unavailable("disk store: cannot examine '" + path + "': " + ErrnoText(errno));
  }
  if (st.ok()) {
    dir_fd_ = std::move(dir_fd);
    lock_fd_ = std::move(lock_fd);
    dir_dev_ = dst.st_dev;
    dir_ino_ = dst.st_ino;
    io_.Rebind(dir_fd_.get());
    st = Load();
  }
  if (!st.ok()) {
    GoDown(st.message());
    return st;
  }
  std::lock_guard<std::mutex> lock(down_mu_);
  down_.clear();
  down_gauge_.store(0, std::memory_order_relaxed);
  return st;
}

void DiskStore::GoDown(std::string why) {
  index_ = disk::FileIndex();
  dir_fd_.reset();
  lock_fd_.reset();
  io_.Rebind(-1);
  PublishGauges();
  down_gauge_.store(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(down_mu_);
  down_ = std::move(why);
}

bool DiskStore::StillOurs() const {
  struct stat open_st {}, path_st {};
  return ::fstat(dir_fd_.get(), &open_st) == 0 && open_st.st_nlink > 0 &&
         ::stat(options_.dir.c_str(), &path_st) == 0 && path_st.st_dev == dir_dev_ && path_st.st_ino == dir_ino_;
}

bool DiskStore::Usable() {
  const Clock::time_point now = Clock::now();
  if (now < next_check_) return static_cast<bool>(dir_fd_);
  next_check_ = now + kDirRecheckInterval;
  if (dir_fd_ && StillOurs()) return true;
  // Gone, replaced, or never usable: open the path afresh (a stat, an open and
  // a listing of what is there; once a second at most).
  const bool was_up = static_cast<bool>(dir_fd_);
  if (OpenDir().ok()) {
    reopens_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (was_up) io_errors_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Status DiskStore::Load() {
  struct Found {
    struct timespec mtime;
    std::string name;
    uint64_t bytes;
  };
  std::vector<Found> found;
  UniqueFd list_fd(::openat(dir_fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* dir = list_fd ? ::fdopendir(list_fd.get()) : nullptr;
  if (dir == nullptr) return Unavailable(Where() + "cannot list: " + ErrnoText(errno));
  list_fd.release();  // Now dir's.
  int list_err = 0;
  while (true) {
    errno = 0;
    const struct dirent* e = ::readdir(dir);
    if (e == nullptr) {
      list_err = errno;
      break;
    }
    const std::string_view name = e->d_name;
    if (disk::IsTempFileName(name)) {
      ::unlinkat(dir_fd_.get(), e->d_name, 0);
      continue;
    }
    if (!disk::KeyOfBlockFileName(name)) continue;  // ".", "..", the lock, names no key has.
    if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
    struct stat st {};
    if (::fstatat(dir_fd_.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    found.push_back(Found{st.st_mtim, std::string(name), static_cast<uint64_t>(st.st_size)});
  }
  ::closedir(dir);
  if (list_err != 0) return Unavailable(Where() + "cannot list: " + ErrnoText(list_err));

  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.name) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.name);
  });
  for (const Found& f : found) index_.Put(f.name, f.bytes);  // Oldest first: the last put is the newest.
  while (!index_.empty() && index_.held_bytes() > options_.max_bytes) Evict(index_.Oldest());
  io_.ProbeDirect(kProbeFileName);
  PublishGauges();
  return Status::Ok();
}

std::string DiskStore::Describe() const {
  std::string mode = "O_DIRECT";
  if (!io_.direct()) mode = options_.direct_io ? "buffered: the file system refuses O_DIRECT" : "buffered";
  std::string out = "disk " + options_.dir + " (" + FormatBytes(options_.max_bytes) + " cap, " + mode + ")";
  if (const std::string why = DownReason(); !why.empty()) out += " [down: " + why + "]";
  return out;
}

Result<size_t> DiskStore::Present(std::span<const std::string> keys) {
  if (!Usable()) return Down();
  size_t n = 0;
  for (const std::string& key : keys) {
    const std::optional<std::string> name = disk::BlockFileName(key);
    if (!name || !index_.Contains(*name)) break;
    ++n;
  }
  return n;
}

Result<std::vector<std::optional<StoreValue>>> DiskStore::Get(std::span<const std::string> keys,
                                                             uint64_t max_value_bytes) {
  if (!Usable()) return Down();
  std::vector<std::optional<StoreValue>> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    const std::optional<std::string> name = disk::BlockFileName(key);
    if (!name || !index_.Contains(*name)) {
      out.emplace_back();
      continue;
    }
    StoreValue value;
    const int err = io_.Read(*name, std::min(options_.max_bytes, max_value_bytes), &value);
    if (err == 0) {
      index_.Put(*name, value.size());  // The size read, should the file have changed.
      out.emplace_back(std::move(value));
      continue;
    }
    out.emplace_back();
    if (err == ENOENT) {
      Forget(*name, false);  // Gone behind our back.
    } else if (err == EFBIG) {
      Evict(*name);  // Past the cap or the size asked for (fstat said so; nothing read): no value of ours.
    } else {
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      Forget(*name, true);  // Unreadable: of no use, and its space is counted.
    }
  }
  PublishGauges();
  return out;
}

Status DiskStore::Put(std::span<const StoreItem> items) {
  if (!Usable()) return Down();
  Status first;
  for (const StoreItem& item : items) {
    Status st = PutOne(item);
    if (!st.ok() && first.ok()) first = std::move(st);
  }
  PublishGauges();
  return first;
}

Status DiskStore::PutOne(const StoreItem& item) {
  const std::optional<std::string> name = disk::BlockFileName(item.key);
  if (!name) {
    return InvalidArgument(Where() + "a key of " + std::to_string(item.key.size()) +
                           " bytes is too long for a file name (at most " + std::to_string(disk::kMaxFileNameBytes) +
                           " bytes, encoded)");
  }
  const uint64_t bytes = item.value.size();
  if (bytes > options_.max_bytes) {
    return ResourceExhausted(Where() + "a value of " + FormatBytes(bytes) + " is larger than the store's cap of " +
                             FormatBytes(options_.max_bytes) + " (max_bytes)");
  }
  MakeRoom(*name, bytes);
  const std::string temp = std::string(disk::kTempFilePrefix) + std::to_string(next_temp_++);
  const int err = io_.Write(temp, *name, item.value);
  if (err != 0) {
    io_errors_.fetch_add(1, std::memory_order_relaxed);
    return Unavailable(Where() + "cannot write " + *name + ": " + ErrnoText(err));
  }
  index_.Put(*name, bytes);
  return Status::Ok();
}

void DiskStore::MakeRoom(const std::string& name, uint64_t bytes) {
  index_.Touch(name);  // Never its own victim: it is now the newest.
  const uint64_t replaced = index_.BytesOf(name);
  while (!index_.empty() && index_.Oldest() != name && index_.held_bytes() - replaced + bytes > options_.max_bytes) {
    Evict(index_.Oldest());
  }
}

void DiskStore::Evict(const std::string& name) {
  // NOLINTNEXTLINE(performance-unnecessary-copy-initialization): `name` may be the index's own, which Erase frees.
  const std::string victim = name;
  if (::unlinkat(dir_fd_.get(), victim.c_str(), 0) != 0 && errno != ENOENT) {
    io_errors_.fetch_add(1, std::memory_order_relaxed);
  }
  const uint64_t bytes = index_.Erase(victim);
  evicted_files_.fetch_add(1, std::memory_order_relaxed);
  evicted_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (evicted_) {
    if (const std::optional<std::string> key = disk::KeyOfBlockFileName(victim)) evicted_(*key);
  }
}

void DiskStore::Forget(const std::string& name, bool unlink) {
  if (unlink) ::unlinkat(dir_fd_.get(), name.c_str(), 0);
  index_.Erase(name);
}

void DiskStore::PublishGauges() {
  held_bytes_.store(index_.held_bytes(), std::memory_order_relaxed);
  files_.store(index_.files(), std::memory_order_relaxed);
}

std::vector<StoreCounter> DiskStore::Counters() const {
  std::vector<StoreCounter> out;
  auto add = [&out](const char* name, const std::atomic<uint64_t>& value, bool gauge) {
    out.push_back({name, value.load(std::memory_order_relaxed), gauge});
  };
  add("held_bytes", held_bytes_, true);
  add("files", files_, true);
  add("evicted_files", evicted_files_, false);
  add("evicted_bytes", evicted_bytes_, false);
  add("io_errors", io_errors_, false);
  add("down", down_gauge_, true);
  add("reopens", reopens_, false);
  return out;
}

}  // namespace

Result<std::unique_ptr<BlockStore>> OpenDiskStore(const DiskStoreOptions& options) {
  if (options.dir.empty()) return InvalidArgument("disk store: no directory given");
  if (options.max_bytes == 0) return InvalidArgument("disk store " + options.dir + ": max_bytes must be > 0");
  auto store = std::make_unique<DiskStore>(options);
  Status st = store->OpenDir();
  if (st.code() == StatusCode::kFailedPrecondition) return Unavailable(st.message());  // Another store's: always an error.
  if (!st.ok() && !options.wait_for_dir) return st;
  return std::unique_ptr<BlockStore>(std::move(store));
}

std::string DiskStoreDownReason(const BlockStore& store) {
  const auto* disk = dynamic_cast<const DiskStore*>(&store);
  return disk != nullptr ? disk->DownReason() : std::string();
}

}  // namespace kvtier::stores
