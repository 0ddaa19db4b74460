// Allocator tuning for store fetches (allocator.h).
#include "kvtier/stores/allocator.h"

#include <malloc.h>

#include <algorithm>

namespace kvtier::stores {

void KeepFetchBuffers(uint64_t max_fetch_bytes) {
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(std::min<uint64_t>(max_fetch_bytes * 2, uint64_t{1} << 30)));
}

}  // namespace kvtier::stores
