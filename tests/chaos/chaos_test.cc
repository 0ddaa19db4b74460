// Chaos and soak tests: real chaos_worker processes against a real kvtierd.
//
//   Chaos.WorkerKills     SIGKILL random workers at random moments and respawn them
//   Chaos.DaemonRestarts  SIGKILL the daemon under load and restart it; workers reconnect
//   Soak.MixedLoad        8 workers for KVTIER_SOAK_SECONDS; the daemon's RSS stays flat
//
// Afterwards each test checks, through a fresh client: no lease is left, the
// pools' used slots are exactly the cached blocks, and every cached block's
// payload verifies. Knobs: KVTIER_CHAOS_SEED, KVTIER_CHAOS_KILLS,
// KVTIER_CHAOS_RESTARTS, KVTIER_SOAK_SECONDS (see docs/testing.md).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chaos_common.h"
#include "kvtier/client.h"
#include "payload.h"
#include "process.h"

namespace kvtier::chaos {
namespace {

using testing::DaemonProcess;
using testing::JsonNumber;
using testing::Process;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#ifndef KVTIER_SOAK_DEFAULT_SECONDS
#define KVTIER_SOAK_DEFAULT_SECONDS 60
#endif

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    ADD_FAILURE() << name << "='" << v << "' is not a non-negative integer";
    return fallback;
  }
  return x;
}

uint64_t Seed() {
  const uint64_t fallback = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) % 1000000007ULL;
  const uint64_t seed = EnvU64("KVTIER_CHAOS_SEED", fallback);
  std::printf("seed %llu (rerun with KVTIER_CHAOS_SEED=%llu)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  return seed;
}

// Removes what a SIGKILLed kvtierd of an instance leaves in /dev/shm, whatever
// way the test ends. A daemon stopped cleanly has removed them already. Declared
// before the DaemonProcess, so that it runs after the daemon is gone.
class ShmJanitor {
 public:
  void Watch(std::string instance) { instance_ = std::move(instance); }
  ~ShmJanitor() {
    if (instance_.empty()) return;
    for (const std::string& f : Leftovers()) {
      std::error_code ec;
      std::filesystem::remove("/dev/shm/" + f, ec);
    }
  }
  std::vector<std::string> Leftovers() const {
    std::vector<std::string> out;
    if (instance_.empty()) return out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(instance_ + ".", 0) == 0) out.push_back(name);
    }
    return out;
  }

 private:
  std::string instance_;
};

std::string WorkerPath() {
#ifdef KVTIER_CHAOS_WORKER_PATH
  return KVTIER_CHAOS_WORKER_PATH;
#else
  return "chaos_worker";
#endif
}

// Worker processes, each respawnable under its index.
class Workers {
 public:
  Workers(const DaemonProcess& daemon, uint64_t seed, uint32_t count) : daemon_(daemon), seed_(seed), procs_(count) {}
  ~Workers() {
    for (auto& p : procs_) p.Kill(SIGKILL);
  }

  uint32_t size() const { return static_cast<uint32_t>(procs_.size()); }
  Process& at(uint32_t i) { return procs_[i]; }
  uint64_t spawned() const { return spawned_; }

  ::testing::AssertionResult Spawn(uint32_t i) {
    auto p = Process::Spawn({WorkerPath(), "--socket", daemon_.socket(), "--seed", std::to_string(seed_), "--worker",
                             std::to_string(i), "--incarnation", std::to_string(spawned_++)},
                            LogPath(i));
    if (!p.ok()) return ::testing::AssertionFailure() << p.status().ToString();
    procs_[i] = std::move(p).value();
    return ::testing::AssertionSuccess();
  }

  // Fails if any worker ended by itself (workers only stop when told).
  ::testing::AssertionResult AllRunning() {
    for (uint32_t i = 0; i < size(); ++i) {
      auto rc = procs_[i].Wait(milliseconds(0));
      if (rc.ok()) {
        std::string out;
        for (;;) {
          auto l = procs_[i].ReadLine(milliseconds(100));
          if (!l.ok()) break;
          out += *l + "\n";
        }
        return ::testing::AssertionFailure() << "worker " << i << " exited with " << *rc << ":\n"
                                             << out << Tail(LogPath(i));
      }
    }
    return ::testing::AssertionSuccess();
  }

