// GpuPoolHandle: how another process maps a GPU pool, as the bytes carried in
// PoolHandle::ipc_handle.
//
// Encoding (little-endian, 80 bytes for kind 0):
//   u8 version (1) | u8 kind | u16 reserved (0) | u32 raw_bytes | u64 bytes | raw[raw_bytes]
// `kind` says how `raw` is interpreted, so a later export (VMM fabric handle, a
// file descriptor passed over the socket) adds a kind without a new layout.
// Pure C++: encoding and decoding need no CUDA headers or runtime.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::tiering {

enum class GpuHandleKind : uint8_t {
  kCudaIpc = 0,  // raw: a cudaIpcMemHandle_t; open with cudaIpcOpenMemHandle.
};

inline constexpr uint8_t kGpuPoolHandleVersion = 1;
inline constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t), checked where CUDA is compiled.

struct GpuPoolHandle {
  GpuHandleKind kind = GpuHandleKind::kCudaIpc;
  uint64_t bytes = 0;  // Size of the exported allocation.
  std::array<uint8_t, kCudaIpcHandleBytes> raw{};

  friend bool operator==(const GpuPoolHandle&, const GpuPoolHandle&) = default;
};

std::vector<uint8_t> EncodeGpuPoolHandle(const GpuPoolHandle& handle);
// kProtocolError for a short, long or unknown-version encoding; kInvalidArgument
// for a kind this build does not know.
Result<GpuPoolHandle> DecodeGpuPoolHandle(std::span<const uint8_t> bytes);

}  // namespace kvtier::tiering
