// ModelProfile: the KV geometry of one model, and so the byte layout of a block.
//
// Block layout (one contiguous region per block, all layers):
//   for layer in [0, layers):  K then V, each a plane of
//     [block_tokens][kv_heads][head_dim] elements of `dtype`, row-major.
// So plane (layer, kv) starts at PlaneOffset(layer, kv) = (2*layer + kv) * PlaneBytes(),
// and a worker can view it as a [block_tokens, kv_heads, head_dim] tensor in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

enum class DType : uint8_t { kF16 = 0, kBF16 = 1, kF32 = 2 };

size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);  // "fp16", "bf16", "fp32"
Result<DType> ParseDType(std::string_view name);

inline constexpr uint32_t kMaxBlockTokens = 1024;
inline constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 30;

struct ModelProfile {
  std::string name;  // Human label; not part of the fingerprint.
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kF16;
  uint32_t block_tokens = 16;

  // Bytes of one K or V plane of one layer.
  size_t PlaneBytes() const {
    return size_t{block_tokens} * kv_heads * head_dim * DTypeSize(dtype);
  }
  // Bytes of one whole block: 2 planes per layer.
  size_t BlockBytes() const { return 2 * size_t{layers} * PlaneBytes(); }
  // REQUIRES: layer < layers, kv in {0 (K), 1 (V)}.
  size_t PlaneOffset(uint32_t layer, uint32_t kv) const {
    return (2 * size_t{layer} + kv) * PlaneBytes();
  }
  // 64-bit hash of the geometry (layers, heads, dim, dtype, block_tokens).
  // Two profiles with equal fingerprints have interchangeable blocks.
  uint64_t Fingerprint() const;
  // Every field in range and BlockBytes() <= kMaxBlockBytes.
  Status Validate() const;
  // "llama-8b: 32 layers x 8 kv_heads x 128 dim, bf16, 16 tokens/block (2.0 MiB)".
  std::string Describe() const;

  friend bool operator==(const ModelProfile&, const ModelProfile&) = default;
};

}  // namespace kvtier