  // SIGTERMs every worker and collects its "done" line; each must exit 0.
  ::testing::AssertionResult StopAll(std::vector<std::string>* done_lines) {
    for (auto& p : procs_) p.Kill(SIGTERM);
    for (uint32_t i = 0; i < size(); ++i) {
      std::string done, out;
      for (;;) {
        auto l = procs_[i].ReadLine(std::chrono::seconds(30));
        if (!l.ok()) break;
        out += *l + "\n";
        if (l->find("\"event\":\"done\"") != std::string::npos) done = *l;
      }
      auto rc = procs_[i].Wait(std::chrono::seconds(10));
      if (!rc.ok() || *rc != 0 || done.empty()) {
        return ::testing::AssertionFailure()
               << "worker " << i << " ended with " << (rc.ok() ? std::to_string(*rc) : rc.status().ToString()) << ":\n"
               << out << Tail(LogPath(i));
      }
      done_lines->push_back(done);
    }
    return ::testing::AssertionSuccess();
  }

  std::string LogPath(uint32_t i) const { return daemon_.dir() + "/worker-" + std::to_string(i) + ".log"; }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static std::string Tail(const std::string& path) {
    const std::string all = Read(path);
    return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
  }

 private:
  const DaemonProcess& daemon_;
  uint64_t seed_;
  std::vector<Process> procs_;
  uint64_t spawned_ = 0;
};

std::unique_ptr<Client> Connect(const DaemonProcess& d) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.client_name = "chaos-checker";
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::map<std::string, double> Stats(Client& c) {
  std::map<std::string, double> out;
  auto s = c.Stats();
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) {
    for (const auto& [k, v] : *s) out[k] = v;
  }
  return out;
}

// Once every worker is gone: waits for the daemon to finish their disconnects
// and copies, then checks its accounting. Returns the final stats.
std::map<std::string, double> CheckAccounting(Client& c) {
  std::map<std::string, double> s;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    s = Stats(c);
    const bool quiet =
        s["read_leases"] == 0 && s["write_leases"] == 0 && s["copies_in_flight"] == 0 && s["clients"] == 1;
    if (quiet || Clock::now() > deadline) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  std::printf(
      "accounting: gpu %g/%g used, host %g/%g used, blocks %g, sessions %g, leases %g+%g, copies %g, clients %g\n",
      s["gpu_used"], s["gpu_slots"], s["host_used"], s["host_slots"], s["blocks"], s["sessions"], s["read_leases"],
      s["write_leases"], s["copies_in_flight"], s["clients"]);
  EXPECT_EQ(s["clients"], 1) << "connections of dead workers are still open";
  EXPECT_EQ(s["read_leases"], 0) << "read leases leaked";
  EXPECT_EQ(s["write_leases"], 0) << "write leases leaked";
  EXPECT_EQ(s["copies_in_flight"], 0);
  EXPECT_LE(s["gpu_used"], s["gpu_slots"]);
  EXPECT_LE(s["host_used"], s["host_slots"]);
  // With no lease and no copy, every used slot holds exactly one cached block.
  EXPECT_EQ(s["gpu_used"] + s["host_used"], s["blocks"]) << "slots leaked (or blocks without a slot)";
  EXPECT_GT(s["blocks"], 0) << "the workers cached nothing";
  return s;
}

// Reads every cached block back and checks its payload: each block belongs to
// some session (unheld blocks are dropped), each session's tokens follow from
// its name. Returns the number of blocks verified.
uint64_t VerifyAll(Client& c, uint64_t seed, double expect_blocks) {
  auto sessions = c.ListSessions();
  EXPECT_TRUE(sessions.ok()) << sessions.status().ToString();
  if (!sessions.ok()) return 0;
  std::set<std::string> keys;
  uint64_t verified = 0;
  for (const auto& summary : *sessions) {
    auto owner = ParseSessionName(summary.id);
    EXPECT_TRUE(owner.has_value()) << "unexpected session '" << summary.id << "'";
    if (!owner) continue;
    auto info = c.GetSession(summary.id);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    if (!info.ok()) continue;
    const size_t n = info->chain.size();
    EXPECT_LE(n, kMaxBlocks);
    if (n == 0 || n > kMaxBlocks) continue;
    const auto all = ConversationTokens(seed, owner->worker, owner->conv, c.block_tokens());
    const std::span<const TokenId> tokens = std::span<const TokenId>(all).first(n * c.block_tokens());
    const std::vector<BlockKey> want = c.Keys(tokens);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(info->chain[i], want[i]) << "session " << summary.id << " block " << i << " has a foreign key";
      keys.insert(info->chain[i].ToHex());
    }
    auto lease = c.Acquire("", tokens, kvtier::Promote::kNo);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    if (!lease.ok()) continue;
    EXPECT_EQ(lease->size(), n) << "session " << summary.id << " holds blocks a lease cannot get";
    for (size_t i = 0; i < lease->size(); ++i) {
      EXPECT_TRUE(testing::PayloadIntact(want[i], lease->block(i).data, lease->slot_bytes()))
          << "session " << summary.id << " block " << i << " in " << TierName(lease->block(i).tier) << " slot "
          << lease->block(i).slot << " does not hold its payload";
      ++verified;
    }
    EXPECT_TRUE(lease->Release().ok());
  }
  EXPECT_EQ(static_cast<double>(keys.size()), expect_blocks) << "blocks held by no session";
  std::printf("verified %llu leased blocks (%zu distinct) of %zu sessions\n", static_cast<unsigned long long>(verified),
              keys.size(), sessions->size());
  return verified;
}

