#include "model_config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvtier::model {
namespace {

Status ParseU32(std::string_view key, std::string_view v, uint32_t lo, uint32_t hi, uint32_t* out) {
  uint64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi) {
    return InvalidArgument(std::string(key) + ": expected an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got '" + std::string(v) + "'");
  }
  *out = static_cast<uint32_t>(x);
  return Status::Ok();
}

Status ParsePositive(std::string_view key, std::string_view v, double* out) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(x > 0) || x > 1e12) {
    return InvalidArgument(std::string(key) + ": expected a positive number, got '" + s + "'");
  }
  *out = x;
  return Status::Ok();
}

}  // namespace

Status SetModelField(ModelConfig& c, std::string_view key, std::string_view v) {
  if (key == "name") {
    if (v.empty()) return InvalidArgument("name: must not be empty");
    c.name = std::string(v);
    return Status::Ok();
  }
  if (key == "layers") return ParseU32(key, v, 1, 256, &c.layers);
  if (key == "hidden") return ParseU32(key, v, 8, 65536, &c.hidden);
  if (key == "heads") return ParseU32(key, v, 1, 1024, &c.heads);
  if (key == "kv_heads") return ParseU32(key, v, 1, 1024, &c.kv_heads);
  if (key == "head_dim") return ParseU32(key, v, 2, 1024, &c.head_dim);
  if (key == "intermediate") return ParseU32(key, v, 1, 1 << 20, &c.intermediate);
  if (key == "vocab") return ParseU32(key, v, 1, 1 << 20, &c.vocab);
  if (key == "rope_theta") return ParsePositive(key, v, &c.rope_theta);
  if (key == "rms_eps") return ParsePositive(key, v, &c.rms_eps);
  if (key == "dtype") {
    auto d = ParseDType(v);
    if (!d.ok()) return InvalidArgument("dtype: " + d.status().message());
    c.dtype = *d;
    return Status::Ok();
  }
  if (key == "seed") {
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), c.seed);
    if (ec != std::errc() || p != v.data() + v.size()) {
      return InvalidArgument("seed: expected an unsigned integer, got '" + std::string(v) + "'");
    }
    return Status::Ok();
  }
  if (key == "weights") {
    c.weights = std::string(v);
    return Status::Ok();
  }
  if (key == "tie_embeddings") {
    if (v != "true" && v != "false") return InvalidArgument("tie_embeddings: expected true or false");
    c.tie_embeddings = v == "true";
    return Status::Ok();
  }
  return InvalidArgument("unknown model key '" + std::string(key) + "'");
}

Status ModelConfig::Validate() const {
  if (heads % kv_heads != 0) {
    return InvalidArgument("heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" +
                           std::to_string(kv_heads) + ")");
  }
  if (head_dim % 2 != 0) return InvalidArgument("head_dim must be even (rotary embeddings rotate pairs)");
  if (vocab < 258) return InvalidArgument("vocab must be at least 258 (256 bytes + 2 special tokens)");
  return Profile(16).Validate();
}

ModelProfile ModelConfig::Profile(uint32_t block_tokens) const {
  ModelProfile p;
  p.name = name;
  p.layers = layers;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.dtype = dtype;
  p.block_tokens = block_tokens;
  return p;
}

std::string ModelConfig::Describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %u layers, hidden %u, %u heads (%u kv) x %u, ffn %u, vocab %u, %s%s",
                name.c_str(), layers, hidden, heads, kv_heads, head_dim, intermediate, vocab,
                std::string(DTypeName(dtype)).c_str(), weights.empty() ? ", seeded weights" : "");
  return buf;
}

Result<ModelConfig> ParseModelConfig(std::string_view yaml, std::string_view source, ModelConfig base) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string(source) + ": " + e.what());
  }
  if (root.IsMap() && root["model"]) root = root["model"];
  if (!root.IsMap()) return InvalidArgument(std::string(source) + ": expected a mapping of model keys");
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (!kv.second.IsScalar()) return InvalidArgument(std::string(source) + ": " + key + ": expected a scalar");
    Status s = SetModelField(base, key, kv.second.Scalar());
    if (!s.ok()) return InvalidArgument(std::string(source) + ": " + s.message());
  }
  Status s = base.Validate();
  if (!s.ok()) return InvalidArgument(std::string(source) + ": " + s.message());
  return base;
}

Result<ModelConfig> LoadModelConfig(const std::string& path, ModelConfig base) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open model config " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path, std::move(base));
}

}  // namespace kvtier::model
