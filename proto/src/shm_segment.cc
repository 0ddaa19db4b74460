#include "kvtier/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kvtier {
namespace {

Status Errno(const std::string& what, const std::string& name) {
  const int err = errno;
  const StatusCode code = err == ENOENT   ? StatusCode::kNotFound
                          : err == EEXIST ? StatusCode::kAlreadyExists
                          : err == EACCES || err == EPERM ? StatusCode::kPermissionDenied
                          : err == ENOMEM || err == ENOSPC ? StatusCode::kResourceExhausted
                                                           : StatusCode::kInternal;
  return {code, what + " '" + name + "': " + std::strerror(err)};
}

}  // namespace

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      name_(std::move(other.name_)),
      owner_(std::exchange(other.owner_, false)),
      share_fd_(std::exchange(other.share_fd_, -1)),
      file_owner_(std::exchange(other.file_owner_, static_cast<uid_t>(-1))),
      allocated_bytes_(std::exchange(other.allocated_bytes_, 0)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    owner_ = std::exchange(other.owner_, false);
    share_fd_ = std::exchange(other.share_fd_, -1);
    file_owner_ = std::exchange(other.file_owner_, static_cast<uid_t>(-1));
    allocated_bytes_ = std::exchange(other.allocated_bytes_, 0);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_ && !name_.empty()) shm_unlink(name_.c_str());
  if (share_fd_ >= 0) close(share_fd_);
  share_fd_ = -1;
  file_owner_ = static_cast<uid_t>(-1);
  allocated_bytes_ = 0;
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

Result<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes, const CreateOptions& options) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 250) {
    return InvalidArgument("shared-memory name '" + name + "' must be '/' followed by up to 249 non-'/' characters");
  }
  if (bytes == 0) return InvalidArgument("shared-memory segment '" + name + "' of 0 bytes");
  if (options.replace_existing) RemoveIfOwned(name);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, options.mode);
  if (fd < 0) return Errno("shm_open", name);
  // shm_open applies the umask; the caller's mode is what it asked for. The
  // group first: fchown may clear mode bits, and a failure leaves the segment
  // to its owner alone, never wider.
  if (options.group != static_cast<gid_t>(-1) && fchown(fd, static_cast<uid_t>(-1), options.group) != 0) {
    Status st = Errno("fchown to group " + std::to_string(options.group), name);
    close(fd);
    shm_unlink(name.c_str());
    return st;
  }
  if (fchmod(fd, options.mode) != 0) {
    Status st = Errno("fchmod", name);
    close(fd);
    shm_unlink(name.c_str());
    return st;
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status st = Errno("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    return st;
  }
  const int flags = MAP_SHARED | (options.populate ? MAP_POPULATE : 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    Status st = Errno("mmap", name);
    shm_unlink(name.c_str());
    return st;
  }
  ShmSegment seg;
  seg.data_ = static_cast<std::byte*>(p);
  seg.size_ = bytes;
  seg.name_ = name;
  seg.owner_ = true;
  seg.file_owner_ = geteuid();
  seg.share_fd_ = shm_open(name.c_str(), O_RDONLY, 0);  // What clients get: they cannot write or resize through it.
  if (seg.share_fd_ < 0) return Errno("shm_open (read-only)", name);
  return seg;
}

Result<ShmSegment> ShmSegment::Open(const std::string& name, bool writable, bool populate) {
  const int fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return Errno("shm_open", name);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = Errno("fstat", name);
    close(fd);
    return s;
  }
  if (st.st_size <= 0) {
    close(fd);
    return Corrupt("shared-memory segment '" + name + "' is empty");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                 MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Errno("mmap", name);
  ShmSegment seg;
  seg.data_ = static_cast<std::byte*>(p);
  seg.size_ = bytes;
  seg.name_ = name;
  seg.owner_ = false;
  seg.file_owner_ = st.st_uid;
  seg.share_fd_ = shm_open(name.c_str(), O_RDONLY, 0);
  if (seg.share_fd_ < 0) return Errno("shm_open (read-only)", name);
  return seg;
}

bool ShmSegment::RemoveIfOwned(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) return false;
  struct stat st {};
  if (lstat(("/dev/shm" + name).c_str(), &st) != 0 || st.st_uid != geteuid()) return false;
  return shm_unlink(name.c_str()) == 0;
}

Result<ShmSegment> ShmSegment::CreateSealed(const std::string& label, size_t bytes, Sharing sharing, bool populate) {
  if (bytes == 0) return InvalidArgument("shared-memory segment '" + label + "' of 0 bytes");
  const int fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create", label);
  auto fail = [&](const char* what) {
    Status st = Errno(what, label);
    close(fd);
    return st;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  // After this process's writable mapping exists: F_SEAL_FUTURE_WRITE forbids
  // only later ones (and write(2), and punching holes).
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (sharing == Sharing::kReadOnly) seals |= F_SEAL_FUTURE_WRITE;
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    Status st = Errno("sealing (F_ADD_SEALS)", label);
    munmap(p, bytes);
    close(fd);
    return st;
  }
  ShmSegment seg;
  seg.data_ = static_cast<std::byte*>(p);
  seg.size_ = bytes;
  seg.name_ = "memfd:" + label;
  seg.share_fd_ = fd;
  return seg;
}

Result<ShmSegment> ShmSegment::MapPassed(int fd, bool writable, size_t min_bytes, const std::string& label) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return Errno("fstat", label);
  if (!S_ISREG(st.st_mode)) return Corrupt("segment '" + label + "': the descriptor passed is not a memory file");
  const int seals = fcntl(fd, F_GET_SEALS);
  const bool cannot_shrink = seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  if (!cannot_shrink && (st.st_mode & 0022) != 0) {
    return Corrupt("segment '" + label + "' could be truncated by others (neither sealed nor owner-only)");
  }
  if (st.st_size <= 0 || static_cast<size_t>(st.st_size) < min_bytes) {
    return Corrupt("segment '" + label + "' holds " + std::to_string(st.st_size) + " bytes, fewer than the " +
                   std::to_string(min_bytes) + " announced");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Errno(writable ? "mmap (read-write)" : "mmap", label);
  ShmSegment seg;
  seg.data_ = static_cast<std::byte*>(p);
  seg.size_ = bytes;
  seg.name_ = label;
  seg.allocated_bytes_ = static_cast<size_t>(st.st_blocks) * 512;
  return seg;
}

}  // namespace kvtier
