#include "model_config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

namespace {

Result<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(std::string("cannot open ") + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<ModelConfig> LoadModelConfig(const std::string& path, ModelConfig base) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return LoadModelDirectory(path);
  auto text = ReadFile(path, "model config");
  if (!text.ok()) return text.status();
  return ParseModelConfig(*text, path, std::move(base));
}

Result<ModelConfig> ParseHfConfig(std::string_view text, const std::string& dir) {
  const std::string where = dir + "/config.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(where + ": " + e.what());
  }
  if (!j.is_object()) return InvalidArgument(where + ": expected a JSON object");
  // Every value is read through these, so a wrong type is an error naming its key.
  auto string_of = [&](const nlohmann::json& obj, const char* key, const char* fallback) -> Result<std::string> {
    if (!obj.contains(key) || obj[key].is_null()) return std::string(fallback);
    if (!obj[key].is_string()) return InvalidArgument(where + ": " + key + ": expected a string");
    return obj[key].get<std::string>();
  };
  auto number_of = [&](const nlohmann::json& obj, const char* key, double fallback) -> Result<double> {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_number()) return InvalidArgument(where + ": " + key + ": expected a number");
    return obj[key].get<double>();
  };
  auto bool_of = [&](const char* key, bool fallback) -> Result<bool> {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) return InvalidArgument(where + ": " + key + ": expected true or false");
    return j[key].get<bool>();
  };
  auto count_of = [&](const char* key, uint32_t fallback, uint32_t* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback == 0) return InvalidArgument(where + ": " + key + " is missing");
      *out = fallback;
      return Status::Ok();
    }
    if (!j[key].is_number_unsigned() || j[key].get<uint64_t>() == 0 || j[key].get<uint64_t>() > (1u << 20)) {
      return InvalidArgument(where + ": " + key + ": expected an integer in [1, 2^20]");
    }
    *out = static_cast<uint32_t>(j[key].get<uint64_t>());
    return Status::Ok();
  };

  ModelConfig c;
  c.directory = dir;
  c.name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  auto model_type = string_of(j, "model_type", "");
  if (!model_type.ok()) return model_type.status();
  if (*model_type != "llama") {
    return InvalidArgument(where + ": model_type '" + *model_type +
                           "' is not supported: kvtier-worker runs Llama-architecture models (model_type llama)");
  }
  c.model_type = *model_type;
  auto act = string_of(j, "hidden_act", "silu");
  if (!act.ok()) return act.status();
  if (*act != "silu") return InvalidArgument(where + ": hidden_act '" + *act + "' is not supported (only silu)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    auto b = bool_of(key, false);
    if (!b.ok()) return b.status();
    if (*b) return InvalidArgument(where + ": " + key + ": true is not supported (the transformer has no biases)");
  }
  KVTIER_RETURN_IF_ERROR(count_of("num_hidden_layers", 0, &c.layers));
  KVTIER_RETURN_IF_ERROR(count_of("hidden_size", 0, &c.hidden));
  KVTIER_RETURN_IF_ERROR(count_of("num_attention_heads", 0, &c.heads));
  KVTIER_RETURN_IF_ERROR(count_of("num_key_value_heads", c.heads, &c.kv_heads));
  KVTIER_RETURN_IF_ERROR(count_of("head_dim", std::max(1u, c.hidden / c.heads), &c.head_dim));
  KVTIER_RETURN_IF_ERROR(count_of("intermediate_size", 0, &c.intermediate));
  KVTIER_RETURN_IF_ERROR(count_of("vocab_size", 0, &c.vocab));
  auto eps = number_of(j, "rms_norm_eps", 1e-6);
  if (!eps.ok()) return eps.status();
  c.rms_eps = *eps;
  // transformers 5 writes rope_parameters {rope_theta, rope_type}; older
  // configs have rope_theta beside an optional rope_scaling {rope_type | type}.
  auto theta = number_of(j, "rope_theta", 10000.0);
  if (!theta.ok()) return theta.status();
  c.rope_theta = *theta;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_object()) return InvalidArgument(where + ": " + key + ": expected an object");
    const nlohmann::json& rope = j[key];
    auto t = number_of(rope, "rope_theta", c.rope_theta);
    if (!t.ok()) return t.status();
    c.rope_theta = *t;
    auto type = string_of(rope, "rope_type", "");
    if (!type.ok()) return type.status();
    if (type->empty()) {
      type = string_of(rope, "type", "default");
      if (!type.ok()) return type.status();
    }
    c.rope_type = *type;
  }
  if (c.rope_type != "default") {
    return InvalidArgument(where + ": rope_type '" + c.rope_type + "' is not supported (only default rotary embeddings)");
  }
  if (!(c.rms_eps > 0) || !(c.rope_theta > 0)) {
    return InvalidArgument(where + ": rms_norm_eps and rope_theta must be positive");
  }
  auto dtype = string_of(j, "dtype", "");
  if (!dtype.ok()) return dtype.status();
  if (dtype->empty()) dtype = string_of(j, "torch_dtype", "float32");
  if (!dtype.ok()) return dtype.status();
  if (*dtype == "float32") {
    c.dtype = DType::kF32;
  } else if (*dtype == "bfloat16") {
    c.dtype = DType::kBF16;
  } else if (*dtype == "float16") {
    c.dtype = DType::kF16;
  } else {
    return InvalidArgument(where + ": dtype '" + *dtype + "' is not supported (float32, bfloat16, float16)");
  }
  auto tie = bool_of("tie_word_embeddings", false);
  if (!tie.ok()) return tie.status();
  c.tie_embeddings = *tie;
  c.weights = dir + "/model.safetensors";
  if (Status s = c.Validate(); !s.ok()) return InvalidArgument(where + ": " + s.message());
  return c;
}

Result<ModelConfig> LoadModelDirectory(const std::string& dir) {
  auto text = ReadFile(dir + "/config.json", "model config");
  if (!text.ok()) return text.status();
  auto c = ParseHfConfig(*text, dir);
  if (!c.ok()) return c.status();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(c->weights, ec)) {
    if (std::filesystem::exists(dir + "/model.safetensors.index.json", ec)) {
      return InvalidArgument(dir + ": sharded weights (model.safetensors.index.json) are not supported; "
                                   "one model.safetensors is");
    }
    return NotFound(dir + ": no model.safetensors");
  }
  if (std::filesystem::is_regular_file(dir + "/tokenizer.json", ec)) c->tokenizer_file = dir + "/tokenizer.json";
  return c;
}

}  // namespace kvtier::model
