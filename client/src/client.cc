#include "kvtier/client.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "cuda_driver.h"
#include "kvtier/gpu_pool_handle.h"
#include "kvtier/shm_segment.h"

namespace kvtier {
namespace client_internal {

using Clock = std::chrono::steady_clock;
// How long a client stops polling for replies after a poll found none in time.
constexpr auto kSpinPause = std::chrono::milliseconds(100);

std::string UserName(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  return pw ? std::string(pw->pw_name) + " (uid " + std::to_string(uid) + ")" : "uid " + std::to_string(uid);
}

std::string GroupName(gid_t gid) {
  const group* gr = ::getgrgid(gid);
  return gr ? std::string(gr->gr_name) + " (gid " + std::to_string(gid) + ")" : "gid " + std::to_string(gid);
}

// connect() refused by the socket's (or its directory's) permissions: say who
// may open it and who the caller is, so the fix (a group, a socket) is obvious.
Status SocketPermissionDenied(const std::string& path, const std::string& error) {
  std::string msg = "cannot connect to kvtierd at " + path + ": " + error;
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    msg += std::string("; the socket has mode ") + mode + ", owner " + UserName(st.st_uid) + ", group " +
           GroupName(st.st_gid) + ", and you are " + UserName(::geteuid()) +
           ": connect as a member of that group (or one access: allows), or use a socket you may open";
  } else {
    msg += "; a directory on the way to the socket does not let you in (" + std::string(std::strerror(errno)) + ")";
  }
  return Status(StatusCode::kPermissionDenied, msg);
}

// A writer event from GpuState's pool, handed back to it when the last lease holding it goes.
struct WriterEvent {
  CUevent event = nullptr;
  wire::IpcEventHandle handle{};
};

// The cuda backend's GPU side of an attachment: the pool opened through CUDA
// IPC and the promotion fence events, opened once at attach in the primary
// context of the device with the pool's UUID, closed when the last lease goes.
struct GpuState {
  std::shared_ptr<const CudaDriver> driver;
  CUdevice device = 0;
  CUcontext ctx = nullptr;  // Retained primary context.
  CUdeviceptr base = 0;     // The GPU pool, mapped.
  std::vector<CUevent> fence_events;
  std::mutex mu;
  std::vector<WriterEvent*> free_writer_events;  // GUARDED_BY(mu)
  std::vector<std::unique_ptr<WriterEvent>> writer_events;  // GUARDED_BY(mu); all ever made

  ~GpuState() {
    if (!driver || ctx == nullptr) return;
    {
      ScopedContext scope(*driver, ctx);
      for (auto& w : writer_events) driver->cuEventDestroy(w->event);
      for (CUevent e : fence_events) driver->cuEventDestroy(e);
      if (base != 0) driver->cuIpcCloseMemHandle(base);
    }
    driver->cuDevicePrimaryCtxRelease(device);
  }

  // A pooled interprocess event; returned to the pool when the pointer goes.
  Result<std::shared_ptr<const WriterEvent>> TakeWriterEvent(const std::shared_ptr<const Attachment>& owner) {
    WriterEvent* w = nullptr;
    {
      std::lock_guard lock(mu);
      if (!free_writer_events.empty()) {
        w = free_writer_events.back();
        free_writer_events.pop_back();
      }
    }
    if (w == nullptr) {
      auto made = std::make_unique<WriterEvent>();
      ScopedContext scope(*driver, ctx);
      KVTIER_RETURN_IF_ERROR(
          driver->Check(driver->cuEventCreate(&made->event, kCuEventInterprocess | kCuEventDisableTiming),
                        "cuEventCreate(interprocess) for a writer event"));
      CUipcEventHandle h{};
      const Status st = driver->Check(driver->cuIpcGetEventHandle(&h, made->event), "cuIpcGetEventHandle");
      if (!st.ok()) {
        driver->cuEventDestroy(made->event);
        return st;
      }
      std::memcpy(made->handle.data(), h.reserved, made->handle.size());
      w = made.get();
      std::lock_guard lock(mu);
      writer_events.push_back(std::move(made));
    }
    // The deleter keeps the attachment (and so this GpuState) alive.
    return std::shared_ptr<const WriterEvent>(w, [this, owner](const WriterEvent* e) {
      std::lock_guard lock(mu);
      free_writer_events.push_back(const_cast<WriterEvent*>(e));
    });
  }
};

// The daemon's segments as this process maps them, for one connection generation.
struct Attachment {
  wire::Welcome welcome;
  ShmSegment index_segment;
  ShmSegment pools[kTierCount];  // The GPU tier's stays empty on the cuda backend.
  ShmSegment fence_segment;
  IndexView index;
  const FenceSegment* fences = nullptr;
  std::unique_ptr<GpuState> gpu;  // Cuda backend only.

