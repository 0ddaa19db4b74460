// ModelConfig: the shape of the model worker's Llama-family transformer, read
// from YAML and/or flags, and the kvtier ModelProfile it implies.
//
// Torch-free on purpose: the daemon-facing parts of the worker (and their tests)
// do not pay for libtorch headers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/model_profile.h"
#include "kvtier/status.h"

namespace kvtier::model {

struct ModelConfig {
  std::string name = "tiny-llama";
  uint32_t layers = 4;
  uint32_t hidden = 512;
  uint32_t heads = 8;
  uint32_t kv_heads = 4;        // Grouped-query attention: heads % kv_heads == 0.
  uint32_t head_dim = 64;
  uint32_t intermediate = 1376;  // SwiGLU width.
  uint32_t vocab = 320;          // 256 byte tokens + specials (see tokenizer.h).
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;
  DType dtype = DType::kF32;     // Weights, activations and KV.
  uint64_t seed = 1;             // Deterministic weights when `weights` is empty.
  std::string weights;           // A safetensors file with Hugging Face Llama names.
  bool tie_embeddings = false;   // lm_head shares embed_tokens (a file without lm_head implies it).
  // Set for a Hugging Face model directory (LoadModelDirectory): the directory,
  // its tokenizer.json, and the settings the model identity covers. The
  // identity is then the one kvtier.hf computes for the same directory, so the
  // worker and Python services on one model share blocks.
  std::string directory;
  std::string tokenizer_file;
  std::string model_type = "llama";
  std::string rope_type = "default";

  Status Validate() const;
  // The kvtier profile of this model's KV with `block_tokens` tokens a block.
  ModelProfile Profile(uint32_t block_tokens) const;
  // "tiny-llama: 4 layers, hidden 512, 8 heads (4 kv) x 64, ffn 1376, vocab 320, fp32".
  std::string Describe() const;
};

// Reads a YAML mapping (top level, or under a `model:` key) over `base`.
// Unknown keys are errors; every error names the file and key.
Result<ModelConfig> ParseModelConfig(std::string_view yaml, std::string_view source, ModelConfig base = {});
// A model YAML file, or a Hugging Face model directory (see LoadModelDirectory).
Result<ModelConfig> LoadModelConfig(const std::string& path, ModelConfig base = {});
// A Hugging Face Llama model directory: config.json, model.safetensors and
// (optionally) tokenizer.json. Anything the transformer does not implement
// (another architecture, biases, rope scaling, sharded weights) is an error that
// names it.
Result<ModelConfig> LoadModelDirectory(const std::string& dir);
// Parses a config.json's text; `dir` names the directory in errors and paths.
Result<ModelConfig> ParseHfConfig(std::string_view json, const std::string& dir);
// Sets one field by its YAML name from a command-line value ("layers", "8").
Status SetModelField(ModelConfig& config, std::string_view key, std::string_view value);

}  // namespace kvtier::model
