// Connection: Hello, connection generations and Call.
#include "connection.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

namespace kvtier::client_internal {
namespace {

std::string ProgramName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "kvtier-client" : name;
}

// Pages of `seg` in memory (mincore: the file's pages, whoever faulted them in),
// counted in `vec` (one entry per page); 0 where it cannot tell.
size_t ResidentPages(const ShmSegment& seg, std::vector<unsigned char>& vec) {
  if (::mincore(seg.data(), seg.size(), vec.data()) != 0) return 0;
  return static_cast<size_t>(std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return (c & 1) != 0; }));
}

// ClientOptions::prefault_pools: asks the kernel to map every page of each pool
// whose file is wholly allocated (MADV_POPULATE_READ, Linux 5.14; older kernels
// refuse it and the pages fault in as they are used), on a thread that holds the
// mapping alive (a later reconnect maps anew; this one ends on its own). The
// kernel does the reads, so nothing here races with a copy into a slot. A pool
// kvtierd is still faulting in (it does so after it starts listening) is waited
// for while its pages keep coming, at most a minute; one that stops growing
// short of whole (a kvtierd with prefault: false) is left alone: mapping its
// holes would take memory the daemon chose not to.
void PrefaultInBackground(std::shared_ptr<const Attachment> att) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // <linux/mman.h> of Linux 5.14.
#endif
  std::thread([att = std::move(att)] {
    using Clock = std::chrono::steady_clock;
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (Tier t : kTiers) {
      const ShmSegment& seg = att->pools[t];
      if (!seg.valid()) continue;
      std::vector<unsigned char> vec((seg.size() + page - 1) / page);
      bool whole = seg.allocated_bytes() >= seg.size();
      const auto give_up = Clock::now() + std::chrono::minutes(1);
      size_t last = 0;
      auto grew = Clock::now();
      while (!whole && Clock::now() < give_up && Clock::now() - grew < std::chrono::seconds(2)) {
        const size_t now = ResidentPages(seg, vec);
        whole = now == vec.size();
        if (now != last) last = now, grew = Clock::now();
        if (!whole) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (!whole) continue;
      if (madvise(seg.data(), seg.size(), MADV_POPULATE_READ) != 0) return;
    }
  }).detach();
}

}  // namespace

Status Connection::Reconnect() {
  std::lock_guard lock(mu_);
  return ConnectLocked();
}

std::shared_ptr<const Attachment> Connection::attachment() const {
  std::lock_guard lock(att_mu_);
  return att_;
}

bool Connection::Current(const std::shared_ptr<const Attachment>& a) const {
  std::lock_guard lock(att_mu_);
  return att_ == a;
}

Status Connection::ConnectLocked() {
  KVTIER_RETURN_IF_ERROR(transport_.Open());
  wire::Hello hello;
  hello.client_name = options_.client_name.empty() ? ProgramName() : options_.client_name;
  hello.pid = static_cast<uint32_t>(::getpid());
  hello.tenant = options_.tenant;
  hello.profile = options_.profile;
  hello.model = options_.model;
  // The Welcome's segments come as descriptors; once mapped (or not) they are
  // closed: the mappings are what the attachment keeps.
  std::vector<int> passed;
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() {
      for (int fd : fds) ::close(fd);
    }
  } close_passed{passed};
  auto reply = transport_.RoundTrip(hello, &passed);
  if (!reply.ok()) {
    transport_.Close();  // Also when the Hello could not be encoded: no connection without a Welcome.
    return reply.status();
  }
  if (auto* err = std::get_if<wire::ErrorResponse>(&*reply)) {
    transport_.Close();
    return wire::ToStatus(*err);
  }
  auto* welcome = std::get_if<wire::Welcome>(&*reply);
  if (welcome == nullptr) {
    transport_.Close();
    return ProtocolError("kvtierd answered Hello with something other than Welcome");
  }
  auto attached = Attachment::Map(std::move(*welcome), passed, options_.open_gpu);
  if (!attached.ok()) {
    transport_.Close();
    return attached.status();
  }
  if (options_.prefault_pools) PrefaultInBackground(*attached);
  {
    std::lock_guard lock(att_mu_);
    att_ = std::move(attached).value();
  }
  ++generation_;
  return Status::Ok();
}

Result<Reply<wire::Message>> Connection::Send(const wire::Message& request, Resend resend, uint64_t generation,
                                        std::string_view lease_kind) {
  std::lock_guard lock(mu_);
  if (generation != 0) {
    if (generation != generation_ || !transport_.connected()) {
      return Unavailable("the " + std::string(lease_kind) + " ended with its connection to kvtierd");
    }
  } else if (!transport_.connected()) {
    if (!options_.reconnect) return Unavailable("not connected to kvtierd (reconnect is off)");
    KVTIER_RETURN_IF_ERROR(ConnectLocked());
  }
  auto reply = transport_.RoundTrip(request);
  // A connection that broke (kvtierd restarted since the last call) is made
  // again and the request resent once; a kvtierd that did not answer in time
  // is not asked again: one call waits at most request_timeout for it.
  if (!reply.ok() && reply.status().code() != StatusCode::kTimeout && !transport_.connected() &&
      resend == Resend::kYes && options_.reconnect) {
    KVTIER_RETURN_IF_ERROR(ConnectLocked());
    reply = transport_.RoundTrip(request);
  }
  if (!reply.ok()) return reply.status();
  if (auto* err = std::get_if<wire::ErrorResponse>(&*reply)) return wire::ToStatus(*err);
  // Still under mu_: the connection the reply came on is the current one.
  return Reply<wire::Message>{std::move(reply).value(), att_, generation_};
}

Status Connection::UnexpectedReply(const wire::Message& got, wire::MessageType wanted) {
  return ProtocolError(std::string("unexpected reply ") + wire::MessageTypeName(wire::TypeOf(got)) + ", wanted " +
                       wire::MessageTypeName(wanted));
}

}  // namespace kvtier::client_internal