  std::byte* SlotData(Tier tier, uint32_t slot) const {
    const size_t offset = size_t{slot} * welcome.pools[static_cast<int>(tier)].slot_bytes;
    if (tier == Tier::kGpu && gpu) return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(gpu->base)) + offset;
    return pools[static_cast<int>(tier)].data() + offset;
  }
  uint64_t Completed(CopyDirection stream) const {
    return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(fences->completed[static_cast<int>(stream)]))
        .load(std::memory_order_acquire);
  }
};

// Opens the GPU pool and the fence events of a cuda-backend Welcome.
Result<std::unique_ptr<GpuState>> OpenGpu(const wire::Welcome& welcome, const GpuPoolHandle& pool) {
  auto driver = CudaDriver::Default();
  if (!driver.ok()) {
    return Status(driver.status().code(), "kvtierd runs the cuda backend, so this client must open its GPU pool: " +
                                              driver.status().message());
  }
  auto gpu = std::make_unique<GpuState>();
  const CudaDriver& d = **driver;
  auto dev = d.DeviceByUuid(pool.device_uuid);
  if (!dev.ok()) return dev.status();
  KVTIER_RETURN_IF_ERROR(d.Check(d.cuDevicePrimaryCtxRetain(&gpu->ctx, *dev), "cuDevicePrimaryCtxRetain"));
  gpu->driver = *driver;  // From here on, ~GpuState undoes what was done.
  gpu->device = *dev;
  ScopedContext scope(d, gpu->ctx);
  if (!scope.ok()) return Internal("cannot make the primary context of " + FormatGpuUuid(pool.device_uuid) + " current");
  CUipcMemHandle mem{};
  std::memcpy(mem.reserved, pool.raw.data(), sizeof(mem.reserved));
  KVTIER_RETURN_IF_ERROR(d.Check(d.cuIpcOpenMemHandle(&gpu->base, mem, kCuIpcMemLazyEnablePeerAccess),
                                 "opening kvtierd's GPU pool (cuIpcOpenMemHandle on " +
                                     FormatGpuUuid(pool.device_uuid) + ")"));
  for (const wire::IpcEventHandle& h : welcome.fence_events) {
    CUipcEventHandle raw{};
    std::memcpy(raw.reserved, h.data(), sizeof(raw.reserved));
    CUevent e = nullptr;
    KVTIER_RETURN_IF_ERROR(d.Check(d.cuIpcOpenEventHandle(&e, raw), "opening a promotion fence event (cuIpcOpenEventHandle)"));
    gpu->fence_events.push_back(e);
  }
  return gpu;
}

