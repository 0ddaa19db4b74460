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
      owner_(std::exchange(other.owner_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_ && !name_.empty()) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

Result<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes, const CreateOptions& options) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 250) {
    return InvalidArgument("shared-memory name '" + name + "' must be '/' followed by up to 249 non-'/' characters");
  }
  if (bytes == 0) return InvalidArgument("shared-memory segment '" + name + "' of 0 bytes");
  if (options.replace_existing) shm_unlink(name.c_str());
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
  return seg;
}

}  // namespace kvtier
