// The host backend: shared-memory pools and a copy thread as the DMA engine (host_backend.h).
#include "kvtier/tiering/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/tiering/fence_board.h"
#include "kvtier/shm_names.h"
#include "kvtier/shm_segment.h"

namespace kvtier::tiering {
namespace {

// The named segment of a persistent pool: the one an earlier run left, if this
// uid owns it and it has `bytes` (adopted = true), else a new one, owner-only.
// kPermissionDenied when the name is held by another uid (squatted): nothing
// of it is used.
Result<std::pair<ShmSegment, bool>> OpenPersistent(const std::string& name, size_t bytes) {
  auto old = ShmSegment::Open(name, /*writable=*/true);
  if (!old.ok() && old.status().code() == StatusCode::kPermissionDenied) return old.status();
  if (old.ok()) {
    if (old->file_owner() != ::geteuid()) {
      return Status(StatusCode::kPermissionDenied, "segment '" + name + "' belongs to uid " +
                                                       std::to_string(old->file_owner()) + ", not to this uid (" +
                                                       std::to_string(::geteuid()) + ")");
    }
    if (old->size() == bytes) {
      // It keeps its blocks, and is made owner-only: clients map it through
      // the read-only descriptor kvtierd passes them.
      if (::fchmod(old->share_fd(), 0600) != 0) {
        return Status(StatusCode::kPermissionDenied, "segment '" + name + "': fchmod: " + std::strerror(errno));
      }
      return std::make_pair(std::move(old).value(), true);
    }
  }
  ShmSegment::CreateOptions o;
  o.populate = false;  // HostPool faults it in, on its thread.
  o.replace_existing = old.ok();  // Ours, of another size: stale.
  o.mode = 0600;
  auto seg = ShmSegment::Create(name, bytes, o);
  if (!seg.ok()) {
    if (seg.status().code() == StatusCode::kAlreadyExists) {
      return Status(StatusCode::kPermissionDenied, seg.status().message() + " (held by another uid)");
    }
    return seg.status();
  }
  seg->Release();  // Never unlinked by this process.
  return std::make_pair(std::move(seg).value(), false);
}

#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;  // <linux/mman.h> of Linux 5.14.
#endif

// HostBackendOptions::populate: faults every page of a pool in on a thread of
// its own, in chunks, while kvtierd already serves (the kernel allocates the
// pages; nothing is written, so a copy into a slot meanwhile loses nothing, and
// a slot used before its turn takes its faults as without populate). Before,
// MAP_POPULATE did it inside the start: 0.9 s for two tiers of 1 GiB on an idle
// 2-core VM, and 7 to 12 s while vLLM engines took the cores, all of it before
// the socket listened. Kernels before 5.14 refuse the advice: the pages then
// fault in as they are used.
class Populator {
 public:
  Populator() = default;
  Populator(const Populator&) = delete;
  Populator& operator=(const Populator&) = delete;
  ~Populator() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

  void Start(std::byte* data, size_t bytes) {
    thread_ = std::thread([this, data, bytes] {
      constexpr size_t kChunk = size_t{32} << 20;  // Checks for the pool's end between chunks.
      for (size_t off = 0; off < bytes && !stop_.load(std::memory_order_relaxed); off += kChunk) {
        if (::madvise(data + off, std::min(kChunk, bytes - off), MADV_POPULATE_WRITE) != 0) return;
      }
    });
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class HostPool final : public Pool {
 public:
  HostPool(const PoolSpec& spec, ShmSegment segment, bool adopted, bool populate, std::string persistence_lost = "")
      : Pool(spec.tier, spec.slot_bytes, spec.slots, segment.data(), adopted), segment_(std::move(segment)) {
    persistence_lost_ = std::move(persistence_lost);
    if (populate) populator_.Start(segment_.data(), segment_.size());
  }

  PoolHandle Export() const override {
    PoolHandle h = BaseHandle(BackendKind::kHost);
    h.shm_name = segment_.name();
    h.fd = segment_.share_fd();
    h.clients_write = tier() == Tier::kGpu;
    return h;
  }

 private:
  ShmSegment segment_;
  Populator populator_;  // Declared after the segment: joined before it is unmapped.
};

struct CopyJob {
  uint64_t seq;
  std::byte* src;
  std::byte* dst;
  size_t bytes;
  std::vector<CopyOp> ops;
};

class HostBackend final : public Backend {
 public:
  HostBackend(HostBackendOptions options, ShmSegment fences)
      : options_(std::move(options)), board_(std::move(fences)) {
    worker_ = std::thread([this] { Run(); });
  }

  ~HostBackend() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }

  BackendKind kind() const override { return BackendKind::kHost; }
  std::string Describe() const override {
    return "host (sealed shared-memory pools, copy thread, segments " + options_.name_prefix + ".*)";
  }

  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) override {
    if (spec.slot_bytes == 0 || spec.slots == 0) {
      return InvalidArgument("pool '" + spec.name + "' needs slot_bytes > 0 and slots > 0");
    }
    const std::string name = shm_names::Segment(options_.name_prefix, spec.name);
    const size_t bytes = spec.slot_bytes * spec.slots;
    std::string lost;
    if (spec.persistent) {
      auto named = OpenPersistent(name, bytes);
      if (named.ok()) {
        return std::unique_ptr<Pool>(
            new HostPool(spec, std::move(named->first), named->second, options_.populate));
      }
      lost = named.status().message();
    }
    // Clients write the GPU tier (their write leases) and only read the host tier.
    const auto sharing = spec.tier == Tier::kGpu ? ShmSegment::Sharing::kReadWrite : ShmSegment::Sharing::kReadOnly;
    auto seg = ShmSegment::CreateSealed(name.substr(1), bytes, sharing, /*populate=*/false);
    if (!seg.ok()) return seg.status();
    return std::unique_ptr<Pool>(
        new HostPool(spec, std::move(seg).value(), false, options_.populate, std::move(lost)));
  }

