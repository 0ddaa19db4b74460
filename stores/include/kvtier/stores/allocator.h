// The process's allocator, tuned for store fetches: a fetch holds its records
// (a block each) until the engine takes them, and by default glibc hands such
// memory back to the kernel between fetches, so the next one faults it in again
// (512 page faults per fresh 2 MiB). Called once, from main, by a process that
// reads from stores (kvtierd with stores configured, the store benchmark).
#pragma once

#include <cstdint>

namespace kvtier::stores {

// One malloc arena (an I/O thread's own would unmap its heaps as they empty),
// blocks below 32 MiB from the heap, and up to 2 x max_fetch_bytes (at most
// 1 GiB) of freed memory kept for the next fetch.
void KeepFetchBuffers(uint64_t max_fetch_bytes);

}  // namespace kvtier::stores
