// kvtier-bench e2e: the end-to-end benchmark. Starts kvtierd (or uses a running
// one), runs the chat workload with W kvtier-worker processes in each cache mode
// (kvtier, local, none), a zero-reuse workload, and a sweep of history lengths,
// and reports time to first token (TTFT) per mode. The workers are separate
// processes that link libtorch; this driver does not.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "bench_util.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier::bench {
namespace {

// The model the workers run by default is the one configs/kvtierd.yaml's default
// profile describes: 4 layers x 4 kv heads x 64 dim, fp32, 16-token blocks.
constexpr const char* kDaemonConfigTemplate = R"(backend: host
log_level: info
profiles:
  - name: default
    layers: 4
    kv_heads: 4
    head_dim: 64
    dtype: fp32
    block_tokens: 16
    gpu_bytes: %s
    host_bytes: %s
)";

struct E2eOptions {
  bool quick = false;
  std::string socket;  // A running kvtierd; empty: start one.
  std::string worker = KVTIER_WORKER_PATH;
  std::vector<std::string> worker_args;  // Passed to every worker (e.g. --set layers=8).
  uint32_t workers = 2, sessions = 8, turns = 6;
  uint32_t system_tokens = 256, first_tokens = 1536, user_tokens = 40, output_tokens = 16;
  uint32_t zero_sessions = 8, zero_tokens = 512;
  std::vector<uint32_t> sweep = {256, 512, 1024, 2048};
  std::string gpu_bytes = "64MiB", host_bytes = "512MiB";
  std::string plot, records;
};

struct TurnRecord {
  std::string mode, session;
  uint32_t turn = 0, prompt = 0, cached = 0, computed = 0, promoted = 0, output = 0;
  double ttft_ms = 0, turn_ms = 0;
  bool cache_error = false;
};

struct ModeRun {
  std::vector<TurnRecord> turns;
  double wall_s = 0;
  uint64_t output_tokens = 0;
};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find(sep, b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

// Runs `workers` worker processes of one mode to completion and gathers their turns.
Result<ModeRun> RunMode(const E2eOptions& o, const std::string& socket, const std::string& mode, uint32_t workers,
                        const std::vector<std::string>& workload) {
  ModeRun run;
  std::vector<testing::Process> procs;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < workers; ++i) {
    std::vector<std::string> argv = {o.worker, "--cache", mode, "--socket", socket, "--json",
                                     "--workers", std::to_string(workers), "--worker-index", std::to_string(i)};
    argv.insert(argv.end(), workload.begin(), workload.end());
    argv.insert(argv.end(), o.worker_args.begin(), o.worker_args.end());
    auto p = testing::Process::Spawn(argv);
    if (!p.ok()) return p.status();
    procs.push_back(std::move(p).value());
  }
  for (auto& p : procs) {
    for (auto line = p.ReadLine(std::chrono::minutes(30)); line.ok(); line = p.ReadLine(std::chrono::minutes(30))) {
      auto j = nlohmann::json::parse(*line, nullptr, false);
      if (!j.is_object()) return Internal("worker printed a line that is not JSON: " + *line);
      if (j.value("summary", false)) continue;
      TurnRecord r;
      r.mode = mode;
      r.session = j.value("session", "");
      r.turn = j.value("turn", 0u);
      r.prompt = j.value("prompt_tokens", 0u);
      r.cached = j.value("cached_tokens", 0u);
      r.computed = j.value("computed_tokens", 0u);
      r.promoted = j.value("promoted_blocks", 0u);
      r.output = j.value("output_tokens", 0u);
      r.ttft_ms = j.value("ttft_ms", 0.0);
      r.turn_ms = j.value("turn_ms", 0.0);
      r.cache_error = j.contains("cache_error");
      run.output_tokens += r.output;
      run.turns.push_back(std::move(r));
    }
    auto rc = p.Wait(std::chrono::minutes(1));
    if (!rc.ok()) return rc.status();
    if (*rc != 0) return Internal("a " + mode + " worker exited with status " + std::to_string(*rc));
  }
  run.wall_s = NanosBetween(t0, Clock::now()) / 1e9;
  return run;
}

std::vector<double> Ttfts(const ModeRun& run, bool follow_ups_only) {
  std::vector<double> v;
  for (const TurnRecord& t : run.turns) {
    if (!follow_ups_only || t.turn > 0) v.push_back(t.ttft_ms);
  }
  return v;
}