double Sum(const std::vector<std::string>& lines, const std::string& key) {
  double s = 0;
  for (const auto& l : lines) s += std::max(0.0, JsonNumber(l, key));
  return s;
}

void PrintDone(const std::vector<std::string>& done) {
  for (const auto& l : done) std::printf("  %s\n", l.c_str());
  std::printf(
      "survivors: %g ops, %g blocks verified, %g committed; errors: unavailable %g, timeout %g, "
      "resource_exhausted %g, failed_precondition %g, not_found %g\n",
      Sum(done, "ops"), Sum(done, "verified_blocks"), Sum(done, "committed_blocks"), Sum(done, "err_unavailable"),
      Sum(done, "err_timeout"), Sum(done, "err_resource_exhausted"), Sum(done, "err_failed_precondition"),
      Sum(done, "err_not_found"));
}

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Sanitizer reports (or UBSan's runtime errors) in a log.
bool HasSanitizerReport(const std::string& text) {
  for (const char* marker : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                             "ERROR: ThreadSanitizer", "runtime error:"}) {
    if (text.find(marker) != std::string::npos) return true;
  }
  return false;
}

// The end of every test: kvtierd stops cleanly on SIGTERM (exit 0, which a
// sanitizer report would change), removes its segments, and no process of the
// test, killed ones included, logged a sanitizer report.
void StopAndCheck(DaemonProcess& daemon, const Workers& workers, const ShmJanitor& janitor) {
  daemon.Kill(SIGTERM);
  auto rc = daemon.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(*rc, 0) << "kvtierd did not exit cleanly:\n" << daemon.log();
  EXPECT_FALSE(HasSanitizerReport(daemon.log())) << daemon.log();
  EXPECT_TRUE(janitor.Leftovers().empty()) << "kvtierd left segments behind";
  for (uint32_t i = 0; i < workers.size(); ++i) {
    const std::string log = Workers::Read(workers.LogPath(i));
    EXPECT_FALSE(HasSanitizerReport(log)) << "worker " << i << ":\n" << log;
  }
}

// One test's kvtierd and chaos workers. The janitor is declared first, so it
// removes the instance's segments after the daemon and workers are gone.
struct Rig {
  Rig(uint64_t run_seed, uint32_t count)
      : daemon(kChaosDaemonConfig), workers(daemon, run_seed, count), seed(run_seed) {
    janitor.Watch(daemon.instance());
  }

  // Starts kvtierd, then every worker.
  void Start() {
    const Status start = daemon.Start();
    ASSERT_TRUE(start.ok()) << start.ToString();
    for (uint32_t i = 0; i < workers.size(); ++i) ASSERT_TRUE(workers.Spawn(i));
  }

  // Stops the workers; kvtierd must still be serving. Then checks the
  // accounting and every block's payload through a fresh client, stops kvtierd
  // (StopAndCheck) and prints how the workers ended. *stats: the daemon's
  // counters; *done (if given): each worker's last line.
  void Finish(std::map<std::string, double>* stats, std::vector<std::string>* done_out = nullptr) {
    std::vector<std::string> done;
    ASSERT_TRUE(workers.StopAll(&done));
    ASSERT_EQ(daemon.Wait(milliseconds(0)).status().code(), StatusCode::kTimeout) << "kvtierd died:\n" << daemon.log();
    auto c = Connect(daemon);
    ASSERT_NE(c, nullptr);
    *stats = CheckAccounting(*c);
    VerifyAll(*c, seed, stats->at("blocks"));
    c.reset();
    StopAndCheck(daemon, workers, janitor);
    PrintDone(done);
    if (done_out != nullptr) *done_out = std::move(done);
  }

  ShmJanitor janitor;
  DaemonProcess daemon;
  Workers workers;
  const uint64_t seed;
};

