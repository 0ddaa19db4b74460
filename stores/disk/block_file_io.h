// BlockFileIo: whole-file reads and writes in the disk store's directory,
// with O_DIRECT while the file system takes it and buffered I/O after it
// refuses (EINVAL, as tmpfs answers), for the rest of the object's life.
//
// O_DIRECT transfers whole blocks of kDirectIoAlign bytes from buffers aligned
// to it: a write sends the value padded with zeros and truncates the file to
// its true length; a read asks for the size rounded up and takes the short
// read at the end of the file. The aligned buffer is kept and reused, so a
// call allocates nothing but the value it returns.
//
// Nothing is fsync'ed: a file is complete once the process that wrote it has
// renamed it, which survives that process's crash but not a power loss.
//
// Thread-safety: none; one caller at a time (direct() may be read from any
// thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/stores/block_store.h"

namespace kvtier::stores::disk {

// The alignment (memory, offsets and lengths) of O_DIRECT transfers: a
// multiple of every logical block size in use (512, 4096).
inline constexpr size_t kDirectIoAlign = 4096;

// An owned file descriptor; closed when it goes.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A growing buffer aligned for O_DIRECT.
// A read marks its file used (its mtime) at most this often.
inline constexpr std::chrono::seconds kMtimeGranularity{60};

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();
  // At least `bytes` of aligned memory (contents unspecified), valid until the
  // next call; nullptr when it cannot be had.
  std::byte* Reserve(size_t bytes);

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class BlockFileIo {
 public:
  // REQUIRES: dir_fd is an open directory that outlives this object.
  BlockFileIo(int dir_fd, bool direct) : dir_fd_(dir_fd), direct_(direct) {}

  // From now on files are in directory `dir_fd` (the store reopened its
  // directory). REQUIRES: as the constructor's.
  void Rebind(int dir_fd) { dir_fd_ = dir_fd; }

  // True while files are read and written with O_DIRECT.
  bool direct() const { return direct_.load(std::memory_order_relaxed); }

  // Writes, reads back and removes a scratch file `probe_name` with O_DIRECT;
  // if the file system refuses, turns to buffered I/O. No-op when !direct().
  void ProbeDirect(const std::string& probe_name);

  // Writes `value` to a new file `temp_name` (mode 0600) and renames it to
  // `name`. Returns 0 or the errno of what failed; on failure nothing is left
  // under temp_name and whatever was under `name` is untouched.
  int Write(const std::string& temp_name, const std::string& name, std::string_view value);

  // Reads file `name` whole into *out (a buffer of its own, read into
  // directly: no copy) and marks it used (sets its mtime, unless that is
  // less than kMtimeGranularity old, which
  // orders the next Open's index). Returns 0 or an errno: ENOENT when there is
  // no regular file of that name, EFBIG when it is over max_bytes long.
  int Read(const std::string& name, uint64_t max_bytes, StoreValue* out);

 private:
  int WriteFile(const std::string& temp_name, std::string_view value, bool direct);
  int ReadFile(const std::string& name, uint64_t max_bytes, StoreValue* out, bool direct);

  int dir_fd_;
  std::atomic<bool> direct_;
  AlignedBuffer buffer_;
};

}  // namespace kvtier::stores::disk
