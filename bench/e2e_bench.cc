// kvtier-bench e2e: the end-to-end benchmark. Starts kvtierd (or uses a running
// one), runs the chat workload with W kvtier-worker processes in each cache mode
// (kvtier, local, none), a zero-reuse workload, and a sweep of history lengths,
// and reports time to first token (TTFT) per mode. The workers are separate
// processes that link libtorch; this driver does not.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
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
// profile describes: 4 layers x 4 kv heads x 64 dim, fp32, 16-token blocks. With
// --model, the profile is the one the worker says that model needs.
constexpr const char* kDaemonConfigTemplate = R"(backend: host
log_level: info
profiles:
  - name: default
    layers: %u
    kv_heads: %u
    head_dim: %u
    dtype: %s
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
  uint32_t zero_sessions = 32, zero_tokens = 512;
  std::vector<uint32_t> sweep = {256, 512, 1024, 2048};
  uint32_t sweep_sessions = 4;  // Per history length; each has two follow-up turns.
  uint32_t warmup_pairs = 1;    // Per worker, dropped from the paired figures.
  uint64_t seed = 0;            // 0: drawn from the clock (printed, so a run can be replayed).
  std::string gpu_bytes = "64MiB", host_bytes = "512MiB";
  std::string plot, records;
};

const char* const kModes[] = {"kvtier", "local", "none"};

struct TurnRecord {
  std::string mode, session;
  uint32_t worker = 0, turn = 0, prompt = 0, cached = 0, computed = 0, promoted = 0, output = 0;
  uint64_t pair = 0;
  double ttft_ms = 0, turn_ms = 0, ttft_cpu_ms = 0, turn_cpu_ms = 0;
  double acquire_ms = 0, wait_ms = 0, gather_ms = 0;
  bool acquired = false, cache_error = false;
};

// One phase: every worker serves every turn in each of `modes`, back to back.
struct PhaseRun {
  std::vector<TurnRecord> turns;
  double wall_s = 0;
  double workers_cpu_s = 0;  // User + system time of the worker processes.
  double daemon_cpu_s = 0;   // Of the kvtierd this benchmark started (0 for --socket).
  uint64_t reply_mismatches = 0;

  std::vector<const TurnRecord*> Of(const std::string& mode) const {
    std::vector<const TurnRecord*> out;
    for (const TurnRecord& t : turns) {
      if (t.mode == mode) out.push_back(&t);
    }
    return out;
  }
};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find(sep, b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

double ChildrenCpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// utime + stime of a running process, from /proc/PID/stat; 0 if unreadable.
double ProcessCpuSeconds(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = Split(stat.substr(close + 2), ' ');
  // Fields after the command: state is field 3, utime 14 and stime 15 (1-based).
  if (f.size() < 13) return 0;
  return double(std::stoull(f[11]) + std::stoull(f[12])) / double(::sysconf(_SC_CLK_TCK));
}

// Runs `workers` worker processes serving `modes` to completion and gathers their turns.
Result<PhaseRun> RunPhase(const E2eOptions& o, const std::string& socket, pid_t daemon_pid,
                          const std::string& modes, uint32_t workers, const std::vector<std::string>& workload) {
  PhaseRun run;
  std::vector<testing::Process> procs;
  const double cpu0 = ChildrenCpuSeconds(), daemon0 = ProcessCpuSeconds(daemon_pid);
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < workers; ++i) {
    std::vector<std::string> argv = {o.worker, "--cache", modes, "--socket", socket, "--json",
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
      if (j.value("summary", false)) {
        run.reply_mismatches = std::max<uint64_t>(run.reply_mismatches, j.value("reply_mismatches", uint64_t{0}));
        continue;
      }
      TurnRecord r;
      r.mode = j.value("mode", "");
      r.session = j.value("session", "");
      r.worker = j.value("worker", 0u);
      r.turn = j.value("turn", 0u);
      r.pair = j.value("pair", uint64_t{0});
      r.prompt = j.value("prompt_tokens", 0u);
      r.cached = j.value("cached_tokens", 0u);
      r.computed = j.value("computed_tokens", 0u);
      r.promoted = j.value("promoted_blocks", 0u);
      r.output = j.value("output_tokens", 0u);
      r.acquired = j.value("acquired", false);
      r.ttft_ms = j.value("ttft_ms", 0.0);
      r.turn_ms = j.value("turn_ms", 0.0);
      r.ttft_cpu_ms = j.value("ttft_cpu_ms", 0.0);
      r.acquire_ms = j.value("acquire_ms", 0.0);
      r.wait_ms = j.value("wait_ms", 0.0);
      r.gather_ms = j.value("gather_ms", 0.0);
      r.turn_cpu_ms = j.value("turn_cpu_ms", 0.0);
      r.cache_error = j.contains("cache_error");
      run.turns.push_back(std::move(r));
    }
    auto rc = p.Wait(std::chrono::minutes(1));
    if (!rc.ok()) return rc.status();
    if (*rc != 0) return Internal("a worker (--cache " + modes + ") exited with status " + std::to_string(*rc));
  }
  run.wall_s = NanosBetween(t0, Clock::now()) / 1e9;
  run.workers_cpu_s = ChildrenCpuSeconds() - cpu0;
  run.daemon_cpu_s = ProcessCpuSeconds(daemon_pid) - daemon0;
  return run;
}