TEST(Chaos, WorkerKills) {
  const uint64_t seed = Seed();
  const uint64_t kills = EnvU64("KVTIER_CHAOS_KILLS", 200);
  constexpr uint32_t kWorkers = 4;
  const auto started = Clock::now();
  Rig rig(seed, kWorkers);
  ASSERT_NO_FATAL_FAILURE(rig.Start());
  Workers& workers = rig.workers;
  std::mt19937_64 rng(seed);
  for (uint64_t k = 0; k < kills; ++k) {
    std::this_thread::sleep_for(milliseconds(rng() % 60));  // A random moment of a random operation.
    ASSERT_TRUE(workers.AllRunning()) << "after " << k << " kills";
    const uint32_t victim = static_cast<uint32_t>(rng() % kWorkers);
    workers.at(victim).Kill(SIGKILL);
    auto rc = workers.at(victim).Wait(std::chrono::seconds(10));
    ASSERT_TRUE(rc.ok() && *rc == 128 + SIGKILL)
        << "worker " << victim << " ended by itself: " << (rc.ok() ? std::to_string(*rc) : rc.status().ToString());
    ASSERT_TRUE(workers.Spawn(victim));
  }
  std::this_thread::sleep_for(milliseconds(500));  // The last respawns get going.
  ASSERT_TRUE(workers.AllRunning());
  std::map<std::string, double> s;
  ASSERT_NO_FATAL_FAILURE(rig.Finish(&s));
  std::printf(
      "FIGURES chaos_worker_kills: kills %llu, workers %u, daemon requests %g, committed blocks %g, "
      "dropped %g, evicted sessions %g, time %.1f s\n",
      static_cast<unsigned long long>(kills), kWorkers, s.at("requests"), s.at("committed_blocks"),
      s.at("dropped_blocks"), s.at("evicted_sessions"), Seconds(started));
  EXPECT_GE(s.at("requests"), static_cast<double>(kills)) << "the workers hardly ran";
}

TEST(Chaos, DaemonRestarts) {
  const uint64_t seed = Seed();
  const uint64_t restarts = EnvU64("KVTIER_CHAOS_RESTARTS", 20);
  constexpr uint32_t kWorkers = 4;
  const auto started = Clock::now();
  Rig rig(seed, kWorkers);
  ASSERT_NO_FATAL_FAILURE(rig.Start());
  DaemonProcess& daemon = rig.daemon;
  Workers& workers = rig.workers;

  // Each worker announces the first operation that succeeds on each daemon instance.
  std::vector<double> instance(kWorkers, -1);
  auto await_new_instance = [&](uint32_t w, std::chrono::seconds timeout) -> std::optional<int64_t> {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      auto l = workers.at(w).ReadLine(milliseconds(100));
      if (!l.ok()) {
        if (l.status().code() == StatusCode::kTimeout) continue;
        return std::nullopt;
      }
      if (l->find("\"event\":\"instance\"") == std::string::npos) continue;
      const double id = JsonNumber(*l, "instance");
      if (id == instance[w]) continue;
      instance[w] = id;
      return static_cast<int64_t>(JsonNumber(*l, "t_ns"));
    }
    return std::nullopt;
  };
  for (uint32_t w = 0; w < kWorkers; ++w)
    ASSERT_TRUE(await_new_instance(w, std::chrono::seconds(20))) << "worker " << w;

  std::mt19937_64 rng(seed);
  double worst_after_ready = 0, worst_after_kill = 0, worst_start = 0;
  for (uint64_t r = 0; r < restarts; ++r) {
    std::this_thread::sleep_for(milliseconds(150 + rng() % 250));  // Under load.
    ASSERT_TRUE(workers.AllRunning()) << "before restart " << r;
    ASSERT_EQ(daemon.Wait(milliseconds(0)).status().code(), StatusCode::kTimeout) << "kvtierd died:\n" << daemon.log();
    const auto killed = Clock::now();
    daemon.Kill(SIGKILL);
    ASSERT_TRUE(daemon.Wait(std::chrono::seconds(10)).ok());
    // What the dead daemon left must not stop the next one.
    ASSERT_TRUE(std::filesystem::exists(daemon.socket())) << "no stale socket to test against";
    // Its segments were nameless memfds: they died with it and its clients' mappings.
    EXPECT_TRUE(rig.janitor.Leftovers().empty()) << "a killed kvtierd leaves nothing named in /dev/shm";
    const Status st = daemon.Start();
    ASSERT_TRUE(st.ok()) << "restart " << r << ": " << st.ToString();
    const auto ready = Clock::now();
    worst_start = std::max(worst_start, std::chrono::duration<double>(ready - killed).count());
    const int64_t ready_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(ready.time_since_epoch()).count();
    const int64_t killed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(killed.time_since_epoch()).count();
    for (uint32_t w = 0; w < kWorkers; ++w) {
      const auto t = await_new_instance(w, std::chrono::seconds(10));
      ASSERT_TRUE(t.has_value()) << "worker " << w << " did not reconnect after restart " << r << "\n"
                                 << Workers::Tail(workers.LogPath(w));
      worst_after_ready = std::max(worst_after_ready, std::max<int64_t>(0, *t - ready_ns) / 1e9);
      worst_after_kill = std::max(worst_after_kill, (*t - killed_ns) / 1e9);
    }
  }
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(workers.AllRunning());
  std::map<std::string, double> s;
  ASSERT_NO_FATAL_FAILURE(rig.Finish(&s));
  std::printf(
      "FIGURES chaos_daemon_restarts: restarts %llu, workers %u, worst reconnect %.3f s after ready "
      "(%.3f s after the kill; worst kill-to-ready %.3f s), time %.1f s\n",
      static_cast<unsigned long long>(restarts), kWorkers, worst_after_ready, worst_after_kill, worst_start,
      Seconds(started));
  // The requirement: once a new kvtierd is up, every client is back within 1 s.
  EXPECT_LE(worst_after_ready, 1.0) << "a worker took " << worst_after_ready << " s to reconnect";
}

