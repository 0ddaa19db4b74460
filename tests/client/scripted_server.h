// The far end of the client library's unit tests: a listening socket in a
// private directory that the test scripts frame by frame (ScriptedServer), and
// the sealed segments a host-backend Welcome describes (WelcomeSegments), made
// as kvtierd makes them. It exists for what a real kvtierd never does (a reply
// to another request, a malformed header, silence, a Welcome whose segments do
// not fit): the client's paths against a real kvtierd are the integration
// tests' (tests/integration, tests/chaos).
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/fd_passing.h"
#include "kvtier/fence_layout.h"
#include "kvtier/index_layout.h"
#include "kvtier/model_profile.h"
#include "kvtier/shm_segment.h"
#include "kvtier/wire.h"

namespace kvtier::client_internal {

inline constexpr int kServerWaitMs = 10000;  // Bounds a broken test's wait; never reached by a passing one.

// A frame the server read.
struct Frame {
  wire::FrameHeader header;
  wire::Message message;
};

class ScriptedServer {
 public:
  ScriptedServer() {
    char dir[] = "/tmp/kvtier-client-test.XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr) << std::strerror(errno);
    dir_ = dir;
    path_ = dir_ + "/kvtierd.sock";
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    EXPECT_EQ(::listen(listen_fd_, 8), 0) << std::strerror(errno);
  }
  ~ScriptedServer() {
    for (int fd : accepted_) ::close(fd);
    ::close(listen_fd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

  // The next connection (-1 if none came in kServerWaitMs). Closed with the server.
  int Accept() {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kServerWaitMs) != 1) {
      ADD_FAILURE() << "no client connected";
      return -1;
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    if (fd >= 0) accepted_.push_back(fd);
    return fd;
  }
  // Whether a client is waiting to be accepted now.
  bool Pending() const {
    pollfd p{listen_fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }

  // Reads one whole frame from `fd`; nullopt (and a failure) if there is none.
  static std::optional<Frame> Read(int fd) {
    std::array<uint8_t, wire::kHeaderBytes> header{};
    if (!ReadExactly(fd, header.data(), header.size())) return std::nullopt;
    auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(header));
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return std::nullopt;
    std::vector<uint8_t> payload(h->payload_length);
    if (!ReadExactly(fd, payload.data(), payload.size())) return std::nullopt;
    auto m = wire::DecodePayload(*h, payload);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return std::nullopt;
    return Frame{*h, std::move(m).value()};
  }
  // True once the peer closed `fd` with nothing more to read.
  static bool ReadsEof(int fd) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kServerWaitMs) != 1) return false;
    char c;
    return ::recv(fd, &c, 1, 0) == 0;
  }

  // Sends `bytes`, with `fds` (SCM_RIGHTS) on the first byte, as kvtierd does.
  static void SendBytes(int fd, const std::vector<uint8_t>& bytes, std::span<const int> fds = {}) {
    size_t off = 0;
    if (!fds.empty()) {
      const ssize_t n = SendWithFds(fd, bytes, fds);
      ASSERT_GT(n, 0) << std::strerror(errno);
      off = static_cast<size_t>(n);
    }
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << std::strerror(errno);
      off += static_cast<size_t>(n);
    }
  }
  static void Send(int fd, uint64_t request_id, const wire::Message& m, std::span<const int> fds = {}) {
    SendBytes(fd, wire::EncodeFrame(request_id, m), fds);
  }
  // Reads a request and answers it with `reply` under the request's id; the
  // request read, or nullopt.
  static std::optional<Frame> Answer(int fd, const wire::Message& reply, std::span<const int> fds = {}) {
    std::optional<Frame> req = Read(fd);
    if (req) Send(fd, req->header.request_id, reply, fds);
    return req;
  }

 private:
  static bool ReadExactly(int fd, uint8_t* out, size_t len) {
    size_t off = 0;
    while (off < len) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, kServerWaitMs) != 1) {
        ADD_FAILURE() << "the client sent nothing";
        return false;
      }
      const ssize_t n = ::recv(fd, out + off, len - off, 0);
      if (n <= 0) {
        ADD_FAILURE() << "the client closed the connection";
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }

  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  std::vector<int> accepted_;
};

