// The model worker without a daemon: its config, the safetensors loader, the
// transformer's incremental forward pass, and the in-process cache.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "chat.h"
#include "hf_tokenizer.h"
#include "model_config.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "tiny_model.h"
#include "transformer.h"
#include "workload.h"

namespace kvtier::model {
namespace {

std::string TempPath(const std::string& name) {
  return "/tmp/kvtier-model-test-" + std::to_string(::getpid()) + "-" + name;
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::vector<TokenId> Tokens(size_t n, uint32_t salt) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((i * 31 + salt * 7) % 259);
  return t;
}

TEST(ModelConfig, ParsesYamlAndFlagsAndNamesBadKeys) {
  auto c = ParseModelConfig("model:\n  layers: 3\n  hidden: 96\n  heads: 6\n  kv_heads: 2\n  head_dim: 16\n"
                            "  dtype: bf16\n  rope_theta: 500000\n",
                            "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layers, 3u);
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000);
  const ModelProfile p = c->Profile(32);
  EXPECT_EQ(p.layers, 3u);
  EXPECT_EQ(p.kv_heads, 2u);
  EXPECT_EQ(p.head_dim, 16u);
  EXPECT_EQ(p.block_tokens, 32u);

  auto bad = ParseModelConfig("layers: 2\nlayres: 3\n", "m.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layres"), std::string::npos) << bad.status().message();
  auto gqa = ParseModelConfig("heads: 6\nkv_heads: 4\n", "m.yaml");
  ASSERT_FALSE(gqa.ok());
  EXPECT_NE(gqa.status().message().find("multiple of kv_heads"), std::string::npos);
  auto range = ParseModelConfig("layers: 0\n", "m.yaml");
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("m.yaml: layers"), std::string::npos) << range.status().message();

  ModelConfig f;
  EXPECT_TRUE(SetModelField(f, "kv_heads", "8").ok());
  EXPECT_EQ(f.kv_heads, 8u);
  EXPECT_FALSE(SetModelField(f, "kv_heads", "eight").ok());
  EXPECT_FALSE(SetModelField(f, "dtype", "fp8").ok());
}

// A Llama config.json as transformers 5 writes it (SmolLM2-135M-Instruct's values).
nlohmann::json SmolConfig() {
  return nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
    "dtype": "float32", "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "intermediate_size": 1536,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "rms_norm_eps": 9.999999747378752e-06,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": true,
    "vocab_size": 49152})");
}

TEST(ModelConfig, ReadsAHuggingFaceConfigJson) {
  auto c = ParseHfConfig(SmolConfig().dump(), "/models/SmolLM2-135M-Instruct");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->name, "SmolLM2-135M-Instruct");
  EXPECT_EQ(c->layers, 30u);
  EXPECT_EQ(c->hidden, 576u);
  EXPECT_EQ(c->heads, 9u);
  EXPECT_EQ(c->kv_heads, 3u);
  EXPECT_EQ(c->head_dim, 64u);
  EXPECT_EQ(c->intermediate, 1536u);
  EXPECT_EQ(c->vocab, 49152u);
  EXPECT_DOUBLE_EQ(c->rope_theta, 100000.0);
  EXPECT_DOUBLE_EQ(c->rms_eps, 9.999999747378752e-06);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_EQ(c->dtype, DType::kF32);
  EXPECT_EQ(c->weights, "/models/SmolLM2-135M-Instruct/model.safetensors");
  EXPECT_EQ(c->directory, "/models/SmolLM2-135M-Instruct");

  // Older configs: rope_theta at the top, torch_dtype, head_dim implied by hidden / heads.
  nlohmann::json old = SmolConfig();
  old.erase("rope_parameters");
  old.erase("dtype");
  old.erase("head_dim");
  old["rope_theta"] = 500000.0;
  old["torch_dtype"] = "bfloat16";
  old["rope_scaling"] = nullptr;
  auto o = ParseHfConfig(old.dump(), "/m");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_DOUBLE_EQ(o->rope_theta, 500000.0);
  EXPECT_EQ(o->dtype, DType::kBF16);
  EXPECT_EQ(o->head_dim, 64u);  // 576 / 9.
}

