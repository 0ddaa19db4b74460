// Attachment: mapping and validating the segments a Welcome names.
#include "attachment.h"

#include <atomic>
#include <thread>
#include <utility>

namespace kvtier::client_internal {

Result<std::shared_ptr<const Attachment>> Attachment::Map(wire::Welcome welcome, std::span<const int> fds,
                                                          bool open_gpu) {
  auto att = std::make_shared<Attachment>();
  att->gpu_open = open_gpu;
  // Descriptors are taken in order as the segments are mapped (the cuda
  // backend's GPU pool, which comes without one, is opened first); every one
  // must be used.
  auto next = [&fds, i = size_t{0}](const std::string& what) mutable -> Result<int> {
    if (i == fds.size()) return ProtocolError("Welcome came without a descriptor for " + what);
    return fds[i++];
  };
  const bool cuda = welcome.backend == wire::BackendKind::kCuda;
  if (!cuda && !welcome.fence_events.empty()) return ProtocolError("Welcome: fence events from a host backend");
  if (welcome.pools.size() != kTierCount) {
    return ProtocolError("Welcome must describe " + std::to_string(kTierCount) + " pools");
  }
  for (Tier t : kTiers) {
    const wire::PoolDesc& d = welcome.pools[TierIndex(t)];
    if (d.tier != t) return ProtocolError("Welcome pools out of order");
    if (d.slot_bytes != welcome.profile.BlockBytes()) return ProtocolError("pool slot size does not match the profile");
    if (cuda && t == Tier::kGpu) {
      auto h = DecodeGpuPoolHandle(d.ipc_handle);
      if (!h.ok()) return Status(h.status().code(), "Welcome: " + h.status().message());
      if (h->bytes < d.slot_bytes * d.slots) return ProtocolError("Welcome: GPU pool smaller than its slots");
      if (!open_gpu) continue;
      auto gpu = GpuAttachment::Open(*h, welcome.fence_events);
      if (!gpu.ok()) return gpu.status();
      att->gpu = std::move(gpu).value();
      continue;
    }
    if (!d.ipc_handle.empty()) return ProtocolError("Welcome: an IPC handle for a pool of the host backend");
    // Workers write the blocks of their write leases into the GPU tier; only
    // kvtierd writes the host tier (the segment's seals enforce it).
    auto fd = next("pool " + d.shm_name);
    if (!fd.ok()) return fd.status();
    if (t == Tier::kGpu && !open_gpu) continue;
    auto seg = ShmSegment::MapPassed(*fd, /*writable=*/t == Tier::kGpu, d.slot_bytes * d.slots, d.shm_name);
    if (!seg.ok()) return Status(seg.status().code(), "mapping pool: " + seg.status().message());
    att->pools[t] = std::move(seg).value();
  }
  auto index_fd = next("the index");
  if (!index_fd.ok()) return index_fd.status();
  auto idx = ShmSegment::MapPassed(*index_fd, /*writable=*/false, sizeof(IndexHeader), welcome.index_segment);
  if (!idx.ok()) return Status(idx.status().code(), "mapping index: " + idx.status().message());
  att->index_segment = std::move(idx).value();
  auto view = IndexView::Attach(att->index_segment.data(), att->index_segment.size());
  if (!view.ok()) return view.status();
  att->index = *view;
  if (att->index.block_tokens() != welcome.profile.block_tokens ||
      att->index.header().profile_fingerprint != welcome.profile.Fingerprint()) {
    return Corrupt("index segment does not belong to the announced profile");
  }
  auto fences_fd = next("the fences");
  if (!fences_fd.ok()) return fences_fd.status();
  auto fences = ShmSegment::MapPassed(*fences_fd, /*writable=*/false, sizeof(FenceSegment), welcome.fence_segment);
  if (!fences.ok()) return Status(fences.status().code(), "mapping fences: " + fences.status().message());
  att->fence_segment = std::move(fences).value();
  if (att->fence_segment.size() < sizeof(FenceSegment)) return Corrupt("fence segment too small");
  att->fences = reinterpret_cast<const FenceSegment*>(att->fence_segment.data());
  if (att->fences->magic != kFenceMagic) return Corrupt("fence segment has a bad magic number");
  if (auto extra = next("nothing"); extra.ok()) {
    return ProtocolError("Welcome came with more segment descriptors than it describes");
  }
  att->welcome = std::move(welcome);
  return std::shared_ptr<const Attachment>(std::move(att));
}

std::byte* Attachment::SlotData(Tier tier, uint32_t slot) const {
  const size_t offset = size_t{slot} * pool(tier).slot_bytes;
  if (tier == Tier::kGpu && !gpu_open) return nullptr;
  if (tier == Tier::kGpu && gpu) return gpu->base() + offset;
  return pools[tier].data() + offset;
}

uint64_t Attachment::Completed(CopyDirection stream) const {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(fences->completed[static_cast<int>(stream)]))
      .load(std::memory_order_acquire);
}

Status Attachment::WaitCompleted(const Fence& fence, std::chrono::milliseconds timeout) const {
  using Clock = std::chrono::steady_clock;
  if (fence.IsNull() || Completed(fence.stream) >= fence.seq) return Status::Ok();
  const auto deadline = Clock::now() + timeout;
  for (int spin = 0;; ++spin) {
    if (Completed(fence.stream) >= fence.seq) return Status::Ok();
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

}  // namespace kvtier::client_internal
