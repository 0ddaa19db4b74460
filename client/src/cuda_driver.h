// CudaDriver: the few CUDA driver API entry points libkvtier needs to attach to
// a GPU pool, loaded with dlopen at attach time.
//
// libkvtier does not link the CUDA runtime (a worker brings its own, usually
// dynamically through its framework) and needs no CUDA headers: the handful of
// driver types used here are declared below with the driver's ABI. On a machine
// without a driver, Load fails with kUnavailable naming the library, and only
// clients of a cuda-backend kvtierd ever call it.
//
// Everything is used in the device's primary context, the context the CUDA
// runtime (and so PyTorch, libtorch, ...) uses, so device pointers and streams
// the worker owns and the ones opened here are interchangeable.
#pragma once

#include <memory>
#include <string>

#include "kvtier/gpu_pool_handle.h"
#include "kvtier/status.h"

namespace kvtier::client_internal {

// Driver API types, as cuda.h declares them (ABI-stable since CUDA 4).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
struct CUipcMemHandle {
  char reserved[64];
};
struct CUipcEventHandle {
  char reserved[64];
};
struct CUuuid {
  char bytes[16];
};
inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorNotReady = 600;
inline constexpr unsigned kCuEventDisableTiming = 0x2;
inline constexpr unsigned kCuEventInterprocess = 0x4;
inline constexpr unsigned kCuIpcMemLazyEnablePeerAccess = 0x1;
inline constexpr unsigned kCuStreamNonBlocking = 0x1;

class CudaDriver {
 public:
  // dlopen()s `library`, resolves every entry point below and calls cuInit(0).
  // kUnavailable when the library is missing ("... libcuda.so.1 ...: no NVIDIA
  // driver on this machine?"), lacks an entry point, or cuInit fails.
  static Result<std::shared_ptr<const CudaDriver>> Load(const std::string& library = "libcuda.so.1");
  // The process-wide driver for the default library, loaded once (a failure is retried next call).
  static Result<std::shared_ptr<const CudaDriver>> Default();
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // Ok for CUDA_SUCCESS; otherwise `code` with "what: CUDA_ERROR_...: text".
  Status Check(CUresult r, const std::string& what, StatusCode code = StatusCode::kInternal) const;
  // The device whose UUID is `uuid`; kNotFound naming the UUID and the devices seen.
  Result<CUdevice> DeviceByUuid(const GpuUuid& uuid) const;
  const std::string& library() const { return library_; }

  // Entry points (legacy default-stream flavours, as the runtime's default).
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned) = nullptr;
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr) = nullptr;
  CUresult (*cuIpcOpenEventHandle)(CUevent*, CUipcEventHandle) = nullptr;
  CUresult (*cuIpcGetEventHandle)(CUipcEventHandle*, CUevent) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventQuery)(CUevent) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  // For tools and tests that have no runtime of their own.
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;

 private:
  CudaDriver() = default;
  void* dl_ = nullptr;
  std::string library_;
};

// Makes `ctx` current on this thread for the scope (push/pop), so driver calls
// land in the primary context whatever the thread had current.
class ScopedContext {
 public:
  ScopedContext(const CudaDriver& driver, CUcontext ctx) : driver_(driver) {
    ok_ = driver_.cuCtxPushCurrent(ctx) == kCudaSuccess;
  }
  ~ScopedContext() {
    CUcontext popped = nullptr;
    if (ok_) driver_.cuCtxPopCurrent(&popped);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  bool ok() const { return ok_; }

 private:
  const CudaDriver& driver_;
  bool ok_ = false;
};

}  // namespace kvtier::client_internal