TEST(ModelConfig, RefusesWhatTheTransformerDoesNotImplementByName) {
  auto refused = [](nlohmann::json j, const std::string& words) {
    auto c = ParseHfConfig(j.dump(), "/m");
    ASSERT_FALSE(c.ok()) << j.dump();
    EXPECT_NE(c.status().message().find(words), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("/m/config.json"), std::string::npos) << c.status().message();
  };
  nlohmann::json j = SmolConfig();
  j["model_type"] = "gpt2";
  refused(j, "model_type 'gpt2' is not supported");
  j = SmolConfig();
  j["attention_bias"] = true;
  refused(j, "attention_bias");
  j = SmolConfig();
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0}};
  refused(j, "rope_type 'llama3'");
  j = SmolConfig();
  j["hidden_act"] = "gelu";
  refused(j, "hidden_act 'gelu'");
  j = SmolConfig();
  j.erase("num_hidden_layers");
  refused(j, "num_hidden_layers is missing");
  j = SmolConfig();
  j["num_key_value_heads"] = 4;
  refused(j, "multiple of kv_heads");
  j = SmolConfig();
  j["dtype"] = "float8_e4m3fn";
  refused(j, "dtype 'float8_e4m3fn'");
  j = SmolConfig();
  j["hidden_size"] = "576";
  refused(j, "hidden_size: expected an integer");
  EXPECT_FALSE(ParseHfConfig("{not json", "/m").ok());

  // A directory without weights, or with sharded ones, says which.
  const std::string dir = TempPath("hfdir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/config.json") << SmolConfig().dump();
  auto none = LoadModelDirectory(dir);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
  std::ofstream(dir + "/model.safetensors.index.json") << "{}";
  auto sharded = LoadModelDirectory(dir);
  ASSERT_FALSE(sharded.ok());
  EXPECT_NE(sharded.status().message().find("sharded"), std::string::npos) << sharded.status().message();
  // LoadModelConfig takes the directory too.
  EXPECT_NE(LoadModelConfig(dir).status().message().find("sharded"), std::string::npos);
  ::unlink((dir + "/model.safetensors.index.json").c_str());
  ::unlink((dir + "/config.json").c_str());
  ::rmdir(dir.c_str());
}

TEST(HfTokenizer, DecodesByteLevelPiecesAndDescribesTheFileAsTokenizersDoes) {
  const std::string path = TempPath("tokenizer.json");
  // GPT-2's byte map: a space is U+0120, a newline U+010A; "\u00e4\u00bd\u0142" spells the
  // UTF-8 bytes of one CJK character. The vocabulary is out of id order on purpose.
  std::ofstream(path) << R"({"version": "1.0", "added_tokens": [{"id": 2, "content": "<|im_end|>", "special": true}],
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"Ġworld": 4, "hello": 3, "<|im_end|>": 2, "Ċ": 5,
                                        "ä½ł": 6}}})";
  auto t = HfTokenizer::Load(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->byte_level());
  const std::vector<TokenId> ids = {3, 4, 5, 6, 2, 99};
  EXPECT_EQ(t->Decode(ids), "hello world\n\xe4\xbd\xa0<|im_end|><99>");
  auto d = HfTokenizerDescription(path);
  ASSERT_TRUE(d.ok());
  // Compact, keys in file order, the vocabulary in id order.
  EXPECT_EQ(*d, R"({"version":"1.0","added_tokens":[{"id":2,"content":"<|im_end|>","special":true}],)"
                R"("decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"<|im_end|>":2,"hello":3,)"
                "\"\u0120world\":4,\"\u010a\":5,\"\u00e4\u00bd\u0142\":6}}}");
  ::unlink(path.c_str());
  EXPECT_EQ(HfTokenizer::Load(TempPath("absent.json")).status().code(), StatusCode::kNotFound);
}

// Writes a safetensors file byte by byte, independently of WriteSafetensors.
void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  const std::string path = TempPath("hand.safetensors");
  float f[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t bf16_one = 0x3f80, f16_two = 0x4000;
  std::string data(reinterpret_cast<const char*>(f), sizeof f);
  data.append(reinterpret_cast<const char*>(&bf16_one), 2);
  data.append(reinterpret_cast<const char*>(&f16_two), 2);
  WriteRaw(path,
           R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
           R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[24,26]},"c":{"dtype":"F16","shape":[],"data_offsets":[26,28]}})",
           data);
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const StTensor* a = (*file)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->numel(), 6);
  EXPECT_EQ(std::memcmp(a->data.data(), f, sizeof f), 0);
  EXPECT_EQ((*file)->Find("b")->dtype, StDType::kBF16);
  EXPECT_EQ((*file)->Find("c")->numel(), 1);
  EXPECT_EQ((*file)->Find("d"), nullptr);
  ::unlink(path.c_str());
}