Result<std::shared_ptr<Attachment>> Attach(wire::Welcome welcome) {
  auto att = std::make_shared<Attachment>();
  const bool cuda = welcome.backend == wire::BackendKind::kCuda;
  if (!cuda && !welcome.fence_events.empty()) return ProtocolError("Welcome: fence events from a host backend");
  if (welcome.pools.size() != kTierCount) return ProtocolError("Welcome must describe 2 pools");
  for (int t = 0; t < kTierCount; ++t) {
    const wire::PoolDesc& d = welcome.pools[t];
    if (static_cast<int>(d.tier) != t) return ProtocolError("Welcome pools out of order");
    if (d.slot_bytes != welcome.profile.BlockBytes()) return ProtocolError("pool slot size does not match the profile");
    if (cuda && d.tier == Tier::kGpu) {
      auto h = DecodeGpuPoolHandle(d.ipc_handle);
      if (!h.ok()) return Status(h.status().code(), "Welcome: " + h.status().message());
      if (h->bytes < d.slot_bytes * d.slots) return ProtocolError("Welcome: GPU pool smaller than its slots");
      // Opened here, once per connection, never on the request path (milliseconds
      // each); before any segment, so a worker without a usable driver learns that first.
      auto gpu = OpenGpu(welcome, *h);
      if (!gpu.ok()) return gpu.status();
      att->gpu = std::move(gpu).value();
      continue;
    }
    auto seg = ShmSegment::Open(d.shm_name, /*writable=*/true);
    if (!seg.ok()) return Status(seg.status().code(), "mapping pool: " + seg.status().message());
    if (seg->size() < d.slot_bytes * d.slots) return Corrupt("pool segment " + d.shm_name + " is smaller than announced");
    att->pools[t] = std::move(seg).value();
  }
  auto idx = ShmSegment::Open(welcome.index_segment, /*writable=*/false);
  if (!idx.ok()) return Status(idx.status().code(), "mapping index: " + idx.status().message());
  att->index_segment = std::move(idx).value();
  auto view = IndexView::Attach(att->index_segment.data(), att->index_segment.size());
  if (!view.ok()) return view.status();
  att->index = *view;
  if (att->index.block_tokens() != welcome.profile.block_tokens ||
      att->index.header().profile_fingerprint != welcome.profile.Fingerprint()) {
    return Corrupt("index segment does not belong to the announced profile");
  }
  auto fences = ShmSegment::Open(welcome.fence_segment, /*writable=*/false);
  if (!fences.ok()) return Status(fences.status().code(), "mapping fences: " + fences.status().message());
  att->fence_segment = std::move(fences).value();
  if (att->fence_segment.size() < sizeof(FenceSegment)) return Corrupt("fence segment too small");
  att->fences = reinterpret_cast<const FenceSegment*>(att->fence_segment.data());
  if (att->fences->magic != kFenceMagic) return Corrupt("fence segment has a bad magic number");
  att->welcome = std::move(welcome);
  return att;
}

std::string ProgramName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "kvtier-client" : name;
}

struct Core {
  explicit Core(ClientOptions o) : options(std::move(o)) {}
  ~Core() { Disconnect(); }

  ClientOptions options;
  std::mutex mu;  // Serializes requests; guards fd, generation, next_request.
  int fd = -1;
  std::vector<uint8_t> rbuf = std::vector<uint8_t>(64 * 1024);  // Receive buffer.
  Clock::time_point last_reply{};  // When the previous reply arrived.
  Clock::time_point no_spin_until{};  // A spin that found no reply pauses spinning.
  size_t rbegin = 0, rend = 0;                                 // Unread bytes in rbuf.
  uint64_t generation = 0;
  uint64_t next_request = 1;
  mutable std::mutex att_mu;
  std::shared_ptr<const Attachment> att;  // GUARDED_BY(att_mu)

  std::shared_ptr<const Attachment> attachment() const {
    std::lock_guard lock(att_mu);
    return att;
  }