// VmRSS of `pid` in KiB; -1 if unreadable.
long RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

TEST(Soak, MixedLoad) {
  const uint64_t seed = Seed();
  const uint64_t seconds = EnvU64("KVTIER_SOAK_SECONDS", KVTIER_SOAK_DEFAULT_SECONDS);
  if (seconds == 0) GTEST_SKIP() << "KVTIER_SOAK_SECONDS=0";
  constexpr uint32_t kWorkers = 8;
#ifdef KVTIER_CHAOS_ASAN
  // ASan keeps up to 256 MiB of freed memory in quarantine by default, which
  // would look like growth; a small quarantine keeps the RSS check meaningful.
  if (std::getenv("ASAN_OPTIONS") == nullptr) ::setenv("ASAN_OPTIONS", "quarantine_size_mb=16", 1);
#endif
  Rig rig(seed, kWorkers);
  ASSERT_NO_FATAL_FAILURE(rig.Start());
  DaemonProcess& daemon = rig.daemon;
  Workers& workers = rig.workers;
  const auto started = Clock::now();
  const auto end = started + std::chrono::seconds(seconds);
  // Warm-up: the pools fill, the session table reaches its limit, caches settle.
  const double warmup = std::max(1.0, seconds * 0.2);
  std::vector<std::pair<double, long>> samples;
  double next = warmup;
  while (Clock::now() < end) {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE(workers.AllRunning());
    ASSERT_EQ(daemon.Wait(milliseconds(0)).status().code(), StatusCode::kTimeout) << "kvtierd died:\n" << daemon.log();
    if (Seconds(started) >= next) {
      samples.emplace_back(Seconds(started), RssKiB(daemon.pid()));
      next += std::max(1.0, (seconds - warmup) / 10);
    }
  }
  samples.emplace_back(Seconds(started), RssKiB(daemon.pid()));
  std::map<std::string, double> s;
  std::vector<std::string> done;
  ASSERT_NO_FATAL_FAILURE(rig.Finish(&s, &done));
  std::printf("daemon VmRSS samples (s: KiB):");
  for (const auto& [t, kib] : samples) std::printf(" %.1f:%ld", t, kib);
  std::printf("\n");
  ASSERT_GE(samples.size(), 2u);
  const long first = samples.front().second, last = samples.back().second;
  ASSERT_GT(first, 0);
  std::printf(
      "FIGURES soak_mixed_load: %llu s, %u workers, %g ops by workers, daemon requests %g, "
      "RSS %ld -> %ld KiB (%+.1f%%)\n",
      static_cast<unsigned long long>(seconds), kWorkers, Sum(done, "ops"), s.at("requests"), first, last,
      100.0 * (last - first) / first);
  // Generous: a leak of a few hundred bytes per request over a minute shows;
  // allocator and sanitizer noise does not.
  const long bound = first / 2 + KVTIER_SOAK_RSS_SLACK_KIB;
  EXPECT_LE(last - first, bound) << "kvtierd's RSS grew from " << first << " to " << last << " KiB";
}

}  // namespace
}  // namespace kvtier::chaos