TEST(Safetensors, RejectsMalformedFilesWithAReason) {
  const std::string path = TempPath("bad.safetensors");
  struct Case {
    std::string header, data, expect;
  } cases[] = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", std::string(8, '\0'), "outside"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'), "bytes for 3"},
      {R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'), "unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", std::string(4, '\0'), "data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0'), "bad dimension"},
      {R"([1,2,3])", "", "not a JSON object"},
      {R"({"a":)", "", "not a JSON object"},
  };
  for (const Case& c : cases) {
    WriteRaw(path, c.header, c.data);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.header;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << f.status().message();
  }
  {  // A header length past the end of the file.
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("exceeds the file"), std::string::npos) << f.status().message();
  EXPECT_EQ(SafetensorsFile::Open(path + ".missing").status().code(), StatusCode::kNotFound);
  ::unlink(path.c_str());
}

TEST(Transformer, WeightsRoundTripThroughSafetensors) {
  const std::string path = TempPath("weights.safetensors");
  auto seeded = Transformer::Create(TinyModel());
  ASSERT_TRUE(seeded.ok()) << seeded.status().ToString();
  ASSERT_TRUE((*seeded)->SaveWeights(path).ok());

  ModelConfig from_file = TinyModel();
  from_file.seed = 12345;  // Ignored: the file wins.
  from_file.weights = path;
  auto loaded = Transformer::Create(from_file);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const std::vector<TokenId> t = Tokens(37, 1);
  KvBuffer a, b;
  a.Reserve(TinyModel(), 37, (*seeded)->options());
  b.Reserve(TinyModel(), 37, (*loaded)->options());
  EXPECT_EQ(MaxAbsDiff((*seeded)->Forward(t, a), (*loaded)->Forward(t, b)), 0.0);

  // The names are Hugging Face's.
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_NE((*file)->Find("model.layers.1.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ((*file)->Find("model.layers.1.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{32, 64}));
  EXPECT_NE((*file)->Find("lm_head.weight"), nullptr);

  // A model of another shape names the tensor that does not fit.
  ModelConfig wider = from_file;
  wider.intermediate = 128;
  auto wrong = Transformer::Create(wider);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("mlp.gate_proj.weight has shape [96, 64]"), std::string::npos)
      << wrong.status().message();
  ::unlink(path.c_str());
}

TEST(Transformer, LoadsHalfPrecisionAndTiedEmbeddings) {
  // A bf16 checkpoint without lm_head (tie_word_embeddings), loaded into fp32.
  const std::string path = TempPath("bf16.safetensors");
  ModelConfig c = TinyModel();
  c.dtype = DType::kBF16;
  c.tie_embeddings = true;
  auto bf16 = Transformer::Create(c);
  ASSERT_TRUE(bf16.ok());
  ASSERT_TRUE((*bf16)->SaveWeights(path).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Find("lm_head.weight"), nullptr);
  EXPECT_EQ((*file)->Find("model.norm.weight")->dtype, StDType::kBF16);

  ModelConfig f32 = TinyModel();
  f32.weights = path;
  auto loaded = Transformer::Create(f32);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE((*loaded)->config().tie_embeddings);
  // Every weight arrived exactly: the fp32 model's weights are the bf16 ones widened.
  const std::string widened = TempPath("widened.safetensors");
  ASSERT_TRUE((*loaded)->SaveWeights(widened).ok());
  auto wide = SafetensorsFile::Open(widened);
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ((*wide)->Find("lm_head.weight"), nullptr);
  for (const auto& [name, narrow] : (*file)->tensors()) {
    const StTensor* w = (*wide)->Find(name);
    ASSERT_NE(w, nullptr) << name;
    ASSERT_EQ(w->dtype, StDType::kF32);
    at::Tensor from_bf16 = at::from_blob(const_cast<std::byte*>(narrow.data.data()), narrow.shape, at::kBFloat16).to(at::kFloat);
    at::Tensor from_f32 = at::from_blob(const_cast<std::byte*>(w->data.data()), w->shape, at::kFloat);
    EXPECT_TRUE(at::equal(from_bf16, from_f32)) << name;
  }
  ::unlink(widened.c_str());
  ::unlink(path.c_str());

  ModelConfig missing = TinyModel();
  missing.weights = TempPath("absent.safetensors");
  EXPECT_EQ(Transformer::Create(missing).status().code(), StatusCode::kNotFound);
}

