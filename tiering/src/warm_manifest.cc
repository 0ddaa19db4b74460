// WarmManifest: the warm-restart manifest's byte format and its segment (warm_manifest.h).
#include "warm_manifest.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <type_traits>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvtier/shm_names.h"
#include "kvtier/shm_segment.h"

namespace kvtier::tiering {
namespace {

struct WarmHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t total_bytes;
  uint64_t profile_fingerprint;
  uint64_t block_bytes;
  uint32_t block_tokens;
  uint32_t host_slots;
  uint32_t flags;
  uint32_t block_count;
  uint32_t session_count;
  uint32_t reserved0;
  uint64_t written_unix_ms;
  uint64_t body_checksum;  // XXH3-64 of bytes [header_bytes, total_bytes).
  uint8_t reserved[40];
  uint64_t header_checksum;  // XXH3-64 of the header before this field.
};
static_assert(sizeof(WarmHeader) == 128);
static_assert(std::is_trivially_copyable_v<WarmHeader> && std::is_standard_layout_v<WarmHeader>);

struct WarmBlockEntry {
  uint64_t key_lo, key_hi;
  uint64_t parent_lo, parent_hi;
  uint64_t ns_lo, ns_hi;
  uint64_t checksum;
  uint32_t host_slot;
  uint32_t reserved;
};
static_assert(sizeof(WarmBlockEntry) == 64);
// Follows each WarmBlockEntry from format 3 on.
struct WarmModelEntry {
  uint64_t model_lo, model_hi;
};
static_assert(sizeof(WarmModelEntry) == 16);

struct WarmSessionEntry {
  uint32_t id_bytes;
  uint32_t chain_len;
  int32_t priority;
  uint32_t tenant_bytes;  // Format 2; 0 in format 1, whose ids were "<tenant>/<id>".
};
static_assert(sizeof(WarmSessionEntry) == 16);
// Follows each WarmSessionEntry from format 4 on.
struct WarmSessionFlags {
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(WarmSessionFlags) == 8);
constexpr uint32_t kSessionEnded = 1;

constexpr uint32_t kFlagClean = 1;
constexpr uint32_t kMaxSessionIdBytes = 1u << 16;

size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

class Writer {
 public:
  explicit Writer(std::vector<std::byte>* out) : out_(out) {}
  void Put(const void* p, size_t n) {
    const size_t at = out_->size();
    out_->resize(at + n);
    std::memcpy(out_->data() + at, p, n);
  }
  void Align() { out_->resize(Pad8(out_->size())); }

 private:
  std::vector<std::byte>* out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  bool Get(void* p, size_t n) {
    if (in_.size() - at_ < n) return false;
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (in_.size() - at_ < n) return false;
    at_ += n;
    return true;
  }
  bool Align() { return Skip(Pad8(at_) - at_); }
  size_t left() const { return in_.size() - at_; }

 private:
  std::span<const std::byte> in_;
  size_t at_ = 0;
};

uint64_t HeaderChecksum(const WarmHeader& h) { return XXH3_64bits(&h, offsetof(WarmHeader, header_checksum)); }

Status Errno(const std::string& what, const std::string& name) {
  const int err = errno;
  return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kInternal,
                what + " '" + name + "': " + std::strerror(err));
}

}  // namespace