// TTFTs of mode `a` and mode `b` for the same turns (same worker and pair),
// follow-up turns only when `follow_ups`, each worker's first `warmup` pairs dropped.
struct Paired {
  std::vector<double> a, b;
};
Paired Pair(const PhaseRun& run, const std::string& a, const std::string& b, bool follow_ups, uint32_t warmup) {
  std::map<std::pair<uint32_t, uint64_t>, const TurnRecord*> of_b;
  for (const TurnRecord* t : run.Of(b)) of_b[{t->worker, t->pair}] = t;
  std::map<uint32_t, uint32_t> seen;  // Per worker: pairs taken so far.
  Paired out;
  for (const TurnRecord* t : run.Of(a)) {
    if (follow_ups && t->turn == 0) continue;
    auto it = of_b.find({t->worker, t->pair});
    if (it == of_b.end()) continue;
    if (seen[t->worker]++ < warmup) continue;
    out.a.push_back(t->ttft_ms);
    out.b.push_back(it->second->ttft_ms);
  }
  return out;
}

std::vector<double> Ttfts(const PhaseRun& run, const std::string& mode, bool follow_ups_only) {
  std::vector<double> v;
  for (const TurnRecord* t : run.Of(mode)) {
    if (!follow_ups_only || t->turn > 0) v.push_back(t->ttft_ms);
  }
  return v;
}

// An SVG line chart of TTFT (log scale) against history length: one line per
// series, named "<mode> p50" (solid) or "<mode> p99" (dashed), colored by mode.
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
    const std::string base = mode.substr(0, mode.find(' '));
    const std::string c = colors.count(base) ? colors.at(base) : "#555";
    const bool dashed = mode.find("p99") != std::string::npos;
    out << "<polyline fill='none' stroke='" << c << "' stroke-width='2'"
        << (dashed ? " stroke-dasharray='6 4'" : "") << " points='";
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
               "         [--zero-sessions N] [--zero-tokens N] [--sweep L1,L2,..|none] [--sweep-sessions N]\n"
               "         [--warmup-pairs N] [--seed N] [--gpu-bytes SIZE] [--host-bytes SIZE]\n"
               "         [--plot FILE.svg] [--records FILE.jsonl] [--model DIR|YAML] [--worker PATH] [--worker-arg ARG]...\n"
               "Runs the chat workload (S sessions x T turns sharing a system prompt, W worker\n"
               "processes), a zero-reuse workload and a sweep of history lengths. Every worker\n"
               "holds all cache modes on one model and serves each turn in every mode back to\n"
               "back with the same prompt, rotating the order, so modes are compared turn by turn\n"
               "(paired ratios, median with a bootstrap 95%% interval) rather than across runs.\n"
               "Starts its own kvtierd (host backend, a GPU tier of --gpu-bytes) unless --socket\n"
               "names a running one. TTFT figures are over the follow-up turns (the first turn of\n"
               "a session brings a new document), each worker's first --warmup-pairs dropped.\n"
               "Every phase's prompts derive from --seed (default: drawn, and printed).\n"
               "--model runs every worker on that model (a Hugging Face Llama directory, e.g. the\n"
               "real chat model scripts/make_model.py makes, or a model YAML); the kvtierd it starts\n"
               "gets the profile the model's KV needs.\n");
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
      o.sweep_sessions = 1;
      o.warmup_pairs = 0;
    } else if (a == "--socket") {
      auto v = value();
      s = v.ok() ? (o.socket = *v, Status::Ok()) : v.status();
    } else if (a == "--worker") {
      auto v = value();
      s = v.ok() ? (o.worker = *v, Status::Ok()) : v.status();
    } else if (a == "--model") {
      auto v = value();
      // Every worker loads it; the kvtierd started here asks a worker for its profile.
      s = v.ok() ? (o.worker_args.push_back("--model"), o.worker_args.push_back(*v), Status::Ok()) : v.status();
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
    } else if (a == "--sweep-sessions") {
      s = number(o.sweep_sessions);
    } else if (a == "--warmup-pairs") {
      s = number(o.warmup_pairs);
    } else if (a == "--seed") {
      auto v = value();
      if (!v.ok()) return v.status();
      char* end = nullptr;
      o.seed = std::strtoull(v->c_str(), &end, 10);
      if (v->empty() || *end != '\0' || o.seed == 0) return InvalidArgument("--seed: a positive number, got '" + *v + "'");
    } else {
      return InvalidArgument("unknown option '" + a + "'");
    }
    if (!s.ok()) return s;
  }
  if (o.workers == 0 || o.sessions == 0 || o.turns < 2 || o.output_tokens == 0 || o.first_tokens == 0 ||
      o.user_tokens == 0 || o.zero_sessions == 0 || o.zero_tokens == 0 || o.sweep_sessions == 0) {
    return InvalidArgument("workers, sessions, tokens must be positive and --turns at least 2");
  }
  return Status::Ok();
}

