// kvtier-worker: a model worker. Loads (or seeds) a Llama-family transformer,
// serves the chat workload's sessions with one cache mode, and reports every
// turn (time to first token, tokens reused and computed) as text or JSON lines.
//
//   kvtier-worker --cache kvtier --socket /run/kvtier/kvtierd.sock --sessions 8 --turns 6
//   kvtier-worker --cache none --json ...          # the recompute baseline
//   kvtier-worker --save-weights model.safetensors # write the seeded weights and exit
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chat.h"
#include "tokenizer.h"
#include "transformer.h"
#include "workload.h"

using namespace kvtier;
using namespace kvtier::model;

namespace {

struct Args {
  std::string model_file, save_weights, device = "auto", cache = "kvtier", socket = "/run/kvtier/kvtierd.sock", tenant, name;
  std::vector<std::string> sets;
  uint32_t block_tokens = 16, threads = 1;
  bool local_token_granular = false, json = false, show_text = false;
  WorkloadOptions workload;
};

int Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "kvtier-worker: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  ModelConfig mc;
  CLI::App app{"kvtier-worker: a libtorch transformer serving multi-turn chats through a KV cache", "kvtier-worker"};
  app.add_option("--model", a.model_file, "Model config YAML (keys as in configs/model.yaml)");
  app.add_option("--set", a.sets, "Override one model key, e.g. --set layers=8 (repeatable)");
  app.add_option("--save-weights", a.save_weights, "Write the model's weights (safetensors) and exit");
  app.add_option("--cache", a.cache, "kvtier | local | none")->check(CLI::IsMember({"kvtier", "local", "none"}))
      ->capture_default_str();
  app.add_option("--socket", a.socket, "kvtierd's socket (cache kvtier)")->envname("KVTIER_SOCKET")->capture_default_str();
  app.add_option("--tenant", a.tenant, "Tenant whose blocks this worker shares");
  app.add_option("--name", a.name, "Client name shown by cachectl (default worker-<index>)");
  app.add_option("--block-tokens", a.block_tokens, "Block size of the local cache (kvtier uses the daemon's)")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_flag("--local-token-granular", a.local_token_granular,
               "Local cache reuses every cached token, not only full blocks");
  app.add_option("--device", a.device, "Where the model runs: auto (CUDA when libtorch has it), cpu, cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  app.add_option("--threads", a.threads, "Intra-op threads for the model")->check(CLI::Range(1, 256))->capture_default_str();
  WorkloadOptions& w = a.workload;
  app.add_option("--sessions", w.sessions, "Sessions in total (across workers)")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--turns", w.turns, "Turns per session")->check(CLI::Range(1, 10000))->capture_default_str();
  app.add_option("--workers", w.workers, "Worker processes sharing the sessions")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--worker-index", w.worker_index, "This worker's index; serves sessions s % workers == index")->capture_default_str();
  app.add_option("--system-tokens", w.system_tokens, "Shared system prompt length")->capture_default_str();
  app.add_option("--first-tokens", w.first_tokens, "First user message length")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--user-tokens", w.user_tokens, "Later user message length")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--output-tokens", w.output_tokens, "Reply length (greedy)")->check(CLI::Range(1, 1 << 16))->capture_default_str();
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
  at::set_num_threads(static_cast<int>(a.threads));
  at::set_num_interop_threads(1);
  if (a.device == "cuda" && !at::hasCUDA()) {
    std::fprintf(stderr, "kvtier-worker: --device cuda: this libtorch has no CUDA support\n");
    return 2;
  }
  const at::Device device = a.device == "cuda" || (a.device == "auto" && at::hasCUDA()) ? at::kCUDA : at::kCPU;
  auto model = Transformer::Create(mc, device);
  if (!model.ok()) return Fail("model", model.status());
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

