// ModelIdentity: the ModelId of a model, from its weights and its tokenizer,
// computed the same way by every worker (the C++ worker, the Python module),
// so one model served by both shares its blocks and no other model does.
//
//   id = XXH3-128 of the byte stream
//     "kvtier-model-identity-v1\0"
//     per tensor, in ascending (byte-wise) name order:
//       name "\0" dtype "\0" u32 rank, u64 dims..., u64 byte count, raw bytes
//     "config\0" u64 byte count, the architecture's settings that change its
//       outputs beyond the weights, one "key=value\n" line each in this order:
//       model_type, hidden_act, rms_norm_eps, rope_theta, rope_type, then
//       sliding_window only where the model uses one (numbers as printf
//       "%.9g" writes them: "1e-05", "10000"; names as Hugging Face's config
//       spells them: "llama", "silu", "default")
//     "tokenizer\0" u64 byte count, the tokenizer's description bytes
//   (integers little-endian; dtype as the safetensors names it: "F32", "BF16",
//   "F16", ...; raw bytes in C order, little-endian; the tokenizer's
//   description is its tokenizer.json file, or a fixed text naming a built-in
//   tokenizer). The first 128 bits are the ModelId; the null id is never made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier {

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
