// ShmSegment: one shared-memory segment mapped into this process.
//
// The daemon creates its segments sealed and nameless (memfd): nothing in
// /dev/shm to squat, truncate or open, and the only way in is a descriptor the
// daemon passes over its socket (SCM_RIGHTS). Seals keep every descriptor from
// shrinking or growing the segment (no SIGBUS in the daemon) and, for segments
// clients only read, from ever mapping it writable. Only the segments that must
// outlive the daemon (warm restart) have a name, owner-only. Move-only; the
// mapping ends with the object.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "kvtier/status.h"

namespace kvtier {

class ShmSegment {
 public:
  struct CreateOptions {
    mode_t mode = 0600;             // Set with fchmod after creation: the umask does not apply.
    gid_t group = static_cast<gid_t>(-1);  // With a group: fchown to it (the owner stays).
    bool replace_existing = false;  // Unlink a segment of that name first (stale after a crash).
    bool populate = true;           // Fault every page in now, not on the first copy.
  };

  // What the processes the daemon shares a sealed segment with may do to it.
  enum class Sharing {
    kReadOnly,   // Map it read-only: F_SEAL_FUTURE_WRITE (the creator's own mapping stays writable).
    kReadWrite,  // Read and write its bytes; never resize it.
  };

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Creates and maps `name` ("/kvtier.x.y") read-write; the object owns it and
  // unlinks it when destroyed. kAlreadyExists if it exists and !replace_existing.
  static Result<ShmSegment> Create(const std::string& name, size_t bytes, const CreateOptions& options);
  static Result<ShmSegment> Create(const std::string& name, size_t bytes) {
    return Create(name, bytes, CreateOptions{});
  }
  // Creates a nameless segment (memfd) of `bytes`, mapped read-write here, and
  // seals it against shrinking, growing and further sealing, and with
  // kReadOnly against writable mappings made after now. `label` names it in
  // /proc and errors ("kvtier.it.index"). share_fd() is what to pass.
  static Result<ShmSegment> CreateSealed(const std::string& label, size_t bytes, Sharing sharing,
                                         bool populate = true);
  // Maps a descriptor another process passed (the caller keeps owning `fd`),
  // whole; read-only unless `writable`. kCorrupt unless it is at least
  // `min_bytes` long and nobody but its owner can shrink it under this process
  // (SIGBUS): sealed against shrinking, or a file only its owner may write.
  static Result<ShmSegment> MapPassed(int fd, bool writable, size_t min_bytes, const std::string& label);
  // Maps an existing segment, whole; read-only unless `writable`; with
  // `populate`, every page is mapped now (one call instead of a fault per page).
  // Never unlinks it.
  static Result<ShmSegment> Open(const std::string& name, bool writable, bool populate = false);

  // Unlinks the named segment `name` if this uid owns it: a name in /dev/shm
  // another uid made (squatted) is not ours to remove, even where we could (as
  // root). True if it was removed.
  static bool RemoveIfOwned(const std::string& name);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }
  bool owner() const { return owner_; }
  // The descriptor to pass to other processes (SCM_RIGHTS): the sealed memfd,
  // or a read-only descriptor of a named segment this process created or
  // opened; -1 for a segment mapped from a passed descriptor. Closed with the object.
  int share_fd() const { return share_fd_; }
  // For a segment mapped from a passed descriptor: the bytes of memory its file
  // had taken when it was mapped (its pages written or faulted in by anyone);
  // 0 otherwise.
  size_t allocated_bytes() const { return allocated_bytes_; }
  // The uid owning a named segment this process opened (-1 otherwise).
  uid_t file_owner() const { return file_owner_; }
  // Owner only: keep the segment after this object dies (a warm restart adopts it).
  void Release() { owner_ = false; }

 private:
  void Reset();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
  int share_fd_ = -1;
  uid_t file_owner_ = static_cast<uid_t>(-1);
  size_t allocated_bytes_ = 0;
};

}  // namespace kvtier
