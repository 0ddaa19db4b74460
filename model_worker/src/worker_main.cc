// kvtier-worker: a model worker. Loads (or seeds) a Llama-family transformer,
// serves the chat workload's sessions with one cache mode or several, and
// reports every turn (time to first token, tokens reused and computed, CPU
// time) as text or JSON lines.
//
//   kvtier-worker --cache kvtier --socket /run/kvtier/kvtierd.sock --sessions 8 --turns 6
//   kvtier-worker --cache none --json ...          # the recompute baseline
//   kvtier-worker --cache kvtier,local,none --json # every turn in each mode, back to back
//   kvtier-worker --save-weights model.safetensors # write the seeded weights and exit
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <optional>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chat.h"
#include "hf_tokenizer.h"
#include "tokenizer.h"
#include "transformer.h"
#include "workload.h"

using namespace kvtier;
using namespace kvtier::model;

namespace {

struct Args {
  std::string model_file, save_weights, device = "auto", cache = "kvtier", socket = "/run/kvtier/kvtierd.sock", tenant,
                                        name, profile;
  std::string model_id = "auto";        // "auto": of the weights and tokenizer; "none"; or 32 hex digits.
  std::string promote = "auto";         // auto, now, after-read, no.
  std::vector<uint32_t> prompt_tokens;  // --prompt-tokens: one turn of exactly these, then exit.
  std::vector<uint32_t> logits_tokens;  // --logits: the next-token logits after these, then exit.
  std::string prompt_session = "prompt";
  std::vector<std::string> sets;
  uint32_t block_tokens = 16, threads = 1;
  bool local_token_granular = false, json = false, show_text = false, keep_memory = true, print_model_id = false,
       print_profile = false;
  WorkloadOptions workload;
};

int Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "kvtier-worker: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// Sizes the BLAS library's own thread pool to the model's: OpenBLAS (what
// libtorch calls for its matrix products on Debian) otherwise starts one thread
// per core beside ATen's, and two workers on two cores then run four busy
// threads. Looked up at run time because which BLAS is loaded is the system's
// choice. Returns the BLAS's name, or "" if it has no such knob.
std::string SetBlasThreads(int threads) {
  using SetThreads = void (*)(int);
  if (auto* f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    f(threads);
    return "openblas";
  }
  if (auto* f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads"))) {
    f(threads);
    return "mkl";
  }
  return "";
}

// Keeps freed memory in the process: by default glibc returns the top of the
// heap and large blocks to the kernel between prefills, and the next prefill
// takes thousands of page faults to get them back. Large blocks still come from
// mmap past 32 MiB (glibc's ceiling for the threshold).
void KeepFreedMemory() {
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  ::mallopt(M_TOP_PAD, 64 << 20);
}

std::vector<std::string> SplitModes(const std::string& list) {
  if (list == "all") return {"kvtier", "local", "none"};
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = list.find(',', b)) != std::string::npos; b = e + 1) out.push_back(list.substr(b, e - b));
  out.push_back(list.substr(b));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  ModelConfig mc;
  CLI::App app{"kvtier-worker: a libtorch transformer serving multi-turn chats through a KV cache", "kvtier-worker"};
  app.add_option("--model", a.model_file,
                 "Model config YAML (keys as in configs/models/tiny-llama.yaml), or a Hugging Face Llama model "
                 "directory (config.json, model.safetensors, tokenizer.json; scripts/make_model.py makes one)");
  app.add_option("--set", a.sets, "Override one model key, e.g. --set layers=8 (repeatable)");
  app.add_option("--save-weights", a.save_weights, "Write the model's weights (safetensors) and exit");
  app.add_option("--cache", a.cache,
                 "kvtier | local | none, or a comma list (or all): every turn is served in each mode back to back, "
                 "the order rotating from turn to turn, with identical prompts")
      ->check([](const std::string& v) -> std::string {
        std::vector<std::string> seen;
        for (const std::string& m : SplitModes(v)) {
          if (!ParseCacheMode(m).ok()) return "unknown cache mode '" + m + "' (kvtier, local, none, all)";
          if (std::find(seen.begin(), seen.end(), m) != seen.end()) return "cache mode '" + m + "' given twice";
          seen.push_back(m);
        }
        return "";
      })
      ->capture_default_str();
  app.add_option("--prompt-tokens", a.prompt_tokens,
                 "Serve one turn of exactly these token ids (comma-separated) as session --prompt-session in the "
                 "first cache mode, print it as JSON, and exit (another program can then read the same prefix)")
      ->delimiter(',');
  app.add_option("--prompt-session", a.prompt_session, "Session of --prompt-tokens")->capture_default_str();
  app.add_option("--logits", a.logits_tokens,
                 "Print, as JSON, the next-token logits after these token ids (comma-separated): once from one "
                 "prefill of all of them, once from a prefill of all but the last and a one-token step; then exit")
      ->delimiter(',');
  app.add_flag("--print-model-id", a.print_model_id,
               "Print the model's identity (of its weights and tokenizer) and exit");
  app.add_flag("--print-profile", a.print_profile,
               "Print the kvtierd profile this model's KV needs (JSON: layers, kv_heads, head_dim, dtype, "
               "block_tokens of --block-tokens) and exit, without loading the weights");
  app.add_option("--socket", a.socket, "kvtierd's socket (cache kvtier)")
      ->envname("KVTIER_SOCKET")
      ->capture_default_str();
  app.add_option("--tenant", a.tenant, "Tenant whose blocks this worker shares");
  app.add_option("--profile", a.profile, "kvtierd's profile for this model's KV (default: the daemon's first)");
  app.add_option("--name", a.name, "Client name shown by cachectl (default worker-<index>)");
  app.add_option("--model-id", a.model_id,
                 "Model identity sent to kvtierd: auto (a digest of the weights and tokenizer), none, or 32 hex "
                 "digits; only workers with equal identities share blocks")
      ->check([](const std::string& v) {
        return v == "auto" || v == "none" || ModelId::FromHex(v) ? std::string() : "not auto, none or 32 hex digits";
      })
      ->capture_default_str();
  app.add_option("--promote", a.promote,
                 "kvtier: host-tier hits are promoted to the GPU tier before the turn reads them (now), read in "
                 "place and promoted once read (after-read), or read in place and left there (no); auto: now when "
                 "the model and the GPU tier are on the GPU, else after-read")
      ->check(CLI::IsMember({"auto", "now", "after-read", "no"}))
      ->capture_default_str();
  app.add_option("--block-tokens", a.block_tokens, "Block size of the local cache (kvtier uses the daemon's)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_flag("--local-token-granular", a.local_token_granular,
               "Local cache reuses every cached token, not only full blocks");
  app.add_option("--device", a.device, "Where the model runs: auto (CUDA when libtorch has it), cpu, cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--threads", a.threads, "Threads for the model (ATen's intra-op pool and the BLAS library's)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_flag("!--no-keep-memory", a.keep_memory,
               "Let glibc return freed memory to the kernel between turns (the default keeps it)");
  WorkloadOptions& w = a.workload;
  app.add_option("--sessions", w.sessions, "Sessions in total (across workers)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--turns", w.turns, "Turns per session")->check(CLI::Range(1, 10000))->capture_default_str();
  app.add_option("--workers", w.workers, "Worker processes sharing the sessions")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--worker-index", w.worker_index, "This worker's index; serves sessions s % workers == index")
      ->capture_default_str();
  app.add_option("--system-tokens", w.system_tokens, "Shared system prompt length")->capture_default_str();
  app.add_option("--first-tokens", w.first_tokens, "First user message length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--user-tokens", w.user_tokens, "Later user message length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--output-tokens", w.output_tokens, "Reply length (greedy)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("--unique", w.unique, "Sessions share nothing (the zero-reuse workload)");
  app.add_option("--seed", w.seed, "Workload seed")->capture_default_str();
  app.add_option("--session-prefix", w.session_prefix, "Session ids are this prefix + a number")->capture_default_str();
  app.add_flag("--json", a.json, "One JSON object per turn, then a summary object");
  app.add_flag("--text", a.show_text, "Print each reply's text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (w.worker_index >= w.workers) {
    std::fprintf(stderr, "kvtier-worker: --worker-index %u must be below --workers %u\n", w.worker_index, w.workers);
    return 2;
  }
  if (!a.model_file.empty()) {
    auto loaded = LoadModelConfig(a.model_file);
    if (!loaded.ok()) return Fail("model config", loaded.status());
    mc = *loaded;
  }
  for (const std::string& kv : a.sets) {
    const size_t eq = kv.find('=');
    Status s = eq == std::string::npos ? InvalidArgument("expected key=value, got '" + kv + "'")
                                       : SetModelField(mc, kv.substr(0, eq), kv.substr(eq + 1));
    if (!s.ok()) return Fail("--set", s);
  }
  if (Status s = mc.Validate(); !s.ok()) return Fail("model", s);
  if (a.print_profile) {
    const ModelProfile p = mc.Profile(a.block_tokens);
    const nlohmann::ordered_json j = {{"name", mc.name},       {"layers", p.layers},
                                      {"kv_heads", p.kv_heads}, {"head_dim", p.head_dim},
                                      {"dtype", DTypeName(p.dtype)}, {"block_tokens", p.block_tokens}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (a.keep_memory) KeepFreedMemory();
  at::set_num_threads(static_cast<int>(a.threads));
  at::set_num_interop_threads(1);
  const std::string blas = SetBlasThreads(static_cast<int>(a.threads));
  if (a.device == "cuda" && !at::hasCUDA()) {
    std::fprintf(stderr, "kvtier-worker: --device cuda: this libtorch has no CUDA support\n");
    return 2;
  }
  const at::Device device = a.device == "cuda" || (a.device == "auto" && at::hasCUDA()) ? at::kCUDA : at::kCPU;
  auto model = Transformer::Create(mc, device);
  if (!model.ok()) return Fail("model", model.status());
  if (a.print_model_id) {
    auto id = (*model)->Identity();
    if (!id.ok()) return Fail("model identity", id.status());
    std::printf("%s\n", id->ToHex().c_str());
    return 0;
  }
  if (!a.logits_tokens.empty()) {
    const std::vector<TokenId> ids(a.logits_tokens.begin(), a.logits_tokens.end());
    auto logits_after = [&](size_t split) {
      KvBuffer kv;
      kv.Reserve(mc, static_cast<int64_t>(ids.size()), (*model)->options());
      std::span<const TokenId> all(ids);
      at::Tensor out = (*model)->Forward(all.first(split), kv);
      if (split < ids.size()) out = (*model)->Forward(all.subspan(split), kv);
      const at::Tensor c = out.contiguous().cpu();
      return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    };
    nlohmann::ordered_json j = {{"model", mc.Describe()}, {"tokens", ids.size()}, {"logits", logits_after(ids.size())}};
    if (ids.size() > 1) j["logits_incremental"] = logits_after(ids.size() - 1);
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (!a.save_weights.empty()) {
    if (Status s = (*model)->SaveWeights(a.save_weights); !s.ok()) return Fail("save weights", s);
    std::printf("wrote %s (%s)\n", a.save_weights.c_str(), mc.Describe().c_str());
    return 0;
  }

  {
    // Warm-up pass (thread pools, allocator, BLAS buffers), as a server does
    // before taking traffic, so the first measured turn is not charged for it.
    KvBuffer kv;
    kv.Reserve(mc, 65, (*model)->options());
    const std::vector<TokenId> warm = Encode(WorkloadText(0, 64));
    (void)(*model)->Forward(warm, kv);
    (void)(*model)->Forward(std::span<const TokenId>(warm).first(1), kv);
  }

  // A model directory's own tokenizer prints replies; the byte tokenizer otherwise.
  std::optional<HfTokenizer> hf_tokenizer;
  if (!mc.tokenizer_file.empty()) {
    auto t = HfTokenizer::Load(mc.tokenizer_file);
    if (!t.ok()) return Fail("tokenizer", t.status());
    hf_tokenizer = std::move(*t);
  }
  auto decode = [&](const std::vector<TokenId>& t) { return hf_tokenizer ? hf_tokenizer->Decode(t) : Decode(t); };

  const std::vector<std::string> mode_names = SplitModes(a.cache);
  const std::string name = a.name.empty() ? "worker-" + std::to_string(w.worker_index) : a.name;
  std::unique_ptr<Client> client;
  ModelId model_id;
  if (std::find(mode_names.begin(), mode_names.end(), "kvtier") != mode_names.end()) {
    ClientOptions opts;
    opts.socket_path = a.socket;
    opts.client_name = name;
    opts.tenant = a.tenant;
    opts.profile = a.profile;
    if (a.model_id == "auto") {
      auto id = (*model)->Identity();
      if (!id.ok()) return Fail("model identity", id.status());
      opts.model = *id;
    } else if (a.model_id != "none") {
      opts.model = *ModelId::FromHex(a.model_id);
    }
    model_id = opts.model;
    auto c = Client::Connect(opts);
    if (!c.ok()) return Fail("connect to " + a.socket, c.status());
    client = std::move(*c);
  }
  std::vector<std::unique_ptr<ChatRunner>> runners;
  for (const std::string& m : mode_names) {
    ChatOptions co;
    co.mode = *ParseCacheMode(m);
    co.block_tokens = a.block_tokens;
    co.local_token_granular = a.local_token_granular;
    co.client = client.get();
    if (a.promote == "now") co.promote = Promote::kNow;
    if (a.promote == "after-read") co.promote = Promote::kAfterRead;
    if (a.promote == "no") co.promote = Promote::kNo;
    auto runner = ChatRunner::Create(**model, co);
    if (!runner.ok()) return Fail("cache " + m, runner.status());
    runners.push_back(std::move(*runner));
  }
  if (!a.json) {
    std::printf("[%s] %s, cache %s, %u-token blocks, %u thread(s)%s\n", name.c_str(), mc.Describe().c_str(),
                a.cache.c_str(), runners[0]->block_tokens(), a.threads,
                blas.empty() ? "" : (" (" + blas + " too)").c_str());
    if (client) {
      std::printf("[%s] model identity %s\n", name.c_str(),
                  model_id.IsNull() ? "none (--model-id none: shares blocks with any model of this geometry)"
                                    : model_id.ToHex().c_str());
    }
  }

  if (!a.prompt_tokens.empty()) {
    const std::vector<TokenId> prompt(a.prompt_tokens.begin(), a.prompt_tokens.end());
    auto r = runners[0]->Turn(a.prompt_session, prompt, w.output_tokens);
    if (!r.ok()) return Fail("--prompt-tokens", r.status());
    nlohmann::ordered_json j = {{"session", a.prompt_session},
                                      {"mode", mode_names[0]},
                                      {"prompt_tokens", r->prompt_tokens},
                                      {"cached_tokens", r->cached_tokens},
                                      {"committed_blocks", r->committed_blocks},
                                      {"output", r->output},
                                      {"ttft_ms", r->ttft_ms},
                                      {"turn_ms", r->turn_ms},
                                      {"cache_error", r->cache_error}};
    if (hf_tokenizer) j["text"] = decode(r->output);
    std::printf("%s\n", j.dump().c_str());
    return r->cache_error.empty() ? 0 : 1;
  }

  struct Totals {
    uint64_t prompt = 0, cached = 0, computed = 0, output = 0, errors = 0;
  };
  std::vector<Totals> totals(runners.size());
  uint64_t mismatches = 0, pair = 0;
  std::vector<Conversation> chats;
  for (uint32_t s : WorkerSessions(w)) chats.emplace_back(w, s);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t turn = 0; turn < w.turns; ++turn) {
    for (Conversation& chat : chats) {
      const std::vector<TokenId> p = chat.NextPrompt(turn);
      // Every mode serves the same prompt; the order rotates so that none is
      // always first (caches warm) or last.
      std::vector<std::vector<TokenId>> replies(runners.size());
      for (size_t k = 0; k < runners.size(); ++k) {
        const size_t m = (pair + k) % runners.size();
        auto r = runners[m]->Turn(chat.id(), p, w.output_tokens);
        if (!r.ok()) return Fail(chat.id() + " turn " + std::to_string(turn) + " (" + mode_names[m] + ")", r.status());
        replies[m] = r->output;
        Totals& t = totals[m];
        t.prompt += r->prompt_tokens;
        t.cached += r->cached_tokens;
        t.computed += r->computed_tokens;
        t.output += r->output.size();
        t.errors += r->cache_error.empty() ? 0 : 1;
        if (a.json) {
          nlohmann::ordered_json j = {{"worker", w.worker_index},
                                      {"mode", mode_names[m]},
                                      {"session", chat.id()},
                                      {"turn", turn},
                                      {"pair", pair},
                                      {"order", k},
                                      {"prompt_tokens", r->prompt_tokens},
                                      {"cached_tokens", r->cached_tokens},
                                      {"computed_tokens", r->computed_tokens},
                                      {"promoted_blocks", r->promoted_blocks},
                                      {"committed_blocks", r->committed_blocks},
                                      {"duplicate_blocks", r->duplicate_blocks},
                                      {"output_tokens", r->output.size()},
                                      {"acquired", r->acquired},
                                      {"lookup_ms", r->lookup_ms},
                                      {"acquire_ms", r->acquire_ms},
                                      {"wait_ms", r->wait_ms},
                                      {"gather_ms", r->gather_ms},
                                      {"ttft_ms", r->ttft_ms},
                                      {"commit_ms", r->commit_ms},
                                      {"turn_ms", r->turn_ms},
                                      {"ttft_cpu_ms", r->ttft_cpu_ms},
                                      {"turn_cpu_ms", r->turn_cpu_ms}};
          if (!r->cache_error.empty()) j["cache_error"] = r->cache_error;
          std::printf("%s\n", j.dump().c_str());
        } else {
          std::printf(
              "[%s] %-8s turn %u %-6s: prompt %5u = %5u cached + %5u computed%s, ttft %8.1f ms, turn %8.1f ms%s\n",
              name.c_str(), chat.id().c_str(), turn, mode_names[m].c_str(), r->prompt_tokens, r->cached_tokens,
              r->computed_tokens,
              r->promoted_blocks ? (" (" + std::to_string(r->promoted_blocks) + " blocks promoted)").c_str() : "",
              r->ttft_ms, r->turn_ms, r->cache_error.empty() ? "" : ("  [" + r->cache_error + "]").c_str());
          if (a.show_text && m == 0) std::printf("    reply: %s\n", decode(r->output).c_str());
        }
        std::fflush(stdout);
      }
      // The history continues with the first listed mode's reply; greedy
      // decoding gives every mode the same one (counted when it does not).
      for (const auto& r : replies) mismatches += r != replies[0] ? 1 : 0;
      chat.AddReply(replies[0]);
      ++pair;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t m = 0; m < runners.size(); ++m) {
    const Totals& t = totals[m];
    if (a.json) {
      nlohmann::ordered_json j = {{"summary", true},
                                  {"worker", w.worker_index},
                                  {"mode", mode_names[m]},
                                  {"turns", chats.size() * w.turns},
                                  {"prompt_tokens", t.prompt},
                                  {"cached_tokens", t.cached},
                                  {"computed_tokens", t.computed},
                                  {"output_tokens", t.output},
                                  {"cache_errors", t.errors},
                                  {"reply_mismatches", mismatches},
                                  {"seconds", secs}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "[%s] %s done: %zu sessions x %u turns, %llu prompt tokens, %llu from cache (%.1f%%), %llu "
          "computed, %.1f s%s\n",
          name.c_str(), mode_names[m].c_str(), chats.size(), w.turns, (unsigned long long)t.prompt,
          (unsigned long long)t.cached, t.prompt ? 100.0 * double(t.cached) / double(t.prompt) : 0.0,
          (unsigned long long)t.computed, secs,
          t.errors ? (", " + std::to_string(t.errors) + " cache errors").c_str() : "");
    }
  }
  if (mismatches > 0) {
    std::fprintf(stderr, "kvtier-worker: %llu replies differed between cache modes\n", (unsigned long long)mismatches);
  }
  return 0;
}
