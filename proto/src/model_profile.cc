#include "kvtier/model_profile.h"

#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF32: return 4;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "fp32";
  }
  return "invalid";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "fp16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp32" || name == "float32" || name == "float") return DType::kF32;
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (expected fp16, bf16 or fp32)");
}

uint64_t ModelProfile::Fingerprint() const {
  const uint64_t fields[] = {layers, kv_heads, head_dim, static_cast<uint64_t>(dtype), block_tokens};
  return XXH3_64bits(fields, sizeof(fields));
}

Status ModelProfile::Validate() const {
  auto bad = [&](const char* field, const std::string& why) {
    return InvalidArgument("profile '" + name + "': " + field + " " + why);
  };
  if (layers == 0 || layers > 4096) return bad("layers", "must be in [1, 4096]");
  if (kv_heads == 0 || kv_heads > 4096) return bad("kv_heads", "must be in [1, 4096]");
  if (head_dim == 0 || head_dim > 4096) return bad("head_dim", "must be in [1, 4096]");
  if (DTypeSize(dtype) == 0) return bad("dtype", "is not fp16, bf16 or fp32");
  if (block_tokens == 0 || block_tokens > kMaxBlockTokens) {
    return bad("block_tokens", "must be in [1, " + std::to_string(kMaxBlockTokens) + "]");
  }
  if (BlockBytes() > kMaxBlockBytes) return bad("block size", "exceeds 1 GiB");
  return Status::Ok();
}

std::string ModelProfile::Describe() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s: %u layers x %u kv_heads x %u dim, %s, %u tokens/block (%.1f KiB)",
                name.c_str(), layers, kv_heads, head_dim, std::string(DTypeName(dtype)).c_str(),
                block_tokens, static_cast<double>(BlockBytes()) / 1024.0);
  return buf;
}

}  // namespace kvtier
