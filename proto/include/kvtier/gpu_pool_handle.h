// GpuPoolHandle: how another process maps a GPU pool, carried as the bytes of
// wire::PoolDesc::ipc_handle. It lives in proto because both sides need it: the
// daemon's CUDA backend encodes it, libkvtier decodes it at attach.
//
// Encoding (little-endian; 96 bytes for kind 0):
//   u8 version (2) | u8 kind | u16 reserved (0) | u32 raw_bytes | u64 bytes |
//   u8 device_uuid[16] | raw[raw_bytes]
// `device_uuid` names the physical GPU holding the pool (cuDeviceGetUuid), so a
// client opens it on the same device whatever its CUDA_VISIBLE_DEVICES ordinal.
// `kind` says how `raw` is interpreted, so a later export (a VMM handle, a file
// descriptor passed over the socket) adds a kind without a new layout.
// Version 1 (no UUID) is no longer read. Pure C++: no CUDA headers or runtime.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

enum class GpuHandleKind : uint8_t {
  kCudaIpc = 0,  // raw: a cudaIpcMemHandle_t / CUipcMemHandle; open with cuIpcOpenMemHandle.
};

inline constexpr uint8_t kGpuPoolHandleVersion = 2;
inline constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t), checked where CUDA is compiled.
inline constexpr size_t kGpuUuidBytes = 16;        // sizeof(CUuuid).
inline constexpr size_t kGpuPoolHandleHeaderBytes = 16 + kGpuUuidBytes;

using GpuUuid = std::array<uint8_t, kGpuUuidBytes>;

struct GpuPoolHandle {
  GpuHandleKind kind = GpuHandleKind::kCudaIpc;
  uint64_t bytes = 0;  // Size of the exported allocation; > 0.
  GpuUuid device_uuid{};  // Never all zero.
  std::array<uint8_t, kCudaIpcHandleBytes> raw{};

  friend bool operator==(const GpuPoolHandle&, const GpuPoolHandle&) = default;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string FormatGpuUuid(const GpuUuid& uuid);

// REQUIRES: handle.bytes > 0 and a non-zero device_uuid (else the reader rejects it).
std::vector<uint8_t> EncodeGpuPoolHandle(const GpuPoolHandle& handle);
// kProtocolError for a short or long encoding, another version, non-zero
// reserved bits, a raw size that does not fit the kind, a zero allocation size or
// an all-zero UUID; kInvalidArgument for a kind this build does not know.
Result<GpuPoolHandle> DecodeGpuPoolHandle(std::span<const uint8_t> bytes);

}  // namespace kvtier
