// Choosing the backend: what `backend: auto` picks on this machine (backend_select.h).
#include "kvtier/tiering/backend_select.h"

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::tiering {

GpuInfo DetectGpu() {
  GpuInfo info;
#ifdef KVTIER_HAVE_CUDA
  info.built_with_cuda = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    return info;
  }
  info.devices = count;
  if (count == 0) {
    info.error = "cudaGetDeviceCount: 0 devices";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) info.device_name = prop.name;
  int ipc = 0;
  info.ipc_events = cudaDeviceGetAttribute(&ipc, cudaDevAttrIpcEventSupport, 0) == cudaSuccess && ipc != 0;
#else
  info.error = "built without KVTIER_WITH_CUDA";
#endif
  return info;
}

Result<BackendChoice> ChooseBackend(std::string_view config_value, const GpuInfo& gpu) {
  const bool usable = gpu.built_with_cuda && gpu.devices > 0;
  const std::string device = gpu.device_name.empty() ? "device 0" : gpu.device_name;
  if (config_value == "host") return BackendChoice{BackendKind::kHost, "backend host (configured)"};
  const std::string no_ipc = device +
                             " does not support interprocess events (cudaDevAttrIpcEventSupport is 0), "
                             "which the cuda backend's fences need";
  if (config_value == "auto") {
    if (usable && !gpu.ipc_events) return BackendChoice{BackendKind::kHost, "backend host (auto: " + no_ipc + ")"};
    if (usable) {
      return BackendChoice{BackendKind::kCuda, "backend cuda (auto: " + std::to_string(gpu.devices) +
                                                   " CUDA device(s), using " + device + ")"};
    }
    return BackendChoice{BackendKind::kHost, "backend host (auto: no CUDA device: " + gpu.error + ")"};
  }
  if (config_value == "cuda") {
    if (!gpu.built_with_cuda) {
      return FailedPrecondition("backend: cuda: this build has no CUDA backend (built without KVTIER_WITH_CUDA)");
    }
    if (!usable) return FailedPrecondition("backend: cuda: no CUDA device found (" + gpu.error + ")");
    if (!gpu.ipc_events) return FailedPrecondition("backend: cuda: " + no_ipc + "; use backend: host or auto");
    return BackendChoice{BackendKind::kCuda, "backend cuda (configured, using " + device + ")"};
  }
  return InvalidArgument("backend: '" + std::string(config_value) + "' is not one of auto, host, cuda");
}

Result<BackendChoice> ChooseBackend(std::string_view config_value) {
  if (config_value == "host") return ChooseBackend(config_value, GpuInfo{});
  return ChooseBackend(config_value, DetectGpu());
}

}  // namespace kvtier::tiering