struct Geometry {
  uint32_t layers = 4, kv_heads = 4, head_dim = 64;
  std::string dtype = "fp32";
};

// The KV geometry of the workers' model, as the worker itself reads it from
// --model and --worker-arg (kvtier-worker --print-profile; no weights loaded).
Result<Geometry> WorkerProfile(const E2eOptions& o) {
  std::vector<std::string> argv = {o.worker, "--print-profile"};
  argv.insert(argv.end(), o.worker_args.begin(), o.worker_args.end());
  auto p = testing::Process::Spawn(argv);
  if (!p.ok()) return p.status();
  auto line = p->ReadLine(std::chrono::seconds(60));
  if (!line.ok()) return Internal("kvtier-worker --print-profile printed nothing (does the model load?)");
  auto j = nlohmann::json::parse(*line, nullptr, false);
  if (!j.is_object() || !j.contains("layers")) return Internal("kvtier-worker --print-profile printed: " + *line);
  Geometry g;
  g.layers = j.value("layers", 0u);
  g.kv_heads = j.value("kv_heads", 0u);
  g.head_dim = j.value("head_dim", 0u);
  g.dtype = j.value("dtype", "");
  return g;
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
    auto geometry = WorkerProfile(o);
    if (!geometry.ok()) {
      std::fprintf(stderr, "kvtier-bench e2e: %s\n", geometry.status().ToString().c_str());
      return 1;
    }
    char config[1024];
    std::snprintf(config, sizeof config, kDaemonConfigTemplate, geometry->layers, geometry->kv_heads,
                  geometry->head_dim, geometry->dtype.c_str(), o.gpu_bytes.c_str(), o.host_bytes.c_str());
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

  if (o.seed == 0) {
    o.seed = (static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
              (uint64_t{static_cast<uint32_t>(::getpid())} << 32)) % 1000000007 + 1;
  }
  Progress("seed %llu (--seed %llu replays these prompts)\n", (unsigned long long)o.seed,
           (unsigned long long)o.seed);
  const pid_t daemon_pid = daemon ? daemon->pid() : 0;
  const std::string run_tag = std::to_string(o.seed);
  const std::string all_modes = "kvtier,local,none";
  auto phase_line = [daemon_pid](const char* what, const PhaseRun& run) {
    if (daemon_pid > 0) {
      Progress("%s: %.1f s wall, workers %.1f s CPU, kvtierd %.2f s CPU\n", what, run.wall_s, run.workers_cpu_s,
               run.daemon_cpu_s);
    } else {
      Progress("%s: %.1f s wall, workers %.1f s CPU\n", what, run.wall_s, run.workers_cpu_s);
    }
  };

  // The chat workload: every turn in each mode, back to back.
  const std::vector<std::string> workload = {
      "--sessions", std::to_string(o.sessions), "--turns", std::to_string(o.turns),
      "--system-tokens", std::to_string(o.system_tokens), "--first-tokens", std::to_string(o.first_tokens),
      "--user-tokens", std::to_string(o.user_tokens), "--output-tokens", std::to_string(o.output_tokens),
      "--seed", std::to_string(o.seed), "--session-prefix", "e2e-" + run_tag + "-"};
  auto chat = RunPhase(o, socket, daemon_pid, all_modes, o.workers, workload);
  if (!chat.ok()) return fail(chat.status());
  phase_line("chat workload", *chat);
  for (const char* mode : kModes) {
    const std::vector<double> t = Ttfts(*chat, mode, true);
    Progress("  %-6s follow-up TTFT p50 %.1f ms p99 %.1f ms over %zu turns\n", mode, Percentile(t, 50),
             Percentile(t, 99), t.size());
  }

  // No reuse at all: what consulting kvtier costs when it cannot help.
  const std::vector<std::string> zero_args = {
      "--unique", "--sessions", std::to_string(o.zero_sessions), "--turns", "1", "--first-tokens",
      std::to_string(o.zero_tokens), "--output-tokens", "1", "--seed", std::to_string(o.seed + 1),
      "--session-prefix", "zero-" + run_tag + "-"};
  auto zero = RunPhase(o, socket, daemon_pid, "kvtier,none", o.workers, zero_args);
  if (!zero.ok()) return fail(zero.status());
  phase_line("zero reuse", *zero);
  uint64_t zero_cached = 0, zero_acquires = 0;
  for (const TurnRecord* t : zero->Of("kvtier")) {
    zero_cached += t->cached;
    zero_acquires += t->acquired;
  }
  if (zero_cached != 0) {
    return fail(Internal("the zero-reuse phase found " + std::to_string(zero_cached) +
                         " cached tokens: its prompts were seen before (seed " + std::to_string(o.seed) + ")"));
  }

  // TTFT against history length: sweep_sessions sessions per length, each with
  // two follow-up turns measured.
  std::map<std::string, std::vector<std::pair<double, double>>> sweep;
  nlohmann::ordered_json sweep_json = nlohmann::ordered_json::array();
  PhaseRun sweep_total;
  for (uint32_t len : o.sweep) {
    const std::vector<std::string> args = {
        "--sessions", std::to_string(o.sweep_sessions * o.workers), "--turns", "3", "--system-tokens", "0",
        "--first-tokens", std::to_string(len), "--user-tokens", std::to_string(o.user_tokens), "--output-tokens",
        std::to_string(o.output_tokens), "--seed", std::to_string(o.seed + 2 + len), "--session-prefix",
        "sweep-" + run_tag + "-" + std::to_string(len) + "-"};
    auto run = RunPhase(o, socket, daemon_pid, all_modes, o.workers, args);
    if (!run.ok()) return fail(run.status());
    sweep_total.wall_s += run->wall_s;
    sweep_total.workers_cpu_s += run->workers_cpu_s;
    sweep_total.daemon_cpu_s += run->daemon_cpu_s;
    double history = 0;
    size_t n = 0;
    for (const TurnRecord& t : run->turns) {
      if (t.turn > 0) history += t.prompt, ++n;
    }
    history /= double(std::max<size_t>(n, 1));
    nlohmann::ordered_json row = {{"first_tokens", len}, {"history_tokens", std::lround(history)}};
    for (const char* mode : kModes) {
      const std::vector<double> t = Ttfts(*run, mode, true);
      sweep[std::string(mode) + " p50"].emplace_back(history, Percentile(t, 50));
      sweep[std::string(mode) + " p99"].emplace_back(history, Percentile(t, 99));
      row[std::string("p50_ms_") + mode] = Percentile(t, 50);
      row[std::string("p99_ms_") + mode] = Percentile(t, 99);
    }
    Progress("sweep %5.0f tokens: TTFT p50 kvtier %.1f ms, local %.1f ms, none %.1f ms\n", history,
             sweep["kvtier p50"].back().second, sweep["local p50"].back().second, sweep["none p50"].back().second);
    sweep_json.push_back(std::move(row));
  }
  if (!o.sweep.empty()) phase_line("sweep", sweep_total);
  if (!o.plot.empty() && !sweep.empty()) {
    WritePlot(o.plot, sweep, "TTFT p50 (solid) and p99 (dashed) vs history, " + std::to_string(o.user_tokens) +
                                 " new tokens a turn (" + machine.cpu_model + ")");
    Progress("plot written to %s\n", o.plot.c_str());
  }
  if (!o.records.empty()) {
    std::ofstream out(o.records);
    for (const PhaseRun* run : {&*chat, &*zero}) {
      for (const TurnRecord& r : run->turns) {
        out << nlohmann::json{{"mode", r.mode},           {"worker", r.worker},
                              {"pair", r.pair},           {"session", r.session},
                              {"turn", r.turn},           {"prompt_tokens", r.prompt},
                              {"cached_tokens", r.cached}, {"promoted_blocks", r.promoted},
                              {"ttft_ms", r.ttft_ms},     {"ttft_cpu_ms", r.ttft_cpu_ms}}
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

  uint64_t prompt = 0, cached = 0, computed = 0, promoted = 0, errors = 0;
  uint32_t min_history = UINT32_MAX, max_history = 0, max_new = 0;
  for (const TurnRecord* r : chat->Of("kvtier")) {
    prompt += r->prompt;
    cached += r->cached;
    computed += r->computed;
    promoted += r->promoted;
    errors += r->cache_error;
    if (r->turn > 0) {
      min_history = std::min(min_history, r->prompt);
      max_history = std::max(max_history, r->prompt);
      max_new = std::max(max_new, r->computed);
    }
  }
  auto p = [&](const char* mode, double pct) { return Percentile(Ttfts(*chat, mode, true), pct); };
  const Paired kl = Pair(*chat, "kvtier", "local", true, o.warmup_pairs);
  const Paired nk = Pair(*chat, "none", "kvtier", true, o.warmup_pairs);
  const Paired zk = Pair(*zero, "kvtier", "none", false, o.warmup_pairs);
  if (kl.a.empty() || nk.a.empty() || zk.a.empty()) {
    return fail(InvalidArgument("no pairs left after dropping --warmup-pairs; run more sessions or turns"));
  }
  const Interval kv_local_p50 = PairedMedianRatio(kl.a, kl.b, o.seed);
  const Interval kv_local_p99 = PairedPercentileRatio(kl.a, kl.b, 99, o.seed);
  const Interval none_kv = PairedMedianRatio(nk.a, nk.b, o.seed);
  const Interval zero_ratio = PairedMedianRatio(zk.a, zk.b, o.seed);
  const Interval zero_p99 = PairedPercentileRatio(zk.a, zk.b, 99, o.seed);
  Progress("kvtier: hit rate %.1f%% of prompt tokens, %llu blocks promoted back from the host tier, %llu cache errors; "
           "now %.0f GPU + %.0f host blocks in use\n",
           100.0 * double(cached) / double(prompt), (unsigned long long)promoted, (unsigned long long)errors,
           stats["gpu_used"], stats["host_used"]);
  auto verdict = [](const Interval& i, double target, bool at_most) {
    const bool met = at_most ? i.hi <= target : i.lo >= target;
    const bool missed = at_most ? i.lo > target : i.hi < target;
    return met ? "met" : missed ? "missed" : "inside the interval";
  };
  Progress("paired (median of per-turn ratios, 95%% bootstrap interval, %zu pairs; %zu zero-reuse pairs):\n",
           kl.a.size(), zk.a.size());
  Progress("  kvtier/local TTFT p50 %.3f [%.3f, %.3f] (<= 1.10: %s); p99 %.3f [%.3f, %.3f] (<= 1.5: %s)\n",
           kv_local_p50.value, kv_local_p50.lo, kv_local_p50.hi, verdict(kv_local_p50, 1.10, true),
           kv_local_p99.value, kv_local_p99.lo, kv_local_p99.hi, verdict(kv_local_p99, 1.5, true));
  Progress("  none/kvtier %.1f [%.1f, %.1f] (>= 10: %s)\n", none_kv.value, none_kv.lo, none_kv.hi,
           verdict(none_kv, 10, false));
  Progress("  zero-reuse kvtier/none %.3f [%.3f, %.3f] (<= 1.03: %s); %llu of %zu zero-reuse turns made an Acquire\n",
           zero_ratio.value, zero_ratio.lo, zero_ratio.hi, verdict(zero_ratio, 1.03, true),
           (unsigned long long)zero_acquires, zero->Of("kvtier").size());
  if (chat->reply_mismatches + zero->reply_mismatches > 0) {
    Progress("warning: %llu replies differed between cache modes\n",
             (unsigned long long)(chat->reply_mismatches + zero->reply_mismatches));
  }

  JsonObject j;
  j.Add("bench", "e2e");
  j.Add("seed", o.seed);
  for (const char* mode : kModes) j.Add(std::string("ttft_p50_ms_") + mode, p(mode, 50), 2);
  for (const char* mode : kModes) j.Add(std::string("ttft_p99_ms_") + mode, p(mode, 99), 2);
  for (const char* mode : kModes) {
    double busy_ms = 0;
    uint64_t out_tokens = 0;
    for (const TurnRecord* t : chat->Of(mode)) {
      busy_ms += t->turn_ms;
      out_tokens += t->output;
    }
    j.Add(std::string("tokens_per_s_") + mode, busy_ms > 0 ? 1000.0 * double(out_tokens) / busy_ms : 0.0, 2);
  }
  for (const char* mode : kModes) {
    std::vector<double> cpu;
    for (const TurnRecord* t : chat->Of(mode)) {
      if (t->turn > 0) cpu.push_back(t->ttft_cpu_ms);
    }
    j.Add(std::string("ttft_cpu_p50_ms_") + mode, Median(cpu), 2);
  }
  {
    // Where kvtier's follow-up lookups spend their time (medians over the turns).
    std::vector<double> acq, wait, gather;
    for (const TurnRecord* t : chat->Of("kvtier")) {
      if (t->turn == 0) continue;
      acq.push_back(t->acquire_ms);
      wait.push_back(t->wait_ms);
      gather.push_back(t->gather_ms);
    }
    if (!acq.empty()) {
      j.Add("kvtier_acquire_p50_ms", Median(acq), 3);
      j.Add("kvtier_acquire_p99_ms", Percentile(acq, 99), 3);
      j.Add("kvtier_fence_wait_p50_ms", Median(wait), 3);
      j.Add("kvtier_gather_p50_ms", Median(gather), 3);
      Progress("kvtier follow-up lookups: acquire p50 %.2f ms (p99 %.2f), promotion wait p50 %.2f ms, gather p50 "
               "%.2f ms\n",
               Median(acq), Percentile(acq, 99), Median(wait), Median(gather));
    }
  }
  j.Add("hit_rate", double(cached) / double(prompt), 4);
  j.Add("ideal_speedup", double(prompt) / double(computed), 2);
  j.Add("kvtier_vs_local_p50", kv_local_p50, 3);
  j.Add("kvtier_vs_local_p99", kv_local_p99, 3);
  j.Add("none_vs_kvtier_p50", none_kv, 2);
  j.Add("zero_hit_ratio", zero_ratio, 4);
  j.Add("zero_hit_ratio_p99", zero_p99, 4);
  j.Add("pairs", static_cast<uint64_t>(kl.a.size()));
  j.Add("zero_pairs", static_cast<uint64_t>(zk.a.size()));
  j.Add("zero_cached_tokens", zero_cached);
  j.Add("zero_acquires", zero_acquires);
  j.Add("ttft_p50_ms_zero_kvtier", Median(zk.a), 2);
  j.Add("ttft_p50_ms_zero_none", Median(zk.b), 2);
  j.Add("history_tokens_min", static_cast<uint64_t>(min_history));
  j.Add("history_tokens_max", static_cast<uint64_t>(max_history));
  j.Add("max_new_tokens_per_turn", static_cast<uint64_t>(max_new));
  j.Add("promoted_blocks", promoted);
  j.Add("demoted_blocks_daemon", static_cast<uint64_t>(stats["demoted_blocks"]));
  j.Add("gpu_blocks_used", static_cast<uint64_t>(stats["gpu_used"]));
  j.Add("host_blocks_used", static_cast<uint64_t>(stats["host_used"]));
  j.Add("gpu_slots", static_cast<uint64_t>(stats["gpu_slots"]));
  j.Add("cache_errors", errors);
  j.Add("reply_mismatches", chat->reply_mismatches + zero->reply_mismatches);
  for (const auto& [name, run] : {std::pair<const char*, const PhaseRun*>{"chat", &*chat}, {"zero", &*zero},
                                  {"sweep", &sweep_total}}) {
    j.Add(std::string("wall_s_") + name, run->wall_s, 2);
    j.Add(std::string("workers_cpu_s_") + name, run->workers_cpu_s, 2);
    j.Add(std::string("daemon_cpu_s_") + name, run->daemon_cpu_s, 3);
  }
  j.AddRaw("sweep", sweep_json.dump());
  j.Add("workers", static_cast<uint64_t>(o.workers));
  j.Add("sessions", static_cast<uint64_t>(o.sessions));
  j.Add("turns", static_cast<uint64_t>(o.turns));
  j.Add("machine", machine.cpu_model + ", " + std::to_string(machine.cores) + " cores");
  std::printf("%s\n", j.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