// An SVG line chart of TTFT (log scale) against history length, one line per mode.
void WritePlot(const std::string& path, const std::map<std::string, std::vector<std::pair<double, double>>>& lines,
               const std::string& title) {
  const double W = 720, H = 440, L = 70, R = 150, T = 40, B = 50;
  double x_max = 1, y_min = 1e300, y_max = 0;
  for (const auto& [mode, pts] : lines) {
    for (auto [x, y] : pts) {
      x_max = std::max(x_max, x);
      y_min = std::min(y_min, y);
      y_max = std::max(y_max, y);
    }
  }
  const double ly0 = std::floor(std::log10(std::max(y_min, 1e-3))), ly1 = std::ceil(std::log10(std::max(y_max, 1e-3)));
  auto px = [&](double x) { return L + (W - L - R) * x / x_max; };
  auto py = [&](double y) {
    return H - B - (H - T - B) * (std::log10(std::max(y, 1e-3)) - ly0) / std::max(ly1 - ly0, 1.0);
  };
  std::ofstream out(path);
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  out << "<text x='" << W / 2 << "' y='22' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  out << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B << "' stroke='black'/>\n";
  out << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B << "' stroke='black'/>\n";
  for (double e = ly0; e <= ly1; ++e) {
    const double y = py(std::pow(10, e));
    out << "<line x1='" << L << "' y1='" << y << "' x2='" << W - R << "' y2='" << y << "' stroke='#ddd'/>\n";
    out << "<text x='" << L - 6 << "' y='" << y + 4 << "' text-anchor='end'>" << std::pow(10, e) << "</text>\n";
  }
  for (int i = 0; i <= 4; ++i) {
    const double x = x_max * i / 4;
    out << "<text x='" << px(x) << "' y='" << H - B + 18 << "' text-anchor='middle'>" << std::lround(x) << "</text>\n";
  }
  out << "<text x='" << (L + W - R) / 2 << "' y='" << H - 12 << "' text-anchor='middle'>history (prompt tokens)</text>\n";
  out << "<text x='16' y='" << (T + H - B) / 2 << "' transform='rotate(-90 16 " << (T + H - B) / 2
      << ")' text-anchor='middle'>TTFT (ms, log scale)</text>\n";
  const std::map<std::string, std::string> colors = {{"kvtier", "#1f77b4"}, {"local", "#2ca02c"}, {"none", "#d62728"}};
  int row = 0;
  for (const auto& [mode, pts] : lines) {
    const std::string c = colors.count(mode) ? colors.at(mode) : "#555";
    out << "<polyline fill='none' stroke='" << c << "' stroke-width='2' points='";
    for (auto [x, y] : pts) out << px(x) << "," << py(y) << " ";
    out << "'/>\n";
    for (auto [x, y] : pts) out << "<circle cx='" << px(x) << "' cy='" << py(y) << "' r='3' fill='" << c << "'/>\n";
    out << "<text x='" << W - R + 12 << "' y='" << T + 20 + 18 * row++ << "' fill='" << c << "'>" << mode
        << "</text>\n";
  }
  out << "</svg>\n";
}

int Usage(int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: kvtier-bench e2e [--quick] [--socket PATH] [--workers N] [--sessions N] [--turns N]\n"
               "         [--system-tokens N] [--first-tokens N] [--user-tokens N] [--output-tokens N]\n"
               "         [--zero-sessions N] [--zero-tokens N] [--sweep L1,L2,..|none] [--gpu-bytes SIZE]\n"
               "         [--host-bytes SIZE] [--plot FILE.svg] [--records FILE.jsonl] [--worker PATH]\n"
               "         [--worker-arg ARG]...\n"
               "Runs the chat workload (S sessions x T turns sharing a system prompt, W worker\n"
               "processes) with each cache mode, a zero-reuse workload, and a sweep of history\n"
               "lengths. Starts its own kvtierd (host backend, a GPU tier of --gpu-bytes) unless\n"
               "--socket names a running one. TTFT percentiles are over the follow-up turns (the\n"
               "first turn of a session brings a new document and is reported on its own).\n");
  return rc;
}

