// ShmSegment: one POSIX shared-memory segment mapped into this process.
//
// The daemon creates segments (pools, index, fences) and unlinks them when it
// owns them; clients open them by name. Move-only; the mapping ends with the object.
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
  // Maps an existing segment, whole; read-only unless `writable`; with
  // `populate`, every page is mapped now (one call instead of a fault per page).
  // Never unlinks it.
  static Result<ShmSegment> Open(const std::string& name, bool writable, bool populate = false);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }
  bool owner() const { return owner_; }
  // Owner only: keep the segment after this object dies (a warm restart adopts it).
  void Release() { owner_ = false; }

 private:
  void Reset();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace kvtier
