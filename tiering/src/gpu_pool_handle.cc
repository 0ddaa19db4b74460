#include "kvtier/tiering/gpu_pool_handle.h"

#include <algorithm>
#include <string>

namespace kvtier::tiering {
namespace {

constexpr size_t kHeaderBytes = 16;

void PutLe(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t GetLe(std::span<const uint8_t> in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[at + i]} << (8 * i);
  return v;
}

}  // namespace

std::vector<uint8_t> EncodeGpuPoolHandle(const GpuPoolHandle& handle) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + handle.raw.size());
  PutLe(out, kGpuPoolHandleVersion, 1);
  PutLe(out, static_cast<uint8_t>(handle.kind), 1);
  PutLe(out, 0, 2);
  PutLe(out, handle.raw.size(), 4);
  PutLe(out, handle.bytes, 8);
  out.insert(out.end(), handle.raw.begin(), handle.raw.end());
  return out;
}

Result<GpuPoolHandle> DecodeGpuPoolHandle(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return ProtocolError("gpu pool handle: " + std::to_string(bytes.size()) + " bytes, header needs " +
                         std::to_string(kHeaderBytes));
  }
  if (bytes[0] != kGpuPoolHandleVersion) {
    return ProtocolError("gpu pool handle: version " + std::to_string(bytes[0]) + ", this build reads " +
                         std::to_string(kGpuPoolHandleVersion));
  }
  if (bytes[1] != static_cast<uint8_t>(GpuHandleKind::kCudaIpc)) {
    return InvalidArgument("gpu pool handle: unknown kind " + std::to_string(bytes[1]));
  }
  GpuPoolHandle h;
  h.kind = GpuHandleKind::kCudaIpc;
  const uint64_t raw_bytes = GetLe(bytes, 4, 4);
  if (raw_bytes != h.raw.size() || bytes.size() != kHeaderBytes + raw_bytes) {
    return ProtocolError("gpu pool handle: cuda ipc handle of " + std::to_string(raw_bytes) + " bytes in a " +
                         std::to_string(bytes.size()) + "-byte encoding, expected " + std::to_string(h.raw.size()));
  }
  h.bytes = GetLe(bytes, 8, 8);
  std::copy(bytes.begin() + kHeaderBytes, bytes.end(), h.raw.begin());
  return h;
}

}  // namespace kvtier::tiering