Status ParseArgs(int argc, char** argv, E2eOptions& o) {
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return InvalidArgument(a + " needs a value");
      return std::string(argv[++i]);
    };
    auto number = [&](uint32_t& out) -> Status {
      auto v = value();
      if (!v.ok()) return v.status();
      char* end = nullptr;
      const unsigned long n = std::strtoul(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || n > 1000000) return InvalidArgument(a + ": bad number '" + *v + "'");
      out = static_cast<uint32_t>(n);
      return Status::Ok();
    };
    Status s;
    if (a == "--quick") {
      o.quick = true;
      o.sessions = 2;
      o.turns = 2;
      o.system_tokens = 32;
      o.first_tokens = 64;
      o.user_tokens = 16;
      o.output_tokens = 4;
      o.zero_sessions = 2;
      o.zero_tokens = 48;
      o.sweep = {64, 128};
    } else if (a == "--socket") {
      auto v = value();
      s = v.ok() ? (o.socket = *v, Status::Ok()) : v.status();
    } else if (a == "--worker") {
      auto v = value();
      s = v.ok() ? (o.worker = *v, Status::Ok()) : v.status();
    } else if (a == "--worker-arg") {
      auto v = value();
      s = v.ok() ? (o.worker_args.push_back(*v), Status::Ok()) : v.status();
    } else if (a == "--plot") {
      auto v = value();
      s = v.ok() ? (o.plot = *v, Status::Ok()) : v.status();
    } else if (a == "--records") {
      auto v = value();
      s = v.ok() ? (o.records = *v, Status::Ok()) : v.status();
    } else if (a == "--gpu-bytes") {
      auto v = value();
      s = v.ok() ? (o.gpu_bytes = *v, Status::Ok()) : v.status();
    } else if (a == "--host-bytes") {
      auto v = value();
      s = v.ok() ? (o.host_bytes = *v, Status::Ok()) : v.status();
    } else if (a == "--sweep") {
      auto v = value();
      if (!v.ok()) return v.status();
      o.sweep.clear();
      if (*v != "none") {
        for (const std::string& x : Split(*v, ',')) {
          const unsigned long n = std::strtoul(x.c_str(), nullptr, 10);
          if (n < 2 || n > 100000) return InvalidArgument("--sweep: bad length '" + x + "'");
          o.sweep.push_back(static_cast<uint32_t>(n));
        }
      }
    } else if (a == "--workers") {
      s = number(o.workers);
    } else if (a == "--sessions") {
      s = number(o.sessions);
    } else if (a == "--turns") {
      s = number(o.turns);
    } else if (a == "--system-tokens") {
      s = number(o.system_tokens);
    } else if (a == "--first-tokens") {
      s = number(o.first_tokens);
    } else if (a == "--user-tokens") {
      s = number(o.user_tokens);
    } else if (a == "--output-tokens") {
      s = number(o.output_tokens);
    } else if (a == "--zero-sessions") {
      s = number(o.zero_sessions);
    } else if (a == "--zero-tokens") {
      s = number(o.zero_tokens);
    } else {
      return InvalidArgument("unknown option '" + a + "'");
    }
    if (!s.ok()) return s;
  }
  if (o.workers == 0 || o.sessions == 0 || o.turns < 2 || o.output_tokens == 0 || o.first_tokens == 0 ||
      o.user_tokens == 0 || o.zero_sessions == 0 || o.zero_tokens == 0) {
    return InvalidArgument("workers, sessions, tokens must be positive and --turns at least 2");
  }
  return Status::Ok();
}

}  // namespace