// A profile of 512-byte blocks of 4 tokens.
inline ModelProfile FakeProfile() {
  ModelProfile p;
  p.name = "fake";
  p.layers = 1;
  p.kv_heads = 1;
  p.head_dim = 32;
  p.dtype = DType::kF16;
  p.block_tokens = 4;
  return p;
}

// The segments of a host-backend kvtierd (pools, index, fences), sealed as it
// seals them, and the Welcome that describes them. The maps here are the
// daemon's: writable.
struct WelcomeSegments {
  static constexpr uint32_t kGpuSlots = 4;
  static constexpr uint32_t kHostSlots = 8;

  explicit WelcomeSegments(uint64_t instance_id = 1, ModelProfile profile = FakeProfile()) {
    const size_t slot = profile.BlockBytes();
    gpu = Sealed("kvtier.test.gpu", slot * kGpuSlots, ShmSegment::Sharing::kReadWrite);
    host = Sealed("kvtier.test.host", slot * kHostSlots, ShmSegment::Sharing::kReadOnly);
    const IndexGeometry g = IndexGeometry::For(profile.block_tokens, kGpuSlots + kHostSlots);
    index = Sealed("kvtier.test.index", g.segment_bytes(), ShmSegment::Sharing::kReadOnly);
    if (index.valid()) {
      auto* h = reinterpret_cast<IndexHeader*>(index.data());
      h->magic = kIndexMagic;
      h->abi_version = kShmAbiVersion;
      h->header_bytes = kIndexHeaderBytes;
      h->segment_bytes = g.segment_bytes();
      h->profile_fingerprint = profile.Fingerprint();
      h->instance_id = instance_id;
      h->block_tokens = g.block_tokens;
      h->table_slots = g.table_slots;
      h->max_records = g.max_records;
      h->table_offset = g.table_offset();
      h->tokens_offset = g.tokens_offset();
      auto* table = reinterpret_cast<IndexSlot*>(index.data() + g.table_offset());
      for (uint32_t i = 0; i < g.table_slots; ++i) table[i].record = kNoRecord;
    }
    fences = Sealed("kvtier.test.fences", sizeof(FenceSegment), ShmSegment::Sharing::kReadOnly);
    if (fences.valid()) {
      fence_state()->magic = kFenceMagic;
      fence_state()->abi_version = kShmAbiVersion;
    }
    welcome.instance_id = instance_id;
    welcome.client_id = 7;
    welcome.profile = profile;
    welcome.ns = Namespace::Make(profile.Fingerprint(), "tenant");
    welcome.backend = wire::BackendKind::kHost;
    welcome.pools = {wire::PoolDesc{Tier::kGpu, slot, kGpuSlots, "gpu", {}},
                     wire::PoolDesc{Tier::kHost, slot, kHostSlots, "host", {}}};
    welcome.index_segment = "index";
    welcome.fence_segment = "fences";
    welcome.max_blocks_per_request = 64;
  }

  // The descriptors that come with the Welcome, in the wire's order.
  std::vector<int> fds() const { return {gpu.share_fd(), host.share_fd(), index.share_fd(), fences.share_fd()}; }
  FenceSegment* fence_state() const { return reinterpret_cast<FenceSegment*>(fences.data()); }

  ShmSegment gpu, host, index, fences;
  wire::Welcome welcome;

 private:
  static ShmSegment Sealed(const std::string& label, size_t bytes, ShmSegment::Sharing sharing) {
    auto s = ShmSegment::CreateSealed(label, bytes, sharing);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : ShmSegment();
  }
};

}  // namespace kvtier::client_internal
