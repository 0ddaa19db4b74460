#include "kvtier/gpu_pool_handle.h"

#include <algorithm>
#include <cstdio>

namespace kvtier {
namespace {

void PutLe(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t GetLe(std::span<const uint8_t> in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[at + i]} << (8 * i);
  return v;
}

}  // namespace

std::string FormatGpuUuid(const GpuUuid& uuid) {
  std::string out = "GPU-";
  char hex[3];
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof(hex), "%02x", uuid[i]);
    out += hex;
  }
  return out;
}

std::vector<uint8_t> EncodeGpuPoolHandle(const GpuPoolHandle& handle) {
  std::vector<uint8_t> out;
  out.reserve(kGpuPoolHandleHeaderBytes + handle.raw.size());
  PutLe(out, kGpuPoolHandleVersion, 1);
  PutLe(out, static_cast<uint8_t>(handle.kind), 1);
  PutLe(out, 0, 2);
  PutLe(out, handle.raw.size(), 4);
  PutLe(out, handle.bytes, 8);
  out.insert(out.end(), handle.device_uuid.begin(), handle.device_uuid.end());
  out.insert(out.end(), handle.raw.begin(), handle.raw.end());
  return out;
}

Result<GpuPoolHandle> DecodeGpuPoolHandle(std::span<const uint8_t> bytes) {
  if (bytes.size() < kGpuPoolHandleHeaderBytes) {
    return ProtocolError("gpu pool handle: " + std::to_string(bytes.size()) + " bytes, its header needs " +
                         std::to_string(kGpuPoolHandleHeaderBytes));
  }
  if (bytes[0] != kGpuPoolHandleVersion) {
    return ProtocolError("gpu pool handle: version " + std::to_string(bytes[0]) + ", this build reads version " +
                         std::to_string(kGpuPoolHandleVersion));
  }
  if (bytes[1] != static_cast<uint8_t>(GpuHandleKind::kCudaIpc)) {
    return InvalidArgument("gpu pool handle: unknown kind " + std::to_string(bytes[1]));
  }
  if (GetLe(bytes, 2, 2) != 0) return ProtocolError("gpu pool handle: reserved bytes are not 0");
  GpuPoolHandle h;
  h.kind = GpuHandleKind::kCudaIpc;
  const uint64_t raw_bytes = GetLe(bytes, 4, 4);
  if (raw_bytes != h.raw.size() || bytes.size() != kGpuPoolHandleHeaderBytes + raw_bytes) {
    return ProtocolError("gpu pool handle: a cuda ipc handle of " + std::to_string(raw_bytes) + " bytes in a " +
                         std::to_string(bytes.size()) + "-byte encoding; expected " + std::to_string(h.raw.size()) +
                         " bytes in " + std::to_string(kGpuPoolHandleHeaderBytes + h.raw.size()));
  }
  h.bytes = GetLe(bytes, 8, 8);
  if (h.bytes == 0) return ProtocolError("gpu pool handle: allocation size 0");
  std::copy_n(bytes.begin() + 16, kGpuUuidBytes, h.device_uuid.begin());
  if (std::all_of(h.device_uuid.begin(), h.device_uuid.end(), [](uint8_t b) { return b == 0; })) {
    return ProtocolError("gpu pool handle: device uuid is all zero");
  }
  std::copy(bytes.begin() + kGpuPoolHandleHeaderBytes, bytes.end(), h.raw.begin());
  return h;
}

}  // namespace kvtier