int RunE2eBench(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return Usage(0);
  }
  E2eOptions o;
  if (Status s = ParseArgs(argc, argv, o); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench e2e: %s\n", s.message().c_str());
    return Usage(2);
  }
  if (std::string(KVTIER_WORKER_PATH).empty() && o.worker == KVTIER_WORKER_PATH) {
    std::fprintf(stderr, "kvtier-bench e2e: built without the model worker (libtorch); pass --worker PATH\n");
    return 1;
  }
  const MachineInfo machine = ReadMachineInfo();
  std::unique_ptr<testing::DaemonProcess> daemon;
  std::string socket = o.socket;
  if (socket.empty()) {
    char config[1024];
    std::snprintf(config, sizeof config, kDaemonConfigTemplate, o.gpu_bytes.c_str(), o.host_bytes.c_str());
    daemon = std::make_unique<testing::DaemonProcess>(config);
    if (Status s = daemon->Start(); !s.ok()) {
      std::fprintf(stderr, "kvtier-bench e2e: kvtierd: %s\n%s", s.ToString().c_str(), daemon->log().c_str());
      return 1;
    }
    socket = daemon->socket();
  }
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "kvtier-bench e2e: %s\n", s.ToString().c_str());
    if (daemon) std::fprintf(stderr, "kvtierd log:\n%s", daemon->log().c_str());
    return 1;
  };
  Progress("kvtierd on %s; %u workers, %u sessions x %u turns, system prompt %u tokens, first message %u, "
           "then %u a turn, replies of %u\n",
           socket.c_str(), o.workers, o.sessions, o.turns, o.system_tokens, o.first_tokens, o.user_tokens,
           o.output_tokens);

  const std::string run_tag = std::to_string(::getpid());
  const std::vector<std::string> workload = {
      "--sessions", std::to_string(o.sessions), "--turns", std::to_string(o.turns),
      "--system-tokens", std::to_string(o.system_tokens), "--first-tokens", std::to_string(o.first_tokens),
      "--user-tokens", std::to_string(o.user_tokens), "--output-tokens", std::to_string(o.output_tokens)};
  std::map<std::string, ModeRun> runs;
  for (const char* mode : {"kvtier", "local", "none"}) {
    std::vector<std::string> args = workload;
    args.insert(args.end(), {"--session-prefix", "e2e-" + run_tag + "-"});
    auto run = RunMode(o, socket, mode, o.workers, args);
    if (!run.ok()) return fail(run.status());
    const std::vector<double> t = Ttfts(*run, true);
    Progress("%-6s %zu turns in %.1f s: follow-up TTFT p50 %.1f ms p99 %.1f ms; first turn p50 %.1f ms\n", mode,
             run->turns.size(), run->wall_s, Percentile(t, 50), Percentile(t, 99),
             Median([&] {
               std::vector<double> f;
               for (const TurnRecord& r : run->turns) {
                 if (r.turn == 0) f.push_back(r.ttft_ms);
               }
               return f;
             }()));
    runs[mode] = std::move(*run);
  }

  // No reuse at all: what consulting kvtier costs when it cannot help.
  std::map<std::string, double> zero;
  for (const char* mode : {"kvtier", "none"}) {
    const std::vector<std::string> args = {
        "--unique", "--sessions", std::to_string(o.zero_sessions), "--turns", "1", "--first-tokens",
        std::to_string(o.zero_tokens), "--output-tokens", "1", "--seed", "77", "--session-prefix",
        "zero-" + run_tag + "-"};
    auto run = RunMode(o, socket, mode, o.workers, args);
    if (!run.ok()) return fail(run.status());
    zero[mode] = Median(Ttfts(*run, false));
    Progress("zero reuse, %-6s: %zu prompts of %u tokens, TTFT p50 %.1f ms\n", mode, run->turns.size(), o.zero_tokens,
             zero[mode]);
  }

  // TTFT against history length: one session per length, its second turn measured.
  std::map<std::string, std::vector<std::pair<double, double>>> sweep;
  for (uint32_t len : o.sweep) {
    for (const char* mode : {"kvtier", "local", "none"}) {
      const std::vector<std::string> args = {
          "--sessions", "1", "--turns", "2", "--system-tokens", "0", "--first-tokens", std::to_string(len),
          "--user-tokens", std::to_string(o.user_tokens), "--output-tokens", std::to_string(o.output_tokens),
          "--seed", std::to_string(1000 + len), "--session-prefix", "sweep-" + run_tag + "-" + std::to_string(len) + "-"};
      auto run = RunMode(o, socket, mode, 1, args);
      if (!run.ok()) return fail(run.status());
      for (const TurnRecord& r : run->turns) {
        if (r.turn == 1) sweep[mode].emplace_back(r.prompt, r.ttft_ms);
      }
    }
    Progress("sweep %5u tokens: kvtier %.1f ms, local %.1f ms, none %.1f ms\n", len, sweep["kvtier"].back().second,
             sweep["local"].back().second, sweep["none"].back().second);
  }
  if (!o.plot.empty() && !sweep.empty()) {
    WritePlot(o.plot, sweep, "Time to first token vs history, " + std::to_string(o.user_tokens) +
                                 " new tokens a turn (" + machine.cpu_model + ")");
    Progress("plot written to %s\n", o.plot.c_str());
  }
  if (!o.records.empty()) {
    std::ofstream out(o.records);
    for (const auto& [mode, run] : runs) {
      for (const TurnRecord& r : run.turns) {
        out << nlohmann::json{{"mode", r.mode}, {"session", r.session}, {"turn", r.turn}, {"prompt_tokens", r.prompt},
                              {"cached_tokens", r.cached}, {"ttft_ms", r.ttft_ms}}
                   .dump()
            << "\n";
      }
    }
  }

  // Where the blocks are now, and what moved.
  std::map<std::string, double> stats;
  {
    ClientOptions co;
    co.socket_path = socket;
    co.client_name = "kvtier-bench-e2e";
    auto c = Client::Connect(co);
    if (!c.ok()) return fail(c.status());
    auto s = (*c)->Stats();
    if (!s.ok()) return fail(s.status());
    for (const auto& [k, v] : *s) stats[k] = v;
  }

  const ModeRun& kv = runs["kvtier"];
  uint64_t prompt = 0, cached = 0, computed = 0, promoted = 0, errors = 0;
  uint32_t min_history = UINT32_MAX, max_history = 0, max_new = 0;
  for (const TurnRecord& r : kv.turns) {
    prompt += r.prompt;
    cached += r.cached;
    computed += r.computed;
    promoted += r.promoted;
    errors += r.cache_error;
    if (r.turn > 0) {
      min_history = std::min(min_history, r.prompt);
      max_history = std::max(max_history, r.prompt);
      max_new = std::max(max_new, r.computed);
    }
  }
  auto p = [&](const char* mode, double pct) { return Percentile(Ttfts(runs[mode], true), pct); };
  const double kv_vs_local = p("kvtier", 50) / p("local", 50);
  const double none_vs_kv = p("none", 50) / p("kvtier", 50);
  const double zero_ratio = zero["kvtier"] / zero["none"];
  Progress("kvtier: hit rate %.1f%% of prompt tokens, %llu blocks promoted back from the host tier, %llu cache errors; "
           "now %.0f GPU + %.0f host blocks in use\n",
           100.0 * double(cached) / double(prompt), (unsigned long long)promoted, (unsigned long long)errors,
           stats["gpu_used"], stats["host_used"]);
  Progress("targets: kvtier/local TTFT p50 %.3f (<= 1.10: %s), none/kvtier %.1f (>= 10: %s), zero-reuse %.3f "
           "(<= 1.03: %s)\n",
           kv_vs_local, kv_vs_local <= 1.10 ? "met" : "missed", none_vs_kv, none_vs_kv >= 10 ? "met" : "missed",
           zero_ratio, zero_ratio <= 1.03 ? "met" : "missed");

  JsonObject j;
  j.Add("bench", "e2e");
  for (const char* mode : {"kvtier", "local", "none"}) j.Add(std::string("ttft_p50_ms_") + mode, p(mode, 50), 2);
  for (const char* mode : {"kvtier", "local", "none"}) j.Add(std::string("ttft_p99_ms_") + mode, p(mode, 99), 2);
  for (const char* mode : {"kvtier", "local", "none"}) {
    j.Add(std::string("tokens_per_s_") + mode, double(runs[mode].output_tokens) / runs[mode].wall_s, 2);
  }
  j.Add("hit_rate", double(cached) / double(prompt), 4);
  j.Add("ideal_speedup", double(prompt) / double(computed), 2);
  j.Add("zero_hit_ratio", zero_ratio, 4);
  j.Add("kvtier_vs_local_p50", kv_vs_local, 3);
  j.Add("none_vs_kvtier_p50", none_vs_kv, 2);
  j.Add("ttft_p50_ms_zero_kvtier", zero["kvtier"], 2);
  j.Add("ttft_p50_ms_zero_none", zero["none"], 2);
  j.Add("history_tokens_min", static_cast<uint64_t>(min_history));
  j.Add("history_tokens_max", static_cast<uint64_t>(max_history));
  j.Add("max_new_tokens_per_turn", static_cast<uint64_t>(max_new));
  j.Add("promoted_blocks", promoted);
  j.Add("demoted_blocks_daemon", static_cast<uint64_t>(stats["demoted_blocks"]));
  j.Add("gpu_blocks_used", static_cast<uint64_t>(stats["gpu_used"]));
  j.Add("host_blocks_used", static_cast<uint64_t>(stats["host_used"]));
  j.Add("gpu_slots", static_cast<uint64_t>(stats["gpu_slots"]));
  j.Add("cache_errors", errors);
  j.Add("workers", static_cast<uint64_t>(o.workers));
  j.Add("sessions", static_cast<uint64_t>(o.sessions));
  j.Add("turns", static_cast<uint64_t>(o.turns));
  j.Add("machine", machine.cpu_model + ", " + std::to_string(machine.cores) + " cores");
  std::printf("%s\n", j.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