  ChatOptions co;
  co.mode = *ParseCacheMode(a.cache);
  co.block_tokens = a.block_tokens;
  co.local_token_granular = a.local_token_granular;
  const std::string name = a.name.empty() ? "worker-" + std::to_string(w.worker_index) : a.name;
  std::unique_ptr<Client> client;
  if (co.mode == CacheMode::kKvtier) {
    ClientOptions opts;
    opts.socket_path = a.socket;
    opts.client_name = name;
    opts.tenant = a.tenant;
    auto c = Client::Connect(opts);
    if (!c.ok()) return Fail("connect to " + a.socket, c.status());
    client = std::move(*c);
    co.client = client.get();
  }
  auto runner = ChatRunner::Create(**model, co);
  if (!runner.ok()) return Fail("cache", runner.status());
  if (!a.json) {
    std::printf("[%s] %s, cache %s, %u-token blocks\n", name.c_str(), mc.Describe().c_str(), a.cache.c_str(),
                (*runner)->block_tokens());
  }

  std::vector<Conversation> chats;
  for (uint32_t s : WorkerSessions(w)) chats.emplace_back(w, s);
  uint64_t prompt = 0, cached = 0, computed = 0, output = 0, errors = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t turn = 0; turn < w.turns; ++turn) {
    for (Conversation& chat : chats) {
      const std::vector<TokenId>& p = chat.NextPrompt(turn);
      auto r = (*runner)->Turn(chat.id(), p, w.output_tokens);
      if (!r.ok()) return Fail(chat.id() + " turn " + std::to_string(turn), r.status());
      chat.AddReply(r->output);
      prompt += r->prompt_tokens;
      cached += r->cached_tokens;
      computed += r->computed_tokens;
      output += r->output.size();
      errors += r->cache_error.empty() ? 0 : 1;
      if (a.json) {
        nlohmann::ordered_json j = {
            {"worker", w.worker_index}, {"mode", a.cache}, {"session", chat.id()}, {"turn", turn},
            {"prompt_tokens", r->prompt_tokens}, {"cached_tokens", r->cached_tokens},
            {"computed_tokens", r->computed_tokens}, {"promoted_blocks", r->promoted_blocks},
            {"committed_blocks", r->committed_blocks}, {"output_tokens", r->output.size()},
            {"lookup_ms", r->lookup_ms}, {"ttft_ms", r->ttft_ms}, {"commit_ms", r->commit_ms},
            {"turn_ms", r->turn_ms}};
        if (!r->cache_error.empty()) j["cache_error"] = r->cache_error;
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("[%s] %-8s turn %u: prompt %5u = %5u cached + %5u computed%s, ttft %8.1f ms, turn %8.1f ms%s\n",
                    name.c_str(), chat.id().c_str(), turn, r->prompt_tokens, r->cached_tokens, r->computed_tokens,
                    r->promoted_blocks ? (" (" + std::to_string(r->promoted_blocks) + " blocks promoted)").c_str() : "",
                    r->ttft_ms, r->turn_ms, r->cache_error.empty() ? "" : ("  [" + r->cache_error + "]").c_str());
        if (a.show_text) std::printf("    reply: %s\n", Decode(r->output).c_str());
      }
      std::fflush(stdout);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    nlohmann::ordered_json j = {{"summary", true},       {"worker", w.worker_index}, {"mode", a.cache},
                                {"turns", chats.size() * w.turns}, {"prompt_tokens", prompt},
                                {"cached_tokens", cached}, {"computed_tokens", computed},
                                {"output_tokens", output}, {"cache_errors", errors}, {"seconds", secs}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("[%s] done: %zu sessions x %u turns, %llu prompt tokens, %llu from cache (%.1f%%), %llu computed, "
                "%.1f s%s\n",
                name.c_str(), chats.size(), w.turns, (unsigned long long)prompt, (unsigned long long)cached,
                prompt ? 100.0 * double(cached) / double(prompt) : 0.0, (unsigned long long)computed, secs,
                errors ? (", " + std::to_string(errors) + " cache errors").c_str() : "");
  }
  return 0;
}