  void Disconnect() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    rbegin = rend = 0;
  }

  // The socket is blocking, with SO_SNDTIMEO/SO_RCVTIMEO = request_timeout: a
  // reply wakes the caller straight from recv, one syscall, as in a bare ping-pong.
  Status SendAll(const std::vector<uint8_t>& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return Status(StatusCode::kTimeout, "kvtierd did not take a request in time");
      } else {
        return Unavailable(std::string("lost connection to kvtierd: ") + std::strerror(errno));
      }
    }
    return Status::Ok();
  }

  // Right after a reply kvtierd is still polling (busy_poll_us), so the next
  // reply comes within microseconds: poll for it (yielding, in case the daemon
  // shares this CPU) rather than sleep in recv and pay a wake-up. After a pause
  // the daemon sleeps, and spinning would only take a CPU it may need to wake up
  // on. A spin that runs out (a daemon that does not poll) pauses spinning for
  // kSpinPause. Returns recv's result; -1 with EAGAIN when the caller should
  // block in recv.
  ssize_t SpinRecv(uint8_t* dst, size_t cap) {
    const auto spin = options.reply_spin;
    const auto now = Clock::now();
    errno = EAGAIN;
    if (spin.count() <= 0 || now - last_reply >= spin || now < no_spin_until) return -1;
    const auto until = now + spin;
    ssize_t n;
    while ((n = ::recv(fd, dst, cap, MSG_DONTWAIT)) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() >= until) {
        no_spin_until = Clock::now() + kSpinPause;
        errno = EAGAIN;
        return -1;
      }
      std::this_thread::yield();
    }
    return n;
  }

  // Reads exactly `len` bytes, through a buffer so a small reply costs one recv.
  Status RecvAll(uint8_t* out, size_t len) {
    size_t off = 0;
    while (off < len) {
      if (rbegin < rend) {
        const size_t k = std::min(len - off, rend - rbegin);
        std::memcpy(out + off, rbuf.data() + rbegin, k);
        rbegin += k;
        off += k;
        continue;
      }
      const bool direct = len - off >= rbuf.size();
      uint8_t* dst = direct ? out + off : rbuf.data();
      const size_t cap = direct ? len - off : rbuf.size();
      ssize_t n = SpinRecv(dst, cap);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) n = ::recv(fd, dst, cap, 0);
      if (n > 0) {
        if (direct) {
          off += static_cast<size_t>(n);
        } else {
          rbegin = 0;
          rend = static_cast<size_t>(n);
        }
      } else if (n == 0) {
        return Unavailable("lost connection to kvtierd: it closed the connection");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return Status(StatusCode::kTimeout, "kvtierd did not answer in time");
      } else if (errno != EINTR) {
        return Unavailable(std::string("lost connection to kvtierd: ") + std::strerror(errno));
      }
    }
    return Status::Ok();
  }

  // One request and its reply on the current connection. A failure of the
  // transport (not an ErrorResponse) drops the connection.
  Result<wire::Message> RoundTrip(const wire::Message& request) {
    const uint64_t id = next_request++;
    std::vector<uint8_t> frame;
    const Status enc = wire::TryAppendFrame(frame, id, request);
    if (!enc.ok()) return enc;
    Status st = SendAll(frame);
    std::array<uint8_t, wire::kHeaderBytes> header{};
    if (st.ok()) st = RecvAll(header.data(), header.size());
    if (!st.ok()) {
      Disconnect();
      return st;
    }
    auto h = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(header));
    if (!h.ok()) {
      Disconnect();
      return h.status();
    }
    std::vector<uint8_t> payload(h->payload_length);
    st = RecvAll(payload.data(), payload.size());
    if (!st.ok()) {
      Disconnect();
      return st;
    }
    last_reply = Clock::now();
    auto m = wire::DecodePayload(*h, payload);
    if (!m.ok() || (h->request_id != id && h->request_id != 0)) {
      Disconnect();
      return m.ok() ? ProtocolError("reply to another request") : m.status();
    }
    return m;
  }

  Status Connect() {
    Disconnect();
    const auto deadline = Clock::now() + options.connect_timeout;
    auto backoff = std::chrono::milliseconds(2);
    std::string last_error;
    for (;;) {
      fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return Internal(std::string("socket: ") + std::strerror(errno));
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      if (options.socket_path.size() >= sizeof(addr.sun_path)) {
        Disconnect();
        return InvalidArgument("socket path too long: " + options.socket_path);
      }
      std::strncpy(addr.sun_path, options.socket_path.c_str(), sizeof(addr.sun_path) - 1);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        const auto ms = options.request_timeout.count();
        const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        break;
      }
      const int err = errno;
      last_error = std::strerror(err);
      Disconnect();
      // Retrying cannot help a peer the socket's permissions keep out.
      if (err == EACCES || err == EPERM) return SocketPermissionDenied(options.socket_path, last_error);
      if (Clock::now() + backoff > deadline) {
        return Unavailable("cannot connect to kvtierd at " + options.socket_path + ": " + last_error +
                           " (is kvtierd running?)");
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
    }
    wire::Hello hello;
    hello.client_name = options.client_name.empty() ? ProgramName() : options.client_name;
    hello.pid = static_cast<uint32_t>(::getpid());
    hello.tenant = options.tenant;
    hello.profile = options.profile;
    auto reply = RoundTrip(hello);
    if (!reply.ok()) return reply.status();
    if (auto* err = std::get_if<wire::ErrorResponse>(&*reply)) {
      Disconnect();
      return wire::ToStatus(*err);
    }
    auto* welcome = std::get_if<wire::Welcome>(&*reply);
    if (welcome == nullptr) {
      Disconnect();
      return ProtocolError("kvtierd answered Hello with something other than Welcome");
    }
    auto attached = Attach(std::move(*welcome));
    if (!attached.ok()) {
      Disconnect();
      return attached.status();
    }
    {
      std::lock_guard lock(att_mu);
      att = std::move(attached).value();
    }
    ++generation;
    return Status::Ok();
  }

  // Sends `request` and returns the reply. Reconnects first if the connection
  // was lost; if it is lost during the call and `retry` is set, reconnects and
  // sends once more (for requests that hold no state of the old connection).
  Result<wire::Message> Call(const wire::Message& request, bool retry) {
    std::lock_guard lock(mu);
    if (fd < 0) {
      if (!options.reconnect) return Unavailable("not connected to kvtierd (reconnect is off)");
      KVTIER_RETURN_IF_ERROR(Connect());
    }
    auto reply = RoundTrip(request);
    if (!reply.ok() && fd < 0 && retry && options.reconnect) {
      KVTIER_RETURN_IF_ERROR(Connect());
      reply = RoundTrip(request);
    }
    if (!reply.ok()) return reply.status();
    if (auto* err = std::get_if<wire::ErrorResponse>(&*reply)) return wire::ToStatus(*err);
    return reply;
  }

  // Release of a lease made on connection `gen`.
  Status ReleaseLease(uint64_t id, uint64_t gen) {
    std::lock_guard lock(mu);
    if (gen != generation || fd < 0) return Unavailable("the lease ended with its connection to kvtierd");
    auto reply = RoundTrip(wire::ReleaseRequest{id});
    if (!reply.ok()) return reply.status();
    if (auto* err = std::get_if<wire::ErrorResponse>(&*reply)) return wire::ToStatus(*err);
    return Status::Ok();
  }

  uint64_t current_generation() {
    std::lock_guard lock(mu);
    return generation;
  }
};

