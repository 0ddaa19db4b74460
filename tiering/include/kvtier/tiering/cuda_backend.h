// CudaBackend: the backend on a GPU host.
//
// The GPU tier is one cudaMalloc per pool, exported to clients with
// cudaIpcGetMemHandle (PoolHandle::ipc_handle holds an encoded GpuPoolHandle,
// with the device's UUID).
// The host tier is a shared-memory segment, as on the host backend, pinned in
// place with cudaHostRegister so the copy engines reach it and clients still map
// it by name. Copies run on two streams: promotions (host->gpu) at the highest
// stream priority, demotions at the lowest. Fences are the host backend's: an
// event recorded after each batch is waited on by a completion thread per
// stream, which advances the stream's completed counter in the shared fence
// segment, so clients poll fences the same way on both backends (no host
// function holds a stream between batches).
// GPU-side fences: the promotion stream records one of kFenceEventRing
// interprocess events per batch (PromotionFenceEvents). Clients' events (the
// work that writes or reads GPU-tier blocks) are opened once per (client,
// handle) and polled with cudaEventQuery (WatchClientEvent): no stream of the
// daemon ever waits on a client's event.
//
// Built only with KVTIER_WITH_CUDA (target kvtier::cuda_backend).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

inline constexpr size_t kFenceEventRing = 64;  // Promotion fence events (seq % 64).

struct CudaBackendOptions {
  // Prefix of every segment's label: "<prefix>.<pool>", "<prefix>.fences" (the
  // segments are sealed and nameless; clients map them from passed descriptors).
  std::string name_prefix = "kvtier";
  int device = 0;
  bool populate = true;       // Pre-fault host pool pages at creation (pinning faults them anyway).
  // Host pools are pinned in chunks of about this many bytes (whole slots ending on
  // a page boundary), so a long pin reports progress.
  size_t pin_chunk_bytes = size_t{256} << 20;
  // Called after each pinned chunk on the creating thread: pool name, bytes pinned so far, total.
  std::function<void(const std::string& pool, size_t pinned, size_t total)> pin_progress;
  // Called (on the submitting thread) when the backend changes how it works
  // while serving, e.g. cudaMemcpyBatchAsync refused and per-copy memcpy used
  // from then on. Unset: nothing is said.
  std::function<void(const std::string& line)> warn;
};

class CudaBackend : public Backend {
 public:
  // True when large-block batches go through cudaMemcpyBatchAsync (CUDA 13 toolkit, driver >= 12.8);
  // false: one cudaMemcpyAsync per copy.
  virtual bool batched_memcpy() const = 0;
};

// kUnavailable when the device cannot be used (no driver, no device, no unified addressing).
Result<std::unique_ptr<CudaBackend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace kvtier::tiering
