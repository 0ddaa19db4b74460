#include "transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kvtier/model_identity.h"
#include "safetensors.h"
#include "hf_tokenizer.h"
#include "tokenizer.h"

namespace kvtier::model {
namespace {

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF32: return at::kFloat;
  }
  return at::kFloat;
}

Result<at::ScalarType> ToScalarType(StDType d) {
  switch (d) {
    case StDType::kF32: return at::kFloat;
    case StDType::kF16: return at::kHalf;
    case StDType::kBF16: return at::kBFloat16;
    case StDType::kF64: return at::kDouble;
    default: return InvalidArgument(std::string("weights of dtype ") + StDTypeName(d) + " are not supported");
  }
}

StDType ToStDType(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return StDType::kF16;
    case at::kBFloat16: return StDType::kBF16;
    default: return StDType::kF32;
  }
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

// Hugging Face's rotary convention: the two halves of each head are the pair.
at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

std::string LayerName(size_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

}  // namespace

void KvBuffer::Reserve(const ModelConfig& config, int64_t rows, const at::TensorOptions& options) {
  if (rows <= capacity()) return;
  // Headroom: a conversation grows every turn, and each growth copies all rows.
  const int64_t grown = std::max<int64_t>(rows + rows / 2, 2 * capacity());
  const int64_t kvh = config.kv_heads, hd = config.head_dim;
  k.resize(config.layers);
  v.resize(config.layers);
  for (uint32_t l = 0; l < config.layers; ++l) {
    for (at::Tensor* t : {&k[l], &v[l]}) {
      at::Tensor bigger = at::empty({grown, kvh, hd}, options);
      if (length > 0) bigger.narrow(0, 0, length).copy_(t->narrow(0, 0, length));
      *t = std::move(bigger);
    }
  }
}

Transformer::Transformer(const ModelConfig& config, at::Device device)
    : config_(config), options_(at::TensorOptions().dtype(ToScalarType(config.dtype)).device(device)) {
  layers_.resize(config.layers);
  // inv_freq[i] = theta^(-2i / head_dim), kept in double: positions times
  // frequencies must not depend on how many tokens a forward pass carries.
  inv_freq_ = at::pow(config.rope_theta,
                      -at::arange(0, int64_t{config.head_dim}, 2, at::TensorOptions().dtype(at::kDouble)) /
                          static_cast<double>(config.head_dim));
}

std::vector<std::pair<std::string, at::Tensor*>> Transformer::Named() {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  out.emplace_back("model.embed_tokens.weight", &embed_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& L = layers_[i];
    out.emplace_back(LayerName(i, "input_layernorm.weight"), &L.input_norm);
    out.emplace_back(LayerName(i, "self_attn.q_proj.weight"), &L.q);
    out.emplace_back(LayerName(i, "self_attn.k_proj.weight"), &L.k);
    out.emplace_back(LayerName(i, "self_attn.v_proj.weight"), &L.v);
    out.emplace_back(LayerName(i, "self_attn.o_proj.weight"), &L.o);
    out.emplace_back(LayerName(i, "post_attention_layernorm.weight"), &L.post_norm);
    out.emplace_back(LayerName(i, "mlp.gate_proj.weight"), &L.gate);
    out.emplace_back(LayerName(i, "mlp.up_proj.weight"), &L.up);
    out.emplace_back(LayerName(i, "mlp.down_proj.weight"), &L.down);
  }
  out.emplace_back("model.norm.weight", &norm_);
  if (!config_.tie_embeddings) out.emplace_back("lm_head.weight", &lm_head_);
  return out;
}

namespace {

// The expected shape of a weight, from its name's last two components.
std::vector<int64_t> ShapeOf(const ModelConfig& c, const std::string& name) {
  const int64_t h = c.hidden, q = int64_t{c.heads} * c.head_dim, kv = int64_t{c.kv_heads} * c.head_dim;
  auto ends = [&](const char* s) { return name.size() >= std::strlen(s) && name.ends_with(s); };
  if (ends("embed_tokens.weight") || ends("lm_head.weight")) return {c.vocab, h};
  if (ends("layernorm.weight") || ends("norm.weight")) return {h};
  if (ends("q_proj.weight")) return {q, h};
  if (ends("k_proj.weight") || ends("v_proj.weight")) return {kv, h};
  if (ends("o_proj.weight")) return {h, q};
  if (ends("gate_proj.weight") || ends("up_proj.weight")) return {c.intermediate, h};
  return {h, c.intermediate};  // down_proj
}

}  // namespace