template <typename T>
Result<T> Expect(Result<wire::Message> reply) {
  if (!reply.ok()) return reply.status();
  if (auto* v = std::get_if<T>(&*reply)) return std::move(*v);
  return ProtocolError(std::string("unexpected reply ") + wire::MessageTypeName(wire::TypeOf(*reply)) + ", wanted " +
                       wire::MessageTypeName(T::kType));
}

Status WaitCompleted(const Attachment& att, const Fence& fence, std::chrono::milliseconds timeout) {
  if (fence.IsNull() || att.Completed(fence.stream) >= fence.seq) return Status::Ok();
  const auto deadline = Clock::now() + timeout;
  for (int spin = 0;; ++spin) {
    if (att.Completed(fence.stream) >= fence.seq) return Status::Ok();
    if (Clock::now() > deadline) {
      return Status(StatusCode::kTimeout, "copy fence " + std::to_string(fence.seq) + " still pending");
    }
    if (spin < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 1000 ? 20 : 200));
    }
  }
}

}  // namespace client_internal

using client_internal::Core;
using client_internal::Expect;

// --- Lease / WriteLease ----------------------------------------------------------

namespace client_internal {

LeaseHandle& LeaseHandle::operator=(LeaseHandle&& other) noexcept {
  if (this != &other) {
    (void)ReleaseHandle();
    core_ = std::move(other.core_);
    attachment_ = std::move(other.attachment_);
    generation_ = other.generation_;
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Status LeaseHandle::ReleaseHandle() {
  if (id_ == 0) return Status::Ok();
  const uint64_t id = std::exchange(id_, 0);
  auto core = core_.lock();
  if (!core) return Unavailable("the client that made the lease is gone");
  return core->ReleaseLease(id, generation_);
}

}  // namespace client_internal

Status Lease::Wait(std::chrono::milliseconds timeout) const {
  if (!attachment_) return Status::Ok();
  return client_internal::WaitCompleted(*attachment_, fence_, timeout);
}

Status Lease::WaitOnStream(void* stream, std::chrono::milliseconds host_timeout) const {
  if (!attachment_ || fence_.IsNull() || attachment_->Completed(fence_.stream) >= fence_.seq) return Status::Ok();
  const client_internal::GpuState* gpu = attachment_->gpu.get();
  if (gpu == nullptr || gpu->fence_events.empty() || fence_.stream != CopyDirection::kHostToGpu) {
    return client_internal::WaitCompleted(*attachment_, fence_, host_timeout);
  }
  // The batch of fence seq recorded this event before the fence reached us; if
  // the slot was recorded again since, the wait covers a later batch too.
  const auto& d = *gpu->driver;
  client_internal::ScopedContext scope(d, gpu->ctx);
  const client_internal::CUevent event = gpu->fence_events[fence_.seq % gpu->fence_events.size()];
  return d.Check(d.cuStreamWaitEvent(static_cast<client_internal::CUstream>(stream), event, 0),
                 "cuStreamWaitEvent on promotion fence " + std::to_string(fence_.seq));
}

Status WriteLease::RecordWritten(void* stream) {
  if (!attachment_ || id_ == 0) return FailedPrecondition("RecordWritten on a released write lease");
  client_internal::GpuState* gpu = attachment_->gpu.get();
  if (gpu == nullptr) {
    return FailedPrecondition(std::string("RecordWritten: kvtierd runs the ") +
                              wire::BackendKindName(attachment_->welcome.backend) +
                              " backend, whose blocks the CPU writes; there is no GPU work to record");
  }
  if (!writer_event_) {
    auto e = gpu->TakeWriterEvent(attachment_);
    if (!e.ok()) return e.status();
    writer_event_ = std::move(e).value();
  }
  const auto& d = *gpu->driver;
  client_internal::ScopedContext scope(d, gpu->ctx);
  return d.Check(d.cuEventRecord(writer_event_->event, static_cast<client_internal::CUstream>(stream)),
                 "cuEventRecord of the writer event");
}

// --- Client ------------------------------------------------------------------------

Client::Client(ClientOptions options) : options_(std::move(options)), core_(std::make_shared<Core>(options_)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  {
    std::lock_guard lock(c->core_->mu);
    KVTIER_RETURN_IF_ERROR(c->core_->Connect());
  }
  return c;
}

Status Client::Reconnect() {
  std::lock_guard lock(core_->mu);
  return core_->Connect();
}

const ModelProfile& Client::profile() const { return core_->attachment()->welcome.profile; }
const Namespace& Client::ns() const { return core_->attachment()->welcome.ns; }
std::string Client::backend() const { return wire::BackendKindName(core_->attachment()->welcome.backend); }
uint64_t Client::instance_id() const { return core_->attachment()->welcome.instance_id; }
uint32_t Client::client_id() const { return core_->attachment()->welcome.client_id; }

std::vector<BlockKey> Client::Keys(std::span<const TokenId> tokens, const BlockKey& parent) const {
  const auto att = core_->attachment();
  const uint32_t bt = att->welcome.profile.block_tokens;
  std::vector<BlockKey> keys(tokens.size() / bt);
  ComputeKeys(att->welcome.ns, parent, tokens, bt, keys);
  return keys;
}

size_t Client::Probe(std::span<const TokenId> tokens, std::span<Tier> tiers) const {
  const auto att = core_->attachment();
  const uint32_t bt = att->welcome.profile.block_tokens;
  const size_t n = tokens.size() / bt;
  constexpr size_t kStackKeys = 512;
  BlockKey stack_keys[kStackKeys];
  std::vector<BlockKey> heap_keys;
  std::span<BlockKey> keys(stack_keys, std::min(n, kStackKeys));
  if (n > kStackKeys) {
    heap_keys.resize(n);
    keys = heap_keys;
  }
  ComputeKeys(att->welcome.ns, BlockKey{}, tokens, bt, keys);
  return att->index.LongestPrefix(BlockKey{}, keys, NamespaceTag(att->welcome.ns), tokens, tiers);
}

size_t Client::ProbeKeys(std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                         std::span<Tier> tiers) const {
  const auto att = core_->attachment();
  return att->index.LongestPrefix(BlockKey{}, keys, NamespaceTag(att->welcome.ns), tokens, tiers);
}

Result<Lease> Client::Acquire(std::string_view session, std::span<const TokenId> tokens, bool promote) {
  const std::vector<BlockKey> keys = Keys(tokens);
  return AcquireKeys(session, keys, tokens.first(keys.size() * block_tokens()), promote);
}

Result<Lease> Client::AcquireKeys(std::string_view session, std::span<const BlockKey> keys,
                                  std::span<const TokenId> tokens, bool promote) {
  wire::AcquireRequest req;
  req.session = std::string(session);
  req.flags = promote ? wire::kAcquirePromote : 0;
  req.keys.assign(keys.begin(), keys.end());
  req.tokens.assign(tokens.begin(), tokens.end());
  // The reply and the attachment must belong to one connection generation.
  auto reply = Expect<wire::AcquireResponse>(core_->Call(req, /*retry=*/true));
  if (!reply.ok()) return reply.status();
  Lease lease;
  lease.core_ = core_;
  lease.attachment_ = core_->attachment();
  lease.generation_ = core_->current_generation();
  lease.id_ = reply->lease_id;
  lease.matched_ = reply->matched;
  lease.promoted_ = reply->promoted;
  lease.fence_ = reply->fence;
  lease.slot_bytes_ = lease.attachment_->welcome.profile.BlockBytes();
  lease.blocks_.reserve(reply->blocks.size());
  for (const wire::BlockLoc& b : reply->blocks) {
    const auto& pool = lease.attachment_->welcome.pools[static_cast<int>(b.tier)];
    if (b.slot >= pool.slots) return ProtocolError("acquire reply names a slot outside its pool");
    lease.blocks_.push_back(BlockRef{b.tier, b.slot, lease.attachment_->SlotData(b.tier, b.slot)});
  }
  return lease;
}

Result<WriteLease> Client::Allocate(uint32_t blocks) {
  auto reply = Expect<wire::AllocateResponse>(core_->Call(wire::AllocateRequest{blocks}, /*retry=*/true));
  if (!reply.ok()) return reply.status();
  WriteLease lease;
  lease.core_ = core_;
  lease.attachment_ = core_->attachment();
  lease.generation_ = core_->current_generation();
  lease.id_ = reply->lease_id;
  lease.slot_bytes_ = lease.attachment_->welcome.profile.BlockBytes();
  const auto& pool = lease.attachment_->welcome.pools[static_cast<int>(Tier::kGpu)];
  for (uint32_t s : reply->slots) {
    if (s >= pool.slots) return ProtocolError("allocate reply names a slot outside the gpu pool");
    lease.slots_.push_back(s);
    lease.data_.push_back(lease.attachment_->SlotData(Tier::kGpu, s));
  }
  return lease;
}

Result<CommitResult> Client::Commit(WriteLease& lease, std::string_view session, const BlockKey& parent,
                                    uint32_t start_block, std::span<const TokenId> tokens,
                                    std::span<const uint32_t> slot_indices) {
  const uint32_t bt = block_tokens();
  if (tokens.size() % bt != 0) {
    return InvalidArgument("commit of " + std::to_string(tokens.size()) + " tokens: not whole " + std::to_string(bt) +
                           "-token blocks");
  }
  const size_t n = tokens.size() / bt;
  std::vector<uint32_t> idx(slot_indices.begin(), slot_indices.end());
  if (idx.empty()) {
    for (uint32_t i = 0; i < n; ++i) idx.push_back(i);
  }
  if (idx.size() != n) return InvalidArgument("commit: one slot index per block");
  if (lease.id_ == 0) return FailedPrecondition("commit through a released write lease");
  if (lease.generation_ != core_->current_generation()) {
    return Unavailable("the write lease ended with its connection to kvtierd");
  }
  wire::CommitRequest req;
  req.lease_id = lease.id_;
  req.session = std::string(session);
  req.parent = parent;
  req.start_block = start_block;
  req.tokens.assign(tokens.begin(), tokens.end());
  for (uint32_t i : idx) {
    if (i >= lease.slots_.size()) return InvalidArgument("commit: slot index " + std::to_string(i) + " out of range");
    req.slots.push_back(lease.slots_[i]);
  }
  if (lease.writer_event_) req.writer_event = lease.writer_event_->handle;
  auto reply = Expect<wire::CommitResponse>(core_->Call(req, /*retry=*/false));
  if (!reply.ok()) return reply.status();
  // Committed slots now belong to the cache, not to the lease (O(n): one mark per slot).
  std::vector<bool> committed(lease.slots_.size(), false);
  for (uint32_t i : idx) committed[i] = true;
  std::vector<uint32_t> keep_slots;
  std::vector<std::byte*> keep_data;
  for (size_t i = 0; i < lease.slots_.size(); ++i) {
    if (!committed[i]) {
      keep_slots.push_back(lease.slots_[i]);
      keep_data.push_back(lease.data_[i]);
    }
  }
  lease.slots_ = std::move(keep_slots);
  lease.data_ = std::move(keep_data);
  return CommitResult{reply->stored, reply->duplicates};
}

Result<uint32_t> Client::Prefetch(std::string_view session) {
  auto r = Expect<wire::CountResponse>(core_->Call(wire::PrefetchRequest{std::string(session)}, true));
  if (!r.ok()) return r.status();
  return r->count;
}

Result<uint32_t> Client::Demote(std::string_view session) {
  auto r = Expect<wire::CountResponse>(core_->Call(wire::DemoteRequest{std::string(session)}, true));
  if (!r.ok()) return r.status();
  return r->count;
}

Result<uint32_t> Client::Evict(std::string_view session, std::string_view tenant) {
  auto r = Expect<wire::CountResponse>(
      core_->Call(wire::EvictRequest{std::string(session), std::string(tenant), false}, true));
  if (!r.ok()) return r.status();
  return r->count;
}

Result<uint32_t> Client::EvictTenant(std::string_view tenant) {
  auto r = Expect<wire::CountResponse>(core_->Call(wire::EvictRequest{"", std::string(tenant), false}, true));
  if (!r.ok()) return r.status();
  return r->count;
}

Result<uint32_t> Client::EvictAll() {
  auto r = Expect<wire::CountResponse>(core_->Call(wire::EvictRequest{"", "", true}, true));
  if (!r.ok()) return r.status();
  return r->count;
}

Status Client::SetPriority(std::string_view session, int priority, std::chrono::milliseconds ttl) {
  if (ttl.count() < 0) return InvalidArgument("priority ttl must not be negative");
  const wire::SetPriorityRequest request{std::string(session), priority, static_cast<uint64_t>(ttl.count())};
  auto r = Expect<wire::OkResponse>(core_->Call(request, true));
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::vector<wire::SessionSummary>> Client::ListSessions(std::string_view tenant_filter) {
  auto r = Expect<wire::ListSessionsResponse>(core_->Call(wire::ListSessionsRequest{std::string(tenant_filter)}, true));
  if (!r.ok()) return r.status();
  return std::move(r->sessions);
}

Result<wire::SessionInfoResponse> Client::GetSession(std::string_view session) {
  return Expect<wire::SessionInfoResponse>(core_->Call(wire::SessionInfoRequest{std::string(session)}, true));
}

Result<std::vector<std::pair<std::string, double>>> Client::Stats() {
  auto r = Expect<wire::StatsResponse>(core_->Call(wire::StatsRequest{}, true));
  if (!r.ok()) return r.status();
  return std::move(r->values);
}

Result<std::string> Client::Config() {
  auto r = Expect<wire::ConfigResponse>(core_->Call(wire::ConfigRequest{}, true));
  if (!r.ok()) return r.status();
  return std::move(r->yaml);
}

Result<std::chrono::nanoseconds> Client::Ping() {
  const auto start = client_internal::Clock::now();
  auto r = Expect<wire::Pong>(core_->Call(wire::Ping{42}, true));
  if (!r.ok()) return r.status();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(client_internal::Clock::now() - start);
}

Status Client::WaitFence(const Fence& fence, std::chrono::milliseconds timeout) const {
  return client_internal::WaitCompleted(*core_->attachment(), fence, timeout);
}

}  // namespace kvtier