  Result<Fence> SubmitCopies(CopyDirection dir, const Pool& src, const Pool& dst,
                             std::span<const CopyOp> ops) override {
    if (src.slot_bytes() != dst.slot_bytes()) return InvalidArgument("copy between pools of different slot sizes");
    const Tier want_src = dir == CopyDirection::kGpuToHost ? Tier::kGpu : Tier::kHost;
    if (src.tier() != want_src || dst.tier() == want_src) return InvalidArgument("copy direction does not match the pools' tiers");
    for (const CopyOp& op : ops) {
      if (op.src_slot >= src.slots() || op.dst_slot >= dst.slots()) return InvalidArgument("copy op slot out of range");
    }
    const int s = static_cast<int>(dir);
    CopyJob job{0, src.base(), dst.base(), src.slot_bytes(), std::vector<CopyOp>(ops.begin(), ops.end())};
    uint64_t seq = 0;
    {
      std::lock_guard lock(mu_);
      seq = job.seq = ++submitted_[s];
      board_.Submitted(s, seq);
      queues_[s].push_back(std::move(job));
    }
    work_cv_.notify_one();
    return Fence{seq, dir};
  }

  bool IsComplete(const Fence& fence) const override { return board_.IsComplete(fence); }
  Status Wait(const Fence& fence, std::chrono::milliseconds timeout) const override {
    return board_.Wait(fence, timeout);
  }
  void SetCompletionNotifier(std::function<void()> notify) override { board_.SetNotifier(std::move(notify)); }
  std::string FenceSegmentName() const override { return board_.name(); }
  int FenceSegmentFd() const override { return board_.share_fd(); }
  CopyStats copy_stats(CopyDirection dir) const override { return board_.stats(dir); }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !queues_[0].empty() || !queues_[1].empty(); });
      // Promotions first: a request waits on them.
      const int s = !queues_[static_cast<int>(CopyDirection::kHostToGpu)].empty()
                        ? static_cast<int>(CopyDirection::kHostToGpu)
                        : static_cast<int>(CopyDirection::kGpuToHost);
      if (queues_[s].empty()) {
        if (stopping_) return;
        continue;
      }
      CopyJob job = std::move(queues_[s].front());
      queues_[s].pop_front();
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      for (const CopyOp& op : job.ops) {
        std::memcpy(job.dst + size_t{op.dst_slot} * job.bytes, job.src + size_t{op.src_slot} * job.bytes, job.bytes);
      }
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      board_.Completed(s, job.seq, job.ops.size(), job.ops.size() * job.bytes, took.count());
      lock.lock();
    }
  }

  HostBackendOptions options_;
  FenceBoard board_;

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<CopyJob> queues_[kCopyStreams];  // GUARDED_BY(mu_)
  uint64_t submitted_[kCopyStreams] = {0, 0}; // GUARDED_BY(mu_)
  bool stopping_ = false;                     // GUARDED_BY(mu_)
  std::thread worker_;
};

}  // namespace


Result<std::unique_ptr<Backend>> CreateHostBackend(const HostBackendOptions& options) {
  auto fences = ShmSegment::CreateSealed(shm_names::Fences(options.name_prefix).substr(1), sizeof(FenceSegment),
                                         ShmSegment::Sharing::kReadOnly, /*populate=*/true);
  if (!fences.ok()) return fences.status();
  return std::unique_ptr<Backend>(new HostBackend(options, std::move(fences).value()));
}

}  // namespace kvtier::tiering
