// ModelIdentity: the ModelId of a model, from its weights and its tokenizer,
// computed the same way by every worker (the C++ worker, the Python module),
// so one model served by both shares its blocks and no other model does.
//
//   id = XXH3-128 of the byte stream
//     "kvtier-model-identity-v1\0"
//     per tensor, in ascending (byte-wise) name order:
//       name "\0" dtype "\0" u32 rank, u64 dims..., u64 byte count, raw bytes
//     "config\0" u64 byte count, the architecture's settings that change its
//       outputs beyond the weights: ModelSettingsText below, the one place
//       that spells them (kvtier-worker calls it, kvtier.hf through
//       kvtier._native.model_settings_text)
//     "tokenizer\0" u64 byte count, the tokenizer's description bytes
//   (integers little-endian; dtype as the safetensors names it: "F32", "BF16",
//   "F16", ...; raw bytes in C order, little-endian; the tokenizer's
//   description is its tokenizer.json file, or a fixed text naming a built-in
//   tokenizer). The first 128 bits are the ModelId; the null id is never made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

// The architecture settings a model identity covers (AddConfig's text). A
// field left empty is a setting the architecture does not have (GPT-2 has no
// RMS norm and no rotary embedding; most models no sliding window): its line
// is not written. Names as Hugging Face's config spells them: "llama",
// "silu", "default".
struct ModelSettings {
  std::string model_type;
  std::string hidden_act = "silu";
  std::optional<double> rms_norm_eps;
  std::optional<double> layer_norm_eps;  // Of a LayerNorm model (GPT-2's layer_norm_epsilon).
  std::optional<double> rope_theta;
  std::optional<std::string> rope_type;
  std::optional<int64_t> sliding_window;  // Only where the model uses one.
};

// The settings as AddConfig takes them: one "key=value\n" line per present
// field, in the struct's order, numbers as printf "%.9g" writes them ("1e-05",
// "10000"). So a Llama's text is "model_type=llama\nhidden_act=silu\n
// rms_norm_eps=1e-05\nrope_theta=10000\nrope_type=default\n".
std::string ModelSettingsText(const ModelSettings& settings);

class ModelIdentity {
 public:
  ModelIdentity();
  ~ModelIdentity();
  ModelIdentity(const ModelIdentity&) = delete;
  ModelIdentity& operator=(const ModelIdentity&) = delete;

  // REQUIRES: names in ascending byte-wise order, each once, before
  // AddTokenizer. kInvalidArgument otherwise (nothing is added).
  Status AddTensor(std::string_view name, std::string_view dtype, std::span<const int64_t> shape,
                   std::span<const std::byte> data);
  // Once, after every tensor and before the tokenizer (the text above).
  Status AddConfig(std::string_view settings);
  // Once, after the config.
  Status AddTokenizer(std::span<const std::byte> description);
  Status AddTokenizer(std::string_view description) {
    return AddTokenizer(std::as_bytes(std::span<const char>(description.data(), description.size())));
  }
  // kFailedPrecondition before AddConfig and AddTokenizer.
  Result<ModelId> Finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvtier
