// Whole-file reads and writes for the disk store (block_file_io.h).
#include "disk/block_file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kvtier::stores::disk {
namespace {

size_t RoundUp(size_t n) { return (n + kDirectIoAlign - 1) / kDirectIoAlign * kDirectIoAlign; }

int OpenFlags(bool direct) { return O_CLOEXEC | O_NOFOLLOW | (direct ? O_DIRECT : 0); }

// Writes all of buf at offset 0: 0 or an errno.
int WriteAll(int fd, const std::byte* buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, buf + done, n - done, static_cast<off_t>(done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    done += static_cast<size_t>(w);
  }
  return 0;
}

// Reads from offset 0 into buf until n bytes or the end of the file; returns
// the bytes read, or -errno. With O_DIRECT a read that stops short of a block
// boundary has reached the end of the file.
ssize_t ReadUpTo(int fd, std::byte* buf, size_t n, bool direct) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
    if (direct && got % kDirectIoAlign != 0) break;
  }
  return static_cast<ssize_t>(got);
}

int CloseChecked(UniqueFd& fd) {
  const int rc = ::close(fd.release());
  return rc == 0 || errno == EINTR ? 0 : errno;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

std::byte* AlignedBuffer::Reserve(size_t bytes) {
  if (bytes <= size_ && data_ != nullptr) return data_;
  const size_t size = RoundUp(bytes == 0 ? 1 : bytes);
  void* p = nullptr;
  if (::posix_memalign(&p, kDirectIoAlign, size) != 0) return nullptr;
  std::free(data_);
  data_ = static_cast<std::byte*>(p);
  size_ = size;
  return data_;
}

void BlockFileIo::ProbeDirect(const std::string& probe_name) {
  if (!direct()) return;
  const char* name = probe_name.c_str();
  ::unlinkat(dir_fd_, name, 0);
  bool refused = false;
  UniqueFd fd(::openat(dir_fd_, name, O_RDWR | O_CREAT | O_EXCL | OpenFlags(true), 0600));
  if (!fd) {
    refused = errno == EINVAL;
  } else if (std::byte* buf = buffer_.Reserve(kDirectIoAlign); buf != nullptr) {
    std::memset(buf, 0, kDirectIoAlign);
    const int err = WriteAll(fd.get(), buf, kDirectIoAlign);
    const ssize_t got = err == 0 ? ReadUpTo(fd.get(), buf, kDirectIoAlign, true) : 0;
    refused = err == EINVAL || got == -EINVAL;
  }
  fd.reset();
  ::unlinkat(dir_fd_, name, 0);
  if (refused) direct_.store(false, std::memory_order_relaxed);
}

int BlockFileIo::Write(const std::string& temp_name, const std::string& name, std::string_view value) {
  int err = WriteFile(temp_name, value, direct());
  if (err == EINVAL && direct()) {  // The file system refuses O_DIRECT after all.
    ::unlinkat(dir_fd_, temp_name.c_str(), 0);
    direct_.store(false, std::memory_order_relaxed);
    err = WriteFile(temp_name, value, false);
  }
  if (err == 0 && ::renameat(dir_fd_, temp_name.c_str(), dir_fd_, name.c_str()) != 0) err = errno;
  if (err != 0) ::unlinkat(dir_fd_, temp_name.c_str(), 0);
  return err;
}

int BlockFileIo::WriteFile(const std::string& temp_name, std::string_view value, bool direct) {
  UniqueFd fd(::openat(dir_fd_, temp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | OpenFlags(direct), 0600));
  if (!fd) return errno;
  int err = 0;
  if (direct) {
    const size_t padded = RoundUp(value.size());
    std::byte* buf = buffer_.Reserve(padded);
    if (buf == nullptr) return ENOMEM;
    std::memcpy(buf, value.data(), value.size());
    std::memset(buf + value.size(), 0, padded - value.size());
    err = WriteAll(fd.get(), buf, padded);
    if (err == 0 && padded != value.size() && ::ftruncate(fd.get(), static_cast<off_t>(value.size())) != 0) {
      err = errno;
    }
  } else {
    err = WriteAll(fd.get(), reinterpret_cast<const std::byte*>(value.data()), value.size());
  }
  const int close_err = CloseChecked(fd);
  return err != 0 ? err : close_err;
}

int BlockFileIo::Read(const std::string& name, uint64_t max_bytes, StoreValue* out) {
  int err = ReadFile(name, max_bytes, out, direct());
  if (err == EINVAL && direct()) {
    direct_.store(false, std::memory_order_relaxed);
    err = ReadFile(name, max_bytes, out, false);
  }
  return err;
}

int BlockFileIo::ReadFile(const std::string& name, uint64_t max_bytes, StoreValue* out, bool direct) {
  // O_NONBLOCK: a FIFO (or a device) under a block's name opens at once instead
  // of waiting for a writer, and fstat below says it is no block file.
  UniqueFd fd(::openat(dir_fd_, name.c_str(), O_RDONLY | O_NONBLOCK | OpenFlags(direct)));
  if (!fd) return errno == ELOOP ? ENOENT : errno;  // A symbolic link is no block file.
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return ENOENT;
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return EFBIG;
  const auto size = static_cast<size_t>(st.st_size);
  // Read straight into the buffer handed on: aligned (and padded) for O_DIRECT.
  const size_t capacity = direct ? RoundUp(size) : size;
  void* mem = nullptr;
  if (capacity != 0 && ::posix_memalign(&mem, kDirectIoAlign, capacity) != 0) return ENOMEM;
  StoreValue buf = StoreValue::Adopt(static_cast<char*>(mem), capacity);
  const ssize_t got = capacity == 0 ? 0 : ReadUpTo(fd.get(), reinterpret_cast<std::byte*>(mem), capacity, direct);
  if (got < 0) return static_cast<int>(-got);
  buf.Shrink(static_cast<size_t>(got));  // The bytes read: the file may have changed size since fstat.
  *out = std::move(buf);
  // Best effort, and only for a file not marked in the last kMtimeGranularity:
  // each mark is an inode write (a journal entry), and only the next Open's
  // order depends on it.
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  if (now.tv_sec - st.st_mtim.tv_sec >= kMtimeGranularity.count()) {
    const struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    ::futimens(fd.get(), times);
  }
  return 0;
}

}  // namespace kvtier::stores::disk
