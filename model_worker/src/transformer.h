// Transformer: a decoder-only model of the Llama family (RMSNorm, rotary position
// embeddings, grouped-query attention, SwiGLU MLP) written directly on ATen
// tensors, so the KV cache layout is ours to choose: per layer, K and V rows of
// [kv_heads, head_dim] per token, the same row layout as a kvtier block plane.
//
// Weights are Hugging Face Llama tensors (model.layers.N.self_attn.q_proj.weight,
// ...), drawn from a seed or loaded from a safetensors file.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "model_config.h"

namespace kvtier::model {

// The keys and values of one sequence: per layer, K and V of shape
// [capacity, kv_heads, head_dim]; rows [0, length) hold positions 0..length-1.
struct KvBuffer {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;

  int64_t capacity() const { return k.empty() ? 0 : k[0].size(0); }
  // Grows to at least `capacity` rows (with headroom), keeping rows [0, length).
  void Reserve(const ModelConfig& config, int64_t capacity, const at::TensorOptions& options);
};

class Transformer {
 public:
  // Seeded weights, or config.weights loaded (shapes checked against config).
  static Result<std::unique_ptr<Transformer>> Create(const ModelConfig& config,
                                                     at::Device device = at::kCPU);

  const ModelConfig& config() const { return config_; }
  at::TensorOptions options() const { return options_; }

  // Runs `tokens` at positions [kv.length, kv.length + n): appends their K/V to
  // `kv`, attends causally over all of it, and returns the fp32 logits [vocab]
  // of the last token. REQUIRES: !tokens.empty(), kv.capacity() >= kv.length + n.
  at::Tensor Forward(std::span<const TokenId> tokens, KvBuffer& kv) const;

  // Writes every weight under its Hugging Face name.
  Status SaveWeights(const std::string& path) const;

  // The model's identity (kvtier/model_identity.h): its weights under their
  // Hugging Face names, and the byte-level tokenizer.
  Result<ModelId> Identity() const;

 private:
  struct Layer {
    at::Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
  };
  explicit Transformer(const ModelConfig& config, at::Device device);
  Status Load(const std::string& path);
  void Seed();
  std::vector<std::pair<std::string, at::Tensor*>> Named();

  ModelConfig config_;
  at::TensorOptions options_;
  at::Tensor embed_, norm_, lm_head_, inv_freq_;
  std::vector<Layer> layers_;
};

}  // namespace kvtier::model
