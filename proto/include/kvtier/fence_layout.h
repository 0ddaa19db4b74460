// Host-backend fences as they lie in shared memory.
//
// Copies run in two ordered streams (promotions host->gpu, demotions gpu->host).
// Each stream's batches complete in submission order, so a fence is just
// (stream, sequence): complete once completed[stream] >= sequence. The daemon's
// copy thread is the only writer; clients map the segment read-only and poll.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kvtier {

inline constexpr uint64_t kFenceMagic = 0x45434e45464b5631ULL;  // "1VKFENCE"
inline constexpr int kCopyStreams = 2;

enum class CopyDirection : uint8_t { kGpuToHost = 0, kHostToGpu = 1 };

struct Fence {
  uint64_t seq = 0;  // 0: nothing to wait for.
  CopyDirection stream = CopyDirection::kHostToGpu;

  bool IsNull() const { return seq == 0; }
  friend bool operator==(const Fence&, const Fence&) = default;
};

struct FenceSegment {
  uint64_t magic;
  uint32_t abi_version;
  uint32_t reserved;
  alignas(64) uint64_t completed[kCopyStreams];  // Written with release stores.
  alignas(64) uint64_t submitted[kCopyStreams];  // Informational.
};
static_assert(std::is_trivially_copyable_v<FenceSegment> && std::is_standard_layout_v<FenceSegment>);

}  // namespace kvtier
