// The CUDA driver API, loaded with dlopen so libkvtier runs without a GPU (cuda_driver.h).
#include "cuda_driver.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

namespace kvtier::client_internal {
namespace {

// Resolves `name` into `fn`; records the first missing one.
template <typename F>
void Resolve(void* dl, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(::dlsym(dl, name));
  if (fn == nullptr && missing.empty()) missing = name;
}

}  // namespace

Result<std::shared_ptr<const CudaDriver>> CudaDriver::Load(const std::string& library) {
  void* dl = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) {
    const char* why = ::dlerror();
    return Unavailable("cannot load the CUDA driver (" + library + "): " + (why ? why : "dlopen failed") +
                       "; no NVIDIA driver on this machine? (a cuda-backend kvtierd needs one in every client)");
  }
  std::shared_ptr<CudaDriver> d(new CudaDriver());
  d->dl_ = dl;
  d->library_ = library;
  std::string missing;
  Resolve(dl, "cuInit", d->cuInit, missing);
  Resolve(dl, "cuGetErrorName", d->cuGetErrorName, missing);
  Resolve(dl, "cuGetErrorString", d->cuGetErrorString, missing);
  Resolve(dl, "cuDeviceGetCount", d->cuDeviceGetCount, missing);
  Resolve(dl, "cuDeviceGet", d->cuDeviceGet, missing);
  Resolve(dl, "cuDeviceGetUuid_v2", d->cuDeviceGetUuid, missing);
  Resolve(dl, "cuDevicePrimaryCtxRetain", d->cuDevicePrimaryCtxRetain, missing);
  Resolve(dl, "cuDevicePrimaryCtxRelease_v2", d->cuDevicePrimaryCtxRelease, missing);
  Resolve(dl, "cuCtxPushCurrent_v2", d->cuCtxPushCurrent, missing);
  Resolve(dl, "cuCtxPopCurrent_v2", d->cuCtxPopCurrent, missing);
  Resolve(dl, "cuIpcOpenMemHandle_v2", d->cuIpcOpenMemHandle, missing);
  Resolve(dl, "cuIpcCloseMemHandle", d->cuIpcCloseMemHandle, missing);
  Resolve(dl, "cuIpcOpenEventHandle", d->cuIpcOpenEventHandle, missing);
  Resolve(dl, "cuIpcGetEventHandle", d->cuIpcGetEventHandle, missing);
  Resolve(dl, "cuEventCreate", d->cuEventCreate, missing);
  Resolve(dl, "cuEventDestroy_v2", d->cuEventDestroy, missing);
  Resolve(dl, "cuEventRecord", d->cuEventRecord, missing);
  Resolve(dl, "cuEventQuery", d->cuEventQuery, missing);
  Resolve(dl, "cuEventSynchronize", d->cuEventSynchronize, missing);
  Resolve(dl, "cuStreamWaitEvent", d->cuStreamWaitEvent, missing);
  Resolve(dl, "cuCtxSynchronize", d->cuCtxSynchronize, missing);
  Resolve(dl, "cuStreamCreate", d->cuStreamCreate, missing);
  Resolve(dl, "cuStreamDestroy_v2", d->cuStreamDestroy, missing);
  Resolve(dl, "cuStreamSynchronize", d->cuStreamSynchronize, missing);
  Resolve(dl, "cuMemcpyDtoH_v2", d->cuMemcpyDtoH, missing);
  Resolve(dl, "cuMemcpyHtoD_v2", d->cuMemcpyHtoD, missing);
  if (!missing.empty()) {
    return Unavailable("the CUDA driver " + library + " has no entry point " + missing +
                       " (not a CUDA driver library, or one older than CUDA 11.4)");
  }
  KVTIER_RETURN_IF_ERROR(d->Check(d->cuInit(0), "cuInit (" + library + ")", StatusCode::kUnavailable));
  return std::shared_ptr<const CudaDriver>(std::move(d));
}

Result<std::shared_ptr<const CudaDriver>> CudaDriver::Default() {
  static std::mutex mu;
  static std::shared_ptr<const CudaDriver> loaded;
  std::lock_guard lock(mu);
  if (loaded) return loaded;
  auto d = Load();
  if (!d.ok()) return d.status();
  loaded = *d;
  return loaded;
}

CudaDriver::~CudaDriver() {
  if (dl_ != nullptr) ::dlclose(dl_);
}

Status CudaDriver::Check(CUresult r, const std::string& what, StatusCode code) const {
  if (r == kCudaSuccess) return Status::Ok();
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(r, &name) != kCudaSuccess) name = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(r, &text) != kCudaSuccess) text = nullptr;
  return Status(code, what + ": " + (name ? name : "CUDA error " + std::to_string(r)) + (text ? std::string(": ") + text : ""));
}

Result<CUdevice> CudaDriver::DeviceByUuid(const GpuUuid& uuid) const {
  int count = 0;
  KVTIER_RETURN_IF_ERROR(Check(cuDeviceGetCount(&count), "cuDeviceGetCount", StatusCode::kUnavailable));
  std::string seen;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    CUuuid u{};
    KVTIER_RETURN_IF_ERROR(Check(cuDeviceGet(&dev, i), "cuDeviceGet"));
    KVTIER_RETURN_IF_ERROR(Check(cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid"));
    GpuUuid got{};
    std::memcpy(got.data(), u.bytes, got.size());
    if (got == uuid) return dev;
    seen += (seen.empty() ? "" : ", ") + FormatGpuUuid(got);
  }
  return NotFound("kvtierd's GPU pool lies on " + FormatGpuUuid(uuid) + ", which this process does not see (" +
                  std::to_string(count) + " device(s)" + (seen.empty() ? "" : ": " + seen) +
                  "; check CUDA_VISIBLE_DEVICES)");
}

}  // namespace kvtier::client_internal
