#include "kvtier/tiering/host_backend.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "kvtier/shm_segment.h"

namespace kvtier::tiering {
namespace {

class HostPool final : public Pool {
 public:
  HostPool(const PoolSpec& spec, ShmSegment segment)
      : Pool(spec.tier, spec.slot_bytes, spec.slots, segment.data()), segment_(std::move(segment)) {}

  PoolHandle Export() const override {
    PoolHandle h;
    h.backend = BackendKind::kHost;
    h.tier = tier();
    h.slot_bytes = slot_bytes();
    h.slots = slots();
    h.shm_name = segment_.name();
    return h;
  }

 private:
  ShmSegment segment_;
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
      : options_(std::move(options)), fence_segment_(std::move(fences)) {
    state_ = reinterpret_cast<FenceSegment*>(fence_segment_.data());
    std::memset(state_, 0, sizeof(FenceSegment));
    state_->magic = kFenceMagic;
    state_->abi_version = kShmAbiVersion;
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
    return "host (shared-memory pools, copy thread, segments /" + options_.name_prefix + ".*)";
  }

  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec& spec) override {
    if (spec.slot_bytes == 0 || spec.slots == 0) {
      return InvalidArgument("pool '" + spec.name + "' needs slot_bytes > 0 and slots > 0");
    }
    ShmSegment::CreateOptions o;
    o.populate = options_.populate;
    o.replace_existing = options_.replace_stale;
    auto seg = ShmSegment::Create("/" + options_.name_prefix + "." + spec.name, spec.slot_bytes * spec.slots, o);
    if (!seg.ok()) return seg.status();
    return std::unique_ptr<Pool>(new HostPool(spec, std::move(seg).value()));
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
      std::atomic_ref<uint64_t>(state_->submitted[s]).store(job.seq, std::memory_order_relaxed);
      queues_[s].push_back(std::move(job));
    }
    work_cv_.notify_one();
    return Fence{seq, dir};
  }

  bool IsComplete(const Fence& fence) const override {
    if (fence.IsNull()) return true;
    return completed(static_cast<int>(fence.stream)) >= fence.seq;
  }

  Status Wait(const Fence& fence, std::chrono::milliseconds timeout) const override {
    if (IsComplete(fence)) return Status::Ok();
    std::unique_lock lock(mu_);
    if (!done_cv_.wait_for(lock, timeout, [&] { return IsComplete(fence); })) {
      return Status(StatusCode::kTimeout, "copy fence " + std::to_string(fence.seq) + " still pending");
    }
    return Status::Ok();
  }

  void SetCompletionNotifier(std::function<void()> notify) override {
    std::lock_guard lock(notify_mu_);  // Once this returns, the old notifier is not running.
    notify_ = std::move(notify);
  }

  std::string FenceSegmentName() const override { return fence_segment_.name(); }

  CopyStats copy_stats(CopyDirection dir) const override {
    std::lock_guard lock(mu_);
    return stats_[static_cast<int>(dir)];
  }

 private:
  uint64_t completed(int s) const {
    return std::atomic_ref<uint64_t>(state_->completed[s]).load(std::memory_order_acquire);
  }

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
      lock.lock();
      CopyStats& st = stats_[s];
      ++st.batches;
      st.blocks += job.ops.size();
      st.bytes += job.ops.size() * job.bytes;
      st.busy_seconds += took.count();
      std::atomic_ref<uint64_t>(state_->completed[s]).store(job.seq, std::memory_order_release);
      done_cv_.notify_all();
      lock.unlock();
      {
        // Outside mu_: the notifier may take its caller's locks, and those callers
        // may submit or wait meanwhile.
        std::lock_guard notify_lock(notify_mu_);
        if (notify_) notify_();
      }
      lock.lock();
    }
  }

  HostBackendOptions options_;
  ShmSegment fence_segment_;
  FenceSegment* state_ = nullptr;

  mutable std::mutex mu_;
  mutable std::condition_variable done_cv_;
  std::condition_variable work_cv_;
  std::deque<CopyJob> queues_[kCopyStreams];  // GUARDED_BY(mu_)
  uint64_t submitted_[kCopyStreams] = {0, 0}; // GUARDED_BY(mu_)
  CopyStats stats_[kCopyStreams];             // GUARDED_BY(mu_)
  std::mutex notify_mu_;
  std::function<void()> notify_;              // GUARDED_BY(notify_mu_)
  bool stopping_ = false;                     // GUARDED_BY(mu_)
  std::thread worker_;
};

}  // namespace

const char* BackendKindName(BackendKind kind) { return kind == BackendKind::kCuda ? "cuda" : "host"; }

Result<std::unique_ptr<Backend>> CreateHostBackend(const HostBackendOptions& options) {
  ShmSegment::CreateOptions o;
  o.replace_existing = options.replace_stale;
  auto fences = ShmSegment::Create("/" + options.name_prefix + ".fences", sizeof(FenceSegment), o);
  if (!fences.ok()) return fences.status();
  return std::unique_ptr<Backend>(new HostBackend(options, std::move(fences).value()));
}

}  // namespace kvtier::tiering