uint64_t PayloadChecksum(const std::byte* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::vector<std::byte> EncodeWarmManifest(const WarmManifest& m, uint32_t format) {
  std::vector<std::byte> out(sizeof(WarmHeader));
  Writer w(&out);
  const uint32_t bt = m.geometry.block_tokens;
  for (const WarmBlock& b : m.blocks) {
    const WarmBlockEntry e{b.key.lo,    b.key.hi, b.parent.lo, b.parent.hi, b.ns.id.lo, b.ns.id.hi, b.checksum,
                           b.host_slot, 0};
    w.Put(&e, sizeof(e));
    if (format >= 3) {
      const WarmModelEntry model{b.model.id.lo, b.model.id.hi};
      w.Put(&model, sizeof(model));
    }
    std::vector<TokenId> tokens = b.tokens;
    tokens.resize(bt, 0);  // REQUIRES: block_tokens tokens; a short row stays decodable (and fails its key).
    w.Put(tokens.data(), bt * sizeof(TokenId));
    w.Align();
  }
  for (const WarmSession& s : m.sessions) {
    const WarmSessionEntry e{static_cast<uint32_t>(s.id.size()), static_cast<uint32_t>(s.chain.size()), s.priority,
                             static_cast<uint32_t>(s.tenant.size())};
    w.Put(&e, sizeof(e));
    if (format >= 4) {
      const WarmSessionFlags f{s.ended ? kSessionEnded : 0u, 0};
      w.Put(&f, sizeof(f));
    }
    w.Put(s.id.data(), s.id.size());
    w.Put(s.tenant.data(), s.tenant.size());
    w.Align();
    w.Put(s.chain.data(), s.chain.size() * sizeof(uint32_t));
    w.Align();
  }
  WarmHeader h{};
  h.magic = kWarmMagic;
  h.format_version = format;
  h.header_bytes = sizeof(WarmHeader);
  h.total_bytes = out.size();
  h.profile_fingerprint = m.geometry.profile_fingerprint;
  h.block_bytes = m.geometry.block_bytes;
  h.block_tokens = bt;
  h.host_slots = m.geometry.host_slots;
  h.flags = m.clean ? kFlagClean : 0;
  h.block_count = static_cast<uint32_t>(m.blocks.size());
  h.session_count = static_cast<uint32_t>(m.sessions.size());
  h.written_unix_ms = m.written_unix_ms;
  h.body_checksum = XXH3_64bits(out.data() + sizeof(WarmHeader), out.size() - sizeof(WarmHeader));
  h.header_checksum = HeaderChecksum(h);
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

Result<WarmManifest> DecodeWarmManifest(std::span<const std::byte> bytes, const WarmGeometry& expected) {
  WarmHeader h;
  if (bytes.size() < sizeof(h))
    return Corrupt("warm manifest of " + std::to_string(bytes.size()) + " bytes has no header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kWarmMagic) return Corrupt("warm manifest has a bad magic number");
  if (h.format_version < kWarmOldestFormatVersion || h.format_version > kWarmFormatVersion ||
      h.header_bytes != sizeof(WarmHeader)) {
    return FailedPrecondition("warm manifest format " + std::to_string(h.format_version) + ", this build reads " +
                              std::to_string(kWarmOldestFormatVersion) + ".." + std::to_string(kWarmFormatVersion));
  }
  if (HeaderChecksum(h) != h.header_checksum) return Corrupt("warm manifest header checksum mismatch");
  if (h.total_bytes != bytes.size()) {
    return Corrupt("warm manifest says " + std::to_string(h.total_bytes) + " bytes, segment holds " +
                   std::to_string(bytes.size()));
  }
  const WarmGeometry got{h.profile_fingerprint, h.block_bytes, h.block_tokens, h.host_slots};
  if (!(got == expected)) {
    auto describe = [](const WarmGeometry& g) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "fingerprint %016llx, %llu-byte blocks of %u tokens, %u host slots",
                    static_cast<unsigned long long>(g.profile_fingerprint),
                    static_cast<unsigned long long>(g.block_bytes), g.block_tokens, g.host_slots);
      return std::string(buf);
    };
    return FailedPrecondition("warm manifest is for " + describe(got) + "; this configuration has " +
                              describe(expected));
  }
  if (XXH3_64bits(bytes.data() + sizeof(h), bytes.size() - sizeof(h)) != h.body_checksum) {
    return Corrupt("warm manifest body checksum mismatch");
  }
  if (h.block_count > h.host_slots) return Corrupt("warm manifest lists more blocks than host slots");

  WarmManifest m;
  m.geometry = got;
  m.clean = (h.flags & kFlagClean) != 0;
  m.written_unix_ms = h.written_unix_ms;
  Reader r(bytes.subspan(sizeof(h)));
  std::vector<uint8_t> slot_seen(h.host_slots, 0);
  m.blocks.resize(h.block_count);
  for (uint32_t i = 0; i < h.block_count; ++i) {
    WarmBlockEntry e;
    WarmModelEntry model{0, 0};
    WarmBlock& b = m.blocks[i];
    b.tokens.resize(h.block_tokens);
    if (!r.Get(&e, sizeof(e)) || (h.format_version >= 3 && !r.Get(&model, sizeof(model))) ||
        !r.Get(b.tokens.data(), h.block_tokens * sizeof(TokenId)) || !r.Align()) {
      return Corrupt("warm manifest truncated in block " + std::to_string(i));
    }
    if (e.host_slot >= h.host_slots)
      return Corrupt("warm manifest block " + std::to_string(i) + " has an out-of-range slot");
    if (slot_seen[e.host_slot]++)
      return Corrupt("warm manifest lists host slot " + std::to_string(e.host_slot) + " twice");
    b.key = BlockKey{e.key_lo, e.key_hi};
    b.parent = BlockKey{e.parent_lo, e.parent_hi};
    b.ns.id = BlockKey{e.ns_lo, e.ns_hi};
    b.model.id = BlockKey{model.model_lo, model.model_hi};
    b.checksum = e.checksum;
    b.host_slot = e.host_slot;
  }
  m.sessions.resize(h.session_count);
  for (uint32_t i = 0; i < h.session_count; ++i) {
    WarmSessionEntry e;
    WarmSession& s = m.sessions[i];
    const std::string where = "warm manifest session " + std::to_string(i);
    WarmSessionFlags flags{0, 0};
    if (!r.Get(&e, sizeof(e)) || (h.format_version >= 4 && !r.Get(&flags, sizeof(flags)))) {
      return Corrupt(where + " is truncated");
    }
    if ((flags.flags & ~kSessionEnded) != 0 || flags.reserved != 0) return Corrupt(where + " has unknown flags");
    s.ended = (flags.flags & kSessionEnded) != 0;
    if (e.id_bytes == 0 || e.id_bytes > kMaxSessionIdBytes)
      return Corrupt(where + " has an id of " + std::to_string(e.id_bytes) + " bytes");
    if (e.chain_len > h.block_count) return Corrupt(where + " has a chain longer than the block list");
    const uint32_t tenant_bytes = h.format_version >= 2 ? e.tenant_bytes : 0;
    if (tenant_bytes > kMaxSessionIdBytes) return Corrupt(where + " has a tenant of " + std::to_string(tenant_bytes) + " bytes");
    s.id.resize(e.id_bytes);
    s.tenant.resize(tenant_bytes);
    s.chain.resize(e.chain_len);
    if (!r.Get(s.id.data(), e.id_bytes) || !r.Get(s.tenant.data(), tenant_bytes) || !r.Align() ||
        !r.Get(s.chain.data(), e.chain_len * sizeof(uint32_t)) || !r.Align()) {
      return Corrupt(where + " is truncated");
    }
    if (h.format_version == 1) {
      // Format 1 scoped ids by tenant as "<tenant>/<id>".
      if (const size_t slash = s.id.find('/'); slash != std::string::npos) {
        s.tenant = s.id.substr(0, slash);
        s.id.erase(0, slash + 1);
      }
      if (s.id.empty()) return Corrupt(where + " has an empty id");
    }
    for (uint32_t b : s.chain) {
      if (b >= h.block_count)
        return Corrupt(where + " names block " + std::to_string(b) + " of " + std::to_string(h.block_count));
    }
    s.priority = e.priority;
  }
  if (r.left() != 0) return Corrupt("warm manifest has " + std::to_string(r.left()) + " trailing bytes");
  return m;
}

Status WriteWarmSegment(const std::string& name, std::span<const std::byte> bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return InvalidArgument("warm manifest name '" + name + "' must be '/' followed by non-'/' characters");
  }
  const std::string tmp = shm_names::Staging(name);
  // A fresh file of our own: one left by a dead writer goes first, and one that
  // cannot go (another uid's, in the sticky /dev/shm) is never written into.
  ShmSegment::RemoveIfOwned(tmp);
  const int fd = shm_open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Errno("shm_open (exclusive)", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status st = Errno("write", tmp);
      ::close(fd);
      shm_unlink(tmp.c_str());
      return st;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  // shm_open names live in /dev/shm on Linux; rename there replaces the old manifest atomically.
  const std::string from = shm_names::ShmPath(tmp), to = shm_names::ShmPath(name);
  if (::rename(from.c_str(), to.c_str()) != 0) {
    Status st = Errno("rename", from);
    shm_unlink(tmp.c_str());
    return st;
  }
  return Status::Ok();
}

Result<std::vector<std::byte>> ReadWarmSegment(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return Errno("shm_open", name);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = Errno("fstat", name);
    ::close(fd);
    return s;
  }
  // Only a manifest this uid wrote is believed: anyone may create names in
  // /dev/shm, and a forged one would describe blocks that are not there.
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    return Status(StatusCode::kPermissionDenied, "warm manifest '" + name + "' belongs to uid " +
                                                     std::to_string(st.st_uid) + ", not to this uid (" +
                                                     std::to_string(::geteuid()) + "): not trusted");
  }
  std::vector<std::byte> out(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

bool RemoveWarmSegment(const std::string& name) { return ShmSegment::RemoveIfOwned(name); }

}  // namespace kvtier::tiering
