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

class DiskStore final : public BlockStore {
 public:
  DiskStore(const DiskStoreOptions& options, UniqueFd dir_fd, UniqueFd lock_fd)
      : options_(options),
        dir_fd_(std::move(dir_fd)),
        lock_fd_(std::move(lock_fd)),
        io_(dir_fd_.get(), options.direct_io) {}

  // Indexes the directory (removing temporary files), settles the I/O mode
  // and trims what is found to the cap.
  Status Load();

  std::string_view kind() const override { return "disk"; }
  std::string Describe() const override;
  Result<size_t> Present(std::span<const std::string> keys) override;
  Result<std::vector<std::optional<StoreValue>>> Get(std::span<const std::string> keys,
                                                     uint64_t max_value_bytes) override;
  Status Put(std::span<const StoreItem> items) override;
  std::vector<StoreCounter> Counters() const override;
  void OnEvicted(std::function<void(std::string_view key)> evicted) override { evicted_ = std::move(evicted); }

 private:
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
  UniqueFd dir_fd_;
  UniqueFd lock_fd_;  // flock()ed for the store's life.
  BlockFileIo io_;
  disk::FileIndex index_;
  uint64_t next_temp_ = 0;
  std::function<void(std::string_view key)> evicted_;  // OnEvicted's.

  std::atomic<uint64_t> held_bytes_{0}, files_{0}, evicted_files_{0}, evicted_bytes_{0}, io_errors_{0};
};

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
  return "disk " + options_.dir + " (" + FormatBytes(options_.max_bytes) + " cap, " + mode + ")";
}

Result<size_t> DiskStore::Present(std::span<const std::string> keys) {
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
  return out;
}

}  // namespace

Result<std::unique_ptr<BlockStore>> OpenDiskStore(const DiskStoreOptions& options) {
  if (options.dir.empty()) return InvalidArgument("disk store: no directory given");
  if (options.max_bytes == 0) return InvalidArgument("disk store " + options.dir + ": max_bytes must be > 0");
  if (::mkdir(options.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Unavailable("disk store: cannot create directory '" + options.dir + "': " + ErrnoText(errno));
  }
  UniqueFd dir_fd(::open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) return Unavailable("disk store: cannot open directory '" + options.dir + "': " + ErrnoText(errno));
  UniqueFd lock_fd(::openat(dir_fd.get(), kLockFileName, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock_fd) return Unavailable("disk store: cannot create a lock in '" + options.dir + "': " + ErrnoText(errno));
  if (::flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Unavailable("disk store: '" + options.dir + "' is in use by another store (another kvtierd?)");
    }
    return Unavailable("disk store: cannot lock '" + options.dir + "': " + ErrnoText(errno));
  }
  auto store = std::make_unique<DiskStore>(options, std::move(dir_fd), std::move(lock_fd));
  KVTIER_RETURN_IF_ERROR(store->Load());
  return std::unique_ptr<BlockStore>(std::move(store));
}

}  // namespace kvtier::stores
