// The CUDA backend's fences, promotion fence events and client event watches
// (cuda_backend_impl.h).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend_impl.h"
#include "cuda_pools.h"

namespace kvtier::tiering::cuda {
namespace {

// Events one client may have open in unfinished work (libkvtier reuses a few).
constexpr size_t kMaxClientEvents = 1024;

}  // namespace

bool CudaBackendImpl::IsComplete(const Fence& fence) const { return board_->IsComplete(fence); }

Status CudaBackendImpl::Wait(const Fence& fence, std::chrono::milliseconds timeout) const {
  return board_->Wait(fence, timeout);
}

void CudaBackendImpl::SetCompletionNotifier(std::function<void()> notify) { board_->SetNotifier(std::move(notify)); }

std::string CudaBackendImpl::FenceSegmentName() const { return board_->name(); }

int CudaBackendImpl::FenceSegmentFd() const { return board_->share_fd(); }

CopyStats CudaBackendImpl::copy_stats(CopyDirection dir) const { return board_->stats(dir); }

std::vector<wire::IpcEventHandle> CudaBackendImpl::PromotionFenceEvents() const {
  return {fence_handles_.begin(), fence_handles_.end()};
}

Result<uint64_t> CudaBackendImpl::WatchClientEvent(uint64_t client, const wire::IpcEventHandle& handle) {
  const ClientEventKey key{client, handle};
  auto it = client_events_.find(key);
  if (it == client_events_.end()) {
    KVTIER_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice"));
    if (CloseIdleEvents(client) >= kMaxClientEvents) {
      return ResourceExhausted("client holds " + std::to_string(kMaxClientEvents) +
                               " GPU events in unfinished work; it must reuse its events");
    }
    cudaIpcEventHandle_t raw;
    std::memcpy(&raw, handle.data(), sizeof(raw));
    cudaEvent_t event = nullptr;
    const cudaError_t err = cudaIpcOpenEventHandle(&event, raw);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return InvalidArgument("GPU event: cudaIpcOpenEventHandle: " + CudaErrorText(err) +
                             " (not an interprocess event of a live process on this GPU)");
    }
    it = client_events_.emplace(key, ClientEvent{event}).first;
  }
  ++it->second.watches;
  const uint64_t id = next_watch_++;
  watches_.emplace(id, it);
  return id;
}

Backend::WorkState CudaBackendImpl::QueryWatch(uint64_t watch) {
  const auto w = watches_.find(watch);
  if (w == watches_.end()) return WorkState::kDone;
  const cudaError_t err = cudaEventQuery(w->second->second.event);
  if (err == cudaSuccess) return WorkState::kDone;
  cudaGetLastError();  // Neither answer is an error of a later call.
  return err == cudaErrorNotReady ? WorkState::kPending : WorkState::kFailed;
}

void CudaBackendImpl::EndWatch(uint64_t watch) {
  const auto w = watches_.find(watch);
  if (w == watches_.end()) return;
  const auto it = w->second;
  watches_.erase(w);
  if (--it->second.watches == 0 && it->second.forgotten) {
    cudaEventDestroy(it->second.event);
    client_events_.erase(it);
  }
}

void CudaBackendImpl::ForgetClient(uint64_t client) { CloseIdleEvents(client, /*forget=*/true); }

size_t CudaBackendImpl::CloseIdleEvents(uint64_t client, bool forget) {
  size_t open = 0;
  for (auto it = client_events_.lower_bound(ClientEventKey{client, {}});
       it != client_events_.end() && it->first.client == client;) {
    if (it->second.watches == 0) {
      cudaEventDestroy(it->second.event);
      it = client_events_.erase(it);
    } else {
      it->second.forgotten = it->second.forgotten || forget;
      ++open;
      ++it;
    }
  }
  return open;
}

}  // namespace kvtier::tiering::cuda