// The KV cache contract at the model level: prefilling a prefix, then the rest,
// then decoding token by token gives the logits of one full pass.
TEST(Transformer, IncrementalForwardMatchesAFullPass) {
  auto m = Transformer::Create(TinyModel());
  ASSERT_TRUE(m.ok());
  const std::vector<TokenId> t = Tokens(70, 3);
  KvBuffer full, inc;
  full.Reserve(TinyModel(), 70, (*m)->options());
  inc.Reserve(TinyModel(), 32, (*m)->options());
  const at::Tensor expect = (*m)->Forward(t, full);
  EXPECT_GT(expect.abs().max().item<double>(), 0.5);  // Logits of order one: the bound below means something.
  (*m)->Forward(std::span<const TokenId>(t).first(32), inc);
  inc.Reserve(TinyModel(), 70, (*m)->options());  // Grows, keeping the 32 rows.
  (*m)->Forward(std::span<const TokenId>(t).subspan(32, 37), inc);
  const at::Tensor got = (*m)->Forward(std::span<const TokenId>(t).subspan(69, 1), inc);
  EXPECT_EQ(inc.length, 70);
  EXPECT_LT(MaxAbsDiff(expect, got), 1e-4);
  for (uint32_t l = 0; l < 2; ++l) {
    EXPECT_LT(MaxAbsDiff(full.k[l].narrow(0, 0, 70), inc.k[l].narrow(0, 0, 70)), 1e-4);
    EXPECT_LT(MaxAbsDiff(full.v[l].narrow(0, 0, 70), inc.v[l].narrow(0, 0, 70)), 1e-4);
  }
  // Position matters (rotary embeddings): the same tokens later give other keys.
  KvBuffer shifted;
  shifted.Reserve(TinyModel(), 80, (*m)->options());
  (*m)->Forward(Tokens(10, 9), shifted);
  (*m)->Forward(std::span<const TokenId>(t).first(5), shifted);
  EXPECT_GT(MaxAbsDiff(shifted.k[0].narrow(0, 10, 5), full.k[0].narrow(0, 0, 5)), 1e-3);
}

// The local cache against recomputation over a whole conversation.
TEST(ChatRunner, LocalCacheAgreesWithRecompute) {
  auto m = Transformer::Create(TinyModel());
  ASSERT_TRUE(m.ok());
  for (bool token_granular : {false, true}) {
    ChatOptions none{.mode = CacheMode::kNone, .keep_logits = true};
    ChatOptions local{.mode = CacheMode::kLocal, .local_token_granular = token_granular, .keep_logits = true};
    auto rn = ChatRunner::Create(**m, none);
    auto rl = ChatRunner::Create(**m, local);
    ASSERT_TRUE(rn.ok() && rl.ok());
    WorkloadOptions w{.sessions = 2, .turns = 4, .system_tokens = 40, .first_tokens = 50, .user_tokens = 21,
                      .output_tokens = 5};
    for (uint32_t s = 0; s < 2; ++s) {
      Conversation chat(w, s);
      for (uint32_t turn = 0; turn < w.turns; ++turn) {
        const std::vector<TokenId> prompt = chat.NextPrompt(turn);
        auto a = (*rn)->Turn(chat.id(), prompt, w.output_tokens);
        auto b = (*rl)->Turn(chat.id(), prompt, w.output_tokens);
        ASSERT_TRUE(a.ok() && b.ok());
        ASSERT_EQ(a->output, b->output) << "turn " << turn;
        ASSERT_EQ(a->logits.size(), b->logits.size());
        for (size_t i = 0; i < a->logits.size(); ++i) EXPECT_LT(MaxAbsDiff(a->logits[i], b->logits[i]), 1e-4);
        EXPECT_EQ(a->cached_tokens, 0u);
        if (turn > 0) {
          EXPECT_GT(b->cached_tokens, 0u);
          if (!token_granular) {
            EXPECT_EQ(b->cached_tokens % 16, 0u);
          }
        }
        EXPECT_EQ(b->cached_tokens + b->computed_tokens, prompt.size());
        chat.AddReply(a->output);
      }
    }
  }
}

TEST(Workload, IsDeterministicAndSharesOnlyTheSystemPrompt) {
  WorkloadOptions w{.sessions = 3, .turns = 2, .workers = 2, .system_tokens = 64, .first_tokens = 100};
  Conversation a(w, 0), b(w, 1), a2(w, 0);
  const std::vector<TokenId> pa = a.NextPrompt(0), pb = b.NextPrompt(0);
  EXPECT_EQ(pa, a2.NextPrompt(0));
  EXPECT_EQ(pa.size(), 1 + 64 + 100 + 1u);
  EXPECT_TRUE(std::equal(pa.begin(), pa.begin() + 65, pb.begin()));
  EXPECT_NE(pa, pb);
  EXPECT_EQ(WorkerSessions(w), (std::vector<uint32_t>{0, 2}));
  w.worker_index = 1;
  EXPECT_EQ(WorkerSessions(w), (std::vector<uint32_t>{1}));
  w.unique = true;
  Conversation u0(w, 0), u1(w, 1);
  EXPECT_NE(u0.NextPrompt(0).front(), kBos);
  EXPECT_NE(u0.NextPrompt(1), u1.NextPrompt(1));
}

}  // namespace
}  // namespace kvtier::model