void Transformer::Seed() {
  at::Generator gen = at::detail::createCPUGenerator(config_.seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (auto& [name, t] : Named()) {
    const std::vector<int64_t> shape = ShapeOf(config_, name);
    at::Tensor w;
    if (shape.size() == 1) {
      w = 1.0 + 0.1 * at::randn(shape, gen, f32);  // Norm gains near one.
    } else if (name.ends_with("embed_tokens.weight")) {
      w = at::randn(shape, gen, f32);
    } else {
      // 1/sqrt(fan_in) keeps activations, and so logits, of order one: the
      // agreement tests compare numbers that mean something.
      w = at::randn(shape, gen, f32) / std::sqrt(static_cast<double>(shape[1]));
    }
    *t = w.to(options_);
  }
}

Status Transformer::Load(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  // A checkpoint without lm_head ties it to the embeddings (tie_word_embeddings).
  if ((*file)->Find("lm_head.weight") == nullptr) config_.tie_embeddings = true;
  for (auto& [name, t] : Named()) {
    const StTensor* st = (*file)->Find(name);
    if (st == nullptr) return NotFound(path + ": missing tensor " + name);
    const std::vector<int64_t> want = ShapeOf(config_, name);
    if (st->shape != want) {
      return InvalidArgument(path + ": " + name + " has shape " + c10::str(at::IntArrayRef(st->shape)) +
                             ", the model config needs " + c10::str(at::IntArrayRef(want)));
    }
    auto type = ToScalarType(st->dtype);
    if (!type.ok()) return InvalidArgument(path + ": " + name + ": " + type.status().message());
    // from_blob does not copy; .to() with copy=true does, before the file is unmapped.
    at::Tensor view = at::from_blob(const_cast<std::byte*>(st->data.data()), st->shape,
                                    at::TensorOptions().dtype(*type));
    *t = view.to(options_, /*non_blocking=*/false, /*copy=*/true);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Transformer>> Transformer::Create(const ModelConfig& config, at::Device device) {
  if (Status s = config.Validate(); !s.ok()) return s;
  std::unique_ptr<Transformer> m(new Transformer(config, device));
  if (config.weights.empty()) {
    m->Seed();
  } else if (Status s = m->Load(config.weights); !s.ok()) {
    return s;
  }
  if (m->config_.tie_embeddings) m->lm_head_ = m->embed_;
  return m;
}

Status Transformer::SaveWeights(const std::string& path) const {
  std::vector<at::Tensor> cpu;  // Keeps the bytes alive while writing.
  std::vector<StTensorToWrite> out;
  auto named = const_cast<Transformer*>(this)->Named();
  cpu.reserve(named.size());
  for (auto& [name, t] : named) {
    cpu.push_back(t->contiguous().cpu());
    const at::Tensor& c = cpu.back();
    out.push_back({name, ToStDType(c.scalar_type()), c.sizes().vec(),
                   {static_cast<const std::byte*>(c.data_ptr()), c.nbytes()}});
  }
  return WriteSafetensors(path, out, {{"format", "pt"}, {"source", "kvtier-worker"}});
}

Result<ModelId> Transformer::Identity() const {
  auto named = const_cast<Transformer*>(this)->Named();
  // A Hugging Face model's state_dict names a tied lm_head too (kvtier.hf
  // hashes the state_dict): a directory's identity is the one Python computes.
  const bool hf = !config_.directory.empty();
  if (hf && config_.tie_embeddings) named.emplace_back("lm_head.weight", const_cast<at::Tensor*>(&lm_head_));
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  ModelIdentity id;
  for (auto& [name, t] : named) {
    const at::Tensor c = t->contiguous().cpu();
    KVTIER_RETURN_IF_ERROR(id.AddTensor(name, StDTypeName(ToStDType(c.scalar_type())), c.sizes().vec(),
                                        {static_cast<const std::byte*>(c.data_ptr()), c.nbytes()}));
  }
  ModelSettings settings{.model_type = config_.model_type,
                         .hidden_act = "silu",
                         .rms_norm_eps = config_.rms_eps,
                         .rope_theta = config_.rope_theta,
                         .rope_type = config_.rope_type};
  KVTIER_RETURN_IF_ERROR(id.AddConfig(ModelSettingsText(settings)));
  if (!hf) {
    KVTIER_RETURN_IF_ERROR(id.AddTokenizer(kTokenizerDescription));
  } else if (config_.tokenizer_file.empty()) {
    KVTIER_RETURN_IF_ERROR(id.AddTokenizer("none"));  // As kvtier.hf says of a model without a tokenizer.
  } else {
    auto description = HfTokenizerDescription(config_.tokenizer_file);
    if (!description.ok()) return description.status();
    KVTIER_RETURN_IF_ERROR(id.AddTokenizer(*description));
  }
  return id.Finish();
}

at::Tensor Transformer::Forward(std::span<const TokenId> tokens, KvBuffer& kv) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t past = kv.length, total = past + n;
  const int64_t heads = config_.heads, kvh = config_.kv_heads, hd = config_.head_dim, group = heads / kvh;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

  at::Tensor ids = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  int64_t* idp = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) idp[i] = std::min<int64_t>(tokens[i], config_.vocab - 1);
  at::Tensor x = embed_.index_select(0, ids.to(options_.device()));  // [n, hidden]

  at::Tensor pos = at::arange(past, total, at::TensorOptions().dtype(at::kDouble));
  at::Tensor freqs = at::outer(pos, inv_freq_);
  at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);  // [n, 1, hd]
  at::Tensor cos = emb.cos().to(options_), sin = emb.sin().to(options_);

  // Causal mask for a multi-token pass: query i (position past+i) sees keys <= past+i.
  at::Tensor mask;
  if (n > 1) {
    at::Tensor q_pos = at::arange(past, total, at::TensorOptions().dtype(at::kLong)).unsqueeze(1);
    at::Tensor k_pos = at::arange(0, total, at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
    mask = at::zeros({n, total}, at::TensorOptions().dtype(options_.dtype()))
               .masked_fill_(k_pos > q_pos, -std::numeric_limits<float>::infinity())
               .to(options_.device());
  }

  for (uint32_t l = 0; l < config_.layers; ++l) {
    const Layer& L = layers_[l];
    at::Tensor h = RmsNorm(x, L.input_norm, config_.rms_eps);
    at::Tensor q = Rotate(at::linear(h, L.q).view({n, heads, hd}), cos, sin);
    kv.k[l].narrow(0, past, n).copy_(Rotate(at::linear(h, L.k).view({n, kvh, hd}), cos, sin));
    kv.v[l].narrow(0, past, n).copy_(at::linear(h, L.v).view({n, kvh, hd}));

    // Query heads kvh*group + g share key head kvh: batch by key head.
    at::Tensor qb = q.view({n, kvh, group, hd}).permute({1, 2, 0, 3}).reshape({kvh, group * n, hd});
    at::Tensor keys = kv.k[l].narrow(0, 0, total).permute({1, 2, 0});    // [kvh, hd, total]
    at::Tensor values = kv.v[l].narrow(0, 0, total).permute({1, 0, 2});  // [kvh, total, hd]
    at::Tensor scores = at::bmm(qb, keys).mul_(scale);                   // [kvh, group*n, total]
    if (n > 1) scores.view({kvh, group, n, total}).add_(mask);
    at::Tensor attn = at::bmm(at::softmax(scores, -1), values)            // [kvh, group*n, hd]
                          .view({kvh, group, n, hd})
                          .permute({2, 0, 1, 3})
                          .reshape({n, heads * hd});
    x = x + at::linear(attn, L.o);
    h = RmsNorm(x, L.post_norm, config_.rms_eps);
    x = x + at::linear(at::silu(at::linear(h, L.gate)) * at::linear(h, L.up), L.down);
  }
  kv.length = total;
  at::Tensor last = RmsNorm(x.narrow(0, n - 1, 1), norm_, config_.rms_eps);
  return at::linear(last, lm_head_).view({config_.vocab}).to(at::kFloat);
}

}  // namespace kvtier::model
