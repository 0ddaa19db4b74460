// Choosing the backend named by the `backend:` configuration value.
//
//   auto  cuda when this build has the CUDA backend and a device is visible, else host
//   host  always host
//   cuda  cuda, or an error naming why not (no device, built without CUDA)
#pragma once

#include <string>
#include <string_view>

#include "kvtier/status.h"
#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

struct GpuInfo {
  bool built_with_cuda = false;  // This build has the CUDA backend (KVTIER_WITH_CUDA).
  int devices = 0;               // cudaGetDeviceCount; 0 on error.
  std::string error;             // Why there is no device ("cudaGetDeviceCount: ..."); "" when devices > 0.
  std::string device_name;       // Device 0's name; "" without a device.
  // Device 0 supports interprocess events (cudaDevAttrIpcEventSupport), which
  // the cuda backend's fences and writer events need: false on some platforms
  // (WSL, some embedded and virtualized GPUs) and without a device.
  bool ipc_events = false;
};

// Asks the CUDA runtime; never fails. Cheap enough for start-up, not for a loop
// (the first call initializes the runtime).
GpuInfo DetectGpu();

struct BackendChoice {
  BackendKind kind = BackendKind::kHost;
  std::string reason;  // One line for the start-up log: what was chosen and why.
};

// kInvalidArgument for a value other than auto/host/cuda; kFailedPrecondition for
// "cuda" without a usable device: "backend: cuda: no CUDA device found (...)".
Result<BackendChoice> ChooseBackend(std::string_view config_value, const GpuInfo& gpu);
// As above, calling DetectGpu() unless the value is "host".
Result<BackendChoice> ChooseBackend(std::string_view config_value);

}  // namespace kvtier::tiering
