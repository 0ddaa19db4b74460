// ModelIdentity: a streaming XXH3-128 over a model's tensors and tokenizer (model_identity.h).
#include "kvtier/model_identity.h"

#include <cstdio>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {

struct ModelIdentity::State {
  XXH3_state_t hash;
  std::string last_name;
  bool any_tensor = false;
  bool config = false;
  bool tokenizer = false;

  void Put(const void* data, size_t n) { XXH3_128bits_update(&hash, data, n); }
  void PutU32(uint32_t v) { Put(&v, sizeof(v)); }  // Little-endian hosts only (block_key.cc asserts it).
  void PutU64(uint64_t v) { Put(&v, sizeof(v)); }
  void PutText(std::string_view s) {
    Put(s.data(), s.size());
    Put("", 1);
  }
};

std::string ModelSettingsText(const ModelSettings& settings) {
  std::string text;
  const auto line = [&](const char* key, std::string_view value) {
    text.append(key).append("=").append(value).append("\n");
  };
  const auto number = [&](const char* key, double value) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", value);
    line(key, buf);
  };
  line("model_type", settings.model_type);
  line("hidden_act", settings.hidden_act);
  if (settings.rms_norm_eps) number("rms_norm_eps", *settings.rms_norm_eps);
  if (settings.layer_norm_eps) number("layer_norm_eps", *settings.layer_norm_eps);
  if (settings.rope_theta) number("rope_theta", *settings.rope_theta);
  if (settings.rope_type) line("rope_type", *settings.rope_type);
  if (settings.sliding_window) line("sliding_window", std::to_string(*settings.sliding_window));
  return text;
}

ModelIdentity::ModelIdentity() : state_(std::make_unique<State>()) {
  XXH3_128bits_reset(&state_->hash);
  state_->PutText("kvtier-model-identity-v1");
}

ModelIdentity::~ModelIdentity() = default;

Status ModelIdentity::AddTensor(std::string_view name, std::string_view dtype, std::span<const int64_t> shape,
                                std::span<const std::byte> data) {
  State& s = *state_;
  if (s.config || s.tokenizer) {
    return InvalidArgument("model identity: tensor '" + std::string(name) + "' after the config or tokenizer");
  }
  if (name.empty() || name.find('\0') != std::string_view::npos || dtype.empty()) {
    return InvalidArgument("model identity: a tensor needs a name and a dtype");
  }
  if (s.any_tensor && !(s.last_name < name)) {
    return InvalidArgument("model identity: tensor '" + std::string(name) + "' does not come after '" + s.last_name +
                           "' (add them in ascending name order, each once)");
  }
  s.PutText(name);
  s.PutText(dtype);
  s.PutU32(static_cast<uint32_t>(shape.size()));
  for (int64_t d : shape) s.PutU64(static_cast<uint64_t>(d));
  s.PutU64(data.size());
  s.Put(data.data(), data.size());
  s.last_name = std::string(name);
  s.any_tensor = true;
  return Status::Ok();
}

Status ModelIdentity::AddConfig(std::string_view settings) {
  State& s = *state_;
  if (s.config || s.tokenizer) return InvalidArgument("model identity: the config comes once, before the tokenizer");
  s.PutText("config");
  s.PutU64(settings.size());
  s.Put(settings.data(), settings.size());
  s.config = true;
  return Status::Ok();
}

Status ModelIdentity::AddTokenizer(std::span<const std::byte> description) {
  State& s = *state_;
  if (!s.config) return FailedPrecondition("model identity: add the config before the tokenizer");
  if (s.tokenizer) return InvalidArgument("model identity: the tokenizer was added already");
  s.PutText("tokenizer");
  s.PutU64(description.size());
  s.Put(description.data(), description.size());
  s.tokenizer = true;
  return Status::Ok();
}

Result<ModelId> ModelIdentity::Finish() {
  if (!state_->tokenizer) return FailedPrecondition("model identity: add the config and tokenizer before Finish");
  const XXH128_hash_t h = XXH3_128bits_digest(&state_->hash);
  ModelId id{BlockKey{h.low64, h.high64}};
  if (id.IsNull()) id.id.lo = 1;
  return id;
}

}  // namespace kvtier
