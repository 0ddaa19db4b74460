// kvtier-bench ipc: what going through kvtierd costs a worker process.
//
// Starts a real kvtierd (host backend) and measures, from client processes:
//  - probe_2k_us: longest-prefix probe of a cached 2,048-token prompt straight from
//    the shared index (hashing included, no round trip);
//  - acquire_p50/p99_us, commit_p50_us (and allocate_p50_us): round trips for a
//    2,048-token (128-block) prefix, with 1 client process and with 4 (suffix _4c);
//  - uds_rtt_us: a bare Unix-socket ping-pong between two processes, the floor;
//  - acquire_vs_uds_b2b / _gap: acquire against that ping-pong interleaved call
//    for call in one loop, back to back and after 2 ms of idleness (paired
//    median ratio with a bootstrap interval), and against kvtierd's Ping and an
//    echo process that moves the acquire's frame sizes (acquire_vs_ping_*,
//    acquire_vs_sized_*: how much of the cost is kvtierd, how much the bytes);
//  - redis_get_us vs kvtier_read_us: reading one 2 MiB block and making one pass
//    over its bytes, from a local redis-server (GET) and from kvtier's host tier
//    (acquire, read in the mapped pool, release).
#include <hiredis/hiredis.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_commands.h"
#include "bench_util.h"
#include "kvtier/client.h"
#include "kvtier/wire.h"
#include "process.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kPromptTokens = 2048;
constexpr uint32_t kBlockTokens = 16;  // The "small" profile's block_tokens (kBenchConfig).

struct IpcOptions {
  int iterations = 2000;
  int read_iterations = 200;
  bool interleaved_only = false;  // --interleaved: only the interleaved comparisons.
  uint32_t blocks = kPromptTokens / kBlockTokens;  // --blocks: the interleaved acquires' prompt, in blocks.
};

constexpr const char* kBenchConfig = R"(backend: host
log_level: info
profiles:
  - name: small
    layers: 4
    kv_heads: 2
    head_dim: 64
    dtype: fp16
    block_tokens: 16
    gpu_blocks: 16384
    host_blocks: 4096
  - name: big
    layers: 32
    kv_heads: 8
    head_dim: 128
    dtype: bf16
    block_tokens: 16
    gpu_blocks: 16
    host_blocks: 16
tiering:
  gpu_high_watermark: 1.0
  gpu_low_watermark: 0.9
  host_high_watermark: 1.0
  host_low_watermark: 0.9
limits:
  max_sessions: 1000000
)";

std::vector<TokenId> Prompt(uint64_t seed, uint32_t n) {
  Rng rng(seed);
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(rng.Below(128000));
  return t;
}

std::unique_ptr<Client> ConnectOrDie(const std::string& socket, const std::string& profile) {
  ClientOptions o;
  o.socket_path = socket;
  o.profile = profile;
  o.client_name = "kvtier-bench";
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "kvtier-bench ipc: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(c).value();
}

void Check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "kvtier-bench ipc: %s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

// Exits unless an acquire leased `want` blocks (the whole cached prefix).
void CheckHit(size_t got, size_t want) {
  if (got != want) {
    std::fprintf(stderr, "kvtier-bench ipc: expected a hit of %zu blocks, got %zu\n", want, got);
    std::exit(1);
  }
}

// Commits `tokens` (all of it) under `session`; returns the time of the Commit call.
double CommitPrompt(Client& c, const std::string& session, const std::vector<TokenId>& tokens, double* alloc_us) {
  const auto t0 = Clock::now();
  auto w = c.Allocate(static_cast<uint32_t>(tokens.size() / c.block_tokens()));
  const auto t1 = Clock::now();
  Check(w.status(), "allocate");
  auto r = c.Commit(*w, session, BlockKey{}, 0, tokens);
  const auto t2 = Clock::now();
  Check(r.status(), "commit");
  if (alloc_us) *alloc_us = NanosBetween(t0, t1) / 1e3;
  return NanosBetween(t1, t2) / 1e3;
}

struct Latencies {
  std::vector<double> acquire, commit, allocate;
};

// One client's loop: acquire (and release) cached prompts, commit fresh ones.
Latencies ClientLoop(const std::string& socket, uint64_t seed, int iterations) {
  auto c = ConnectOrDie(socket, "small");
  Latencies out;
  constexpr int kCached = 8;
  std::vector<std::vector<TokenId>> cached;
  for (int i = 0; i < kCached; ++i) {
    cached.push_back(Prompt(seed * 1000 + i, kPromptTokens));
    CommitPrompt(*c, "bench-" + std::to_string(seed) + "-" + std::to_string(i), cached.back(), nullptr);
  }
  for (int i = 0; i < iterations; ++i) {
    const auto& tokens = cached[i % kCached];
    const auto t0 = Clock::now();
    auto lease = c->Acquire("bench-" + std::to_string(seed) + "-" + std::to_string(i % kCached), tokens);
    const auto t1 = Clock::now();
    Check(lease.status(), "acquire");
    CheckHit(lease->size(), kPromptTokens / c->block_tokens());
    out.acquire.push_back(NanosBetween(t0, t1) / 1e3);
    Check(lease->Release(), "release");
    if (i % 8 == 0) {
      const std::string s = "fresh-" + std::to_string(seed) + "-" + std::to_string(i);
      double alloc_us = 0;
      out.commit.push_back(CommitPrompt(*c, s, Prompt(seed * 7919 + i + 1000000, kPromptTokens), &alloc_us));
      out.allocate.push_back(alloc_us);
      (void)c->Evict(s);
    }
  }
  return out;
}

std::string JoinDoubles(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof(buf), "%.2f ", x);
    s += buf;
  }
  return s;
}

std::vector<double> ParseDoubles(const std::string& s) {
  std::vector<double> v;
  const char* p = s.c_str();
  char* end = nullptr;
  for (double x = std::strtod(p, &end); end != p; x = std::strtod(p, &end)) {
    v.push_back(x);
    p = end;
  }
  return v;
}

// A forked process that answers on its end of a socket pair until the other
// end closes: each `request` bytes read get `reply` bytes back (0: what
// arrived, echoed). Returns its pid (-1 on failure); sv[0] is ours.
pid_t SpawnEcho(int sv[2], size_t request = 0, size_t reply = 0) {
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(sv[0]);
    std::vector<uint8_t> in(std::max<size_t>(request, 64)), out(reply);
    for (;;) {
      if (request == 0) {
        const ssize_t n = ::read(sv[1], in.data(), 32);
        if (n <= 0) _exit(0);
        if (::write(sv[1], in.data(), static_cast<size_t>(n)) != n) _exit(1);
        continue;
      }
      for (size_t got = 0; got < request;) {
        const ssize_t n = ::read(sv[1], in.data() + got, request - got);
        if (n <= 0) _exit(0);
        got += static_cast<size_t>(n);
      }
      if (::write(sv[1], out.data(), reply) != static_cast<ssize_t>(reply)) _exit(1);
    }
  }
  ::close(sv[1]);
  return child;
}

// One exchange with an echo process: `request` bytes out, `reply` back.
// Returns its time in µs, or -1 if the echo process is gone.
double EchoOnce(int fd, std::vector<uint8_t>& buf, size_t request, size_t reply) {
  const auto t0 = Clock::now();
  if (::write(fd, buf.data(), request) != static_cast<ssize_t>(request)) return -1;
  for (size_t got = 0; got < reply;) {
    const ssize_t n = ::read(fd, buf.data() + got, reply - got);
    if (n <= 0) return -1;
    got += static_cast<size_t>(n);
  }
  return NanosBetween(t0, Clock::now()) / 1e3;
}

// Bare Unix-socket ping-pong between this process and a forked echo process.
double UdsRttUs(int iterations) {
  int sv[2];
  const pid_t child = SpawnEcho(sv);
  if (child < 0) return -1;
  std::vector<uint8_t> buf(32);
  std::vector<double> rtt;
  for (int i = 0; i < iterations + 200; ++i) {
    const double us = EchoOnce(sv[0], buf, 32, 32);
    if (us < 0) break;
    if (i >= 200) rtt.push_back(us);
  }
  ::close(sv[0]);
  ::waitpid(child, nullptr, 0);
  return Median(rtt);
}

uint64_t Checksum(const std::byte* p, size_t n) {
  uint64_t a = 0, b = 0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    uint64_t x, y;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, p + i + 8, 8);
    a += x;
    b ^= y;
  }
  return a ^ (b * 31);
}

struct ReadFigures {
  double redis_us = -1, kvtier_us = -1;
  bool same_bytes = false;
};

ReadFigures ReadBench(const std::string& socket, const std::string& dir, int iterations) {
  ReadFigures f;
  auto c = ConnectOrDie(socket, "big");
  const size_t bytes = c->profile().BlockBytes();
  const std::vector<TokenId> tokens = Prompt(4242, c->block_tokens());
  std::vector<std::byte> value(bytes);
  Rng rng(99);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t x = rng.Next();
    std::memcpy(value.data() + i, &x, 8);
  }
  auto w = c->Allocate(1);
  Check(w.status(), "allocate 2 MiB block");
  std::memcpy(w->data(0), value.data(), bytes);
  Check(c->Commit(*w, "read-bench", BlockKey{}, 0, tokens).status(), "commit 2 MiB block");
  auto demoted = c->Demote("read-bench");
  Check(demoted.status(), "demote");
  // Let the demotion land; then the block is read in the host tier (no promotion).
  for (int i = 0; i < 1000; ++i) {
    std::vector<Tier> tiers(1);
    if (c->Probe(tokens, tiers) == 1 && tiers[0] == Tier::kHost) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const uint64_t want = Checksum(value.data(), bytes);
  std::vector<double> kv;
  uint64_t sum = 0;
  for (int i = 0; i < iterations + 10; ++i) {
    const auto t0 = Clock::now();
    auto lease = c->Acquire("", tokens, kvtier::Promote::kNo);
    Check(lease.status(), "acquire 2 MiB block");
    sum = Checksum(lease->block(0).data, bytes);
    (void)lease->Release();
    if (i >= 10) kv.push_back(NanosBetween(t0, Clock::now()) / 1e3);
  }
  f.kvtier_us = Median(kv);

  // redis-server on a Unix socket in the bench's directory, nothing persisted.
  const std::string rsock = dir + "/redis.sock";
  auto redis = testing::Process::Spawn(
      {"/usr/bin/redis-server", "--port", "0", "--unixsocket", rsock, "--save", "", "--appendonly", "no", "--dir", dir},
      dir + "/redis.log");
  if (!redis.ok()) {
    Progress("  redis-server not started (%s): skipping the redis baseline\n", redis.status().ToString().c_str());
    return f;
  }
  redisContext* rc = nullptr;
  for (int i = 0; i < 500 && (rc == nullptr || rc->err); ++i) {
    if (rc) redisFree(rc);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    rc = redisConnectUnix(rsock.c_str());
  }
  if (rc == nullptr || rc->err) {
    Progress("  cannot connect to redis-server: skipping the redis baseline\n");
    if (rc) redisFree(rc);
    return f;
  }
  auto* set = static_cast<redisReply*>(redisCommand(rc, "SET kv %b", value.data(), bytes));
  if (set) freeReplyObject(set);
  std::vector<double> rd;
  uint64_t rsum = 0;
  for (int i = 0; i < iterations + 10; ++i) {
    const auto t0 = Clock::now();
    auto* r = static_cast<redisReply*>(redisCommand(rc, "GET kv"));
    if (r == nullptr || r->type != REDIS_REPLY_STRING || r->len != bytes) {
      Progress("  redis GET failed\n");
      break;
    }
    rsum = Checksum(reinterpret_cast<const std::byte*>(r->str), bytes);
    freeReplyObject(r);
    if (i >= 10) rd.push_back(NanosBetween(t0, Clock::now()) / 1e3);
  }
  redisFree(rc);
  redis->Kill(SIGTERM);
  (void)redis->Wait(std::chrono::seconds(5));
  if (!rd.empty()) f.redis_us = Median(rd);
  f.same_bytes = sum == want && rsum == want;
  return f;
}

}  // namespace

// Acquire of a cached prefix of `blocks` blocks against a bare Unix-socket ping-pong,
// interleaved one for one in the same loop (so both see the same machine),
// with kvtierd's Ping between them, each call after `gap` of idleness (0: back
// to back). An idle daemon's thread sleeps in epoll_wait and its CPU may be in
// a deep idle state, so a call after a gap pays the wake-up; the bare ping pays
// it the same way. With `sized`, the echo process moves as many bytes as the
// acquire's request and reply frames instead of 32: what the transport alone
// costs for them, the floor under an acquire. (A loop of its own: a third
// process in the loop moves the other figures.)
struct Interleaved {
  std::vector<double> acquire, echo, ping;
  size_t request_bytes = 32, reply_bytes = 32;  // What the echo process moved.
};
Interleaved AcquireVersusEcho(const std::string& socket, std::chrono::microseconds gap, int iterations, bool sized,
                              uint32_t blocks) {
  Interleaved out;
  auto c = ConnectOrDie(socket, "small");
  constexpr int kCached = 8;
  std::vector<std::vector<TokenId>> cached;
  for (int i = 0; i < kCached; ++i) {
    cached.push_back(Prompt(4242 + i, blocks * c->block_tokens()));
    CommitPrompt(*c, "interleaved-" + std::to_string(i), cached.back(), nullptr);
  }
  if (sized) {
    // The frames an acquire of cached[0] sends and receives.
    wire::AcquireRequest req;
    req.session = "interleaved-0";
    req.keys = c->Keys(cached[0]);
    req.tokens = cached[0];
    wire::AcquireResponse rep;
    rep.blocks.resize(req.keys.size());
    std::vector<uint8_t> frame;
    wire::AppendFrame(frame, 1, req);
    out.request_bytes = frame.size();
    frame.clear();
    wire::AppendFrame(frame, 1, rep);
    out.reply_bytes = frame.size();
  }
  int sv[2];
  const pid_t child = sized ? SpawnEcho(sv, out.request_bytes, out.reply_bytes) : SpawnEcho(sv);
  if (child < 0) return out;
  std::vector<uint8_t> buf(std::max(out.request_bytes, out.reply_bytes));
  const int warmup = 20;
  const auto idle = [gap] {
    if (gap.count() > 0) std::this_thread::sleep_for(gap);
  };
  for (int i = 0; i < iterations + warmup; ++i) {
    idle();
    const double echo = EchoOnce(sv[0], buf, out.request_bytes, out.reply_bytes);
    if (echo < 0) break;
    idle();
    auto t0 = Clock::now();
    Check(c->Ping().status(), "ping");
    const double ping = NanosBetween(t0, Clock::now()) / 1e3;
    idle();
    t0 = Clock::now();
    auto lease = c->Acquire("interleaved-" + std::to_string(i % kCached), cached[i % kCached]);
    const double acq = NanosBetween(t0, Clock::now()) / 1e3;
    Check(lease.status(), "acquire");
    CheckHit(lease->size(), blocks);
    Check(lease->Release(), "release");
    if (i >= warmup) {
      out.echo.push_back(echo);
      out.ping.push_back(ping);
      out.acquire.push_back(acq);
    }
  }
  ::close(sv[0]);
  ::waitpid(child, nullptr, 0);
  return out;
}

// The probe, the 1- and 4-client latencies and the bare socket's own loop, added to `j`.
// Returns 0, or the exit status after a failure it reported.
int RunLatencyPhases(const std::string& socket, const IpcOptions& opt, JsonObject& j) {
  const double uds = UdsRttUs(opt.iterations * 5);
  Progress("uds_rtt_us %.2f (bare socket ping-pong between two processes)\n", uds);

  // Probe from shared memory.
  double probe_us = 0;
  {
    auto c = ConnectOrDie(socket, "small");
    const auto tokens = Prompt(77, kPromptTokens);
    CommitPrompt(*c, "probe", tokens, nullptr);
    std::vector<double> t;
    size_t hit = 0;
    for (int i = 0; i < opt.iterations; ++i) {
      const auto t0 = Clock::now();
      hit = c->Probe(tokens);
      t.push_back(NanosBetween(t0, Clock::now()) / 1e3);
    }
    probe_us = Median(t);
    Progress("probe_2k_us %.2f (%zu of 128 blocks found)\n", probe_us, hit);
  }

  Latencies one = ClientLoop(socket, 1, opt.iterations);
  Progress("1 client: acquire p50 %.1f us p99 %.1f us, commit p50 %.1f us, allocate p50 %.1f us\n",
           Percentile(one.acquire, 50), Percentile(one.acquire, 99), Percentile(one.commit, 50),
           Percentile(one.allocate, 50));

  // Four client processes at once.
  Latencies four;
  {
    std::vector<testing::Process> procs;
    for (int i = 0; i < 4; ++i) {
      auto p = testing::Process::Spawn(
          {"/proc/self/exe", "ipc-client", socket, std::to_string(10 + i), std::to_string(opt.iterations)});
      if (!p.ok()) {
        std::fprintf(stderr, "kvtier-bench ipc: %s\n", p.status().ToString().c_str());
        return 1;
      }
      procs.push_back(std::move(p).value());
    }
    for (auto& p : procs) {
      for (int k = 0; k < 2; ++k) {
        auto line = p.ReadLine(std::chrono::minutes(5));
        if (!line.ok()) break;
        const bool acq = line->rfind("acquire ", 0) == 0;
        auto v = ParseDoubles(line->substr(acq ? 8 : 7));
        auto& dst = acq ? four.acquire : four.commit;
        dst.insert(dst.end(), v.begin(), v.end());
      }
      (void)p.Wait(std::chrono::minutes(1));
    }
  }
  if (four.acquire.empty() || four.commit.empty()) {
    std::fprintf(stderr, "kvtier-bench ipc: the 4-client run produced no figures\n");
    return 1;
  }
  Progress("4 clients: acquire p50 %.1f us p99 %.1f us, commit p50 %.1f us\n", Percentile(four.acquire, 50),
           Percentile(four.acquire, 99), Percentile(four.commit, 50));

  j.Add("probe_2k_us", probe_us, 2);
  j.Add("acquire_p50_us", Percentile(one.acquire, 50), 2);
  j.Add("acquire_p99_us", Percentile(one.acquire, 99), 2);
  j.Add("commit_p50_us", Percentile(one.commit, 50), 2);
  j.Add("allocate_p50_us", Percentile(one.allocate, 50), 2);
  j.Add("acquire_p50_us_4c", Percentile(four.acquire, 50), 2);
  j.Add("acquire_p99_us_4c", Percentile(four.acquire, 99), 2);
  j.Add("commit_p50_us_4c", Percentile(four.commit, 50), 2);
  j.Add("uds_rtt_us", uds, 2);
  j.Add("acquire_vs_uds_rtt", Percentile(one.acquire, 50) / uds, 2);
  return 0;
}

// Hidden: one client process of the 4-client run. Prints its latencies.
int RunIpcClient(int argc, char** argv) {
  if (argc != 3) return 2;
  Latencies l = ClientLoop(argv[0], std::strtoull(argv[1], nullptr, 10), std::atoi(argv[2]));
  std::printf("acquire %s\ncommit %s\n", JoinDoubles(l.acquire).c_str(), JoinDoubles(l.commit).c_str());
  return 0;
}

int RunIpcBench(int argc, char** argv) {
  IpcOptions opt;
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      opt.iterations = 200;
      opt.read_iterations = 20;
    } else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) {
      opt.iterations = std::max(10, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--interleaved")) {
      opt.interleaved_only = true;
    } else if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) {
      const int n = std::atoi(argv[++i]);
      if (n < 1 || n > 1024) {
        std::fprintf(stderr, "kvtier-bench ipc: --blocks wants 1 to 1024, not '%s'\n", argv[i]);
        return 2;
      }
      opt.blocks = static_cast<uint32_t>(n);
    } else if (!std::strcmp(argv[i], "--help")) {
      std::printf(
          "usage: kvtier-bench ipc [--quick] [--iterations N] [--interleaved] [--blocks N]\n"
          "Starts kvtierd (host backend) and a redis-server, and measures probe, acquire and\n"
          "commit latency with 1 and 4 client processes, a bare Unix-socket round trip, and\n"
          "reading a 2 MiB block from redis vs from kvtier's host tier.\n"
          "  --quick        fewer iterations\n"
          "  --iterations N calls per measured loop (default 2000; the gap loop makes N/2)\n"
          "  --interleaved  only the interleaved comparisons: acquire against the bare socket,\n"
          "                 kvtierd's Ping and an echo of its frames, back to back and with\n"
          "                 2 ms gaps (the IPC target's figures)\n"
          "  --blocks N     the cached prefix those comparisons acquire, in 16-token blocks\n"
          "                 (default 128: a 2,048-token prompt; 1 to 1024). With 1 the acquire\n"
          "                 costs about what any request does, so the difference is per block\n");
      return 0;
    } else {
      std::fprintf(stderr, "kvtier-bench ipc: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  const MachineInfo machine = ReadMachineInfo();
  testing::DaemonProcess daemon(kBenchConfig);
  const Status started = daemon.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "kvtier-bench ipc: %s\n", started.ToString().c_str());
    return 1;
  }
  Progress("kvtierd up on %s\n", daemon.socket().c_str());

  JsonObject j;
  j.Add("bench", "ipc");
  if (!opt.interleaved_only) {
    const int failed = RunLatencyPhases(daemon.socket(), opt, j);
    if (failed != 0) return failed;
  }

  // The targets' comparison: interleaved, back to back and after 2 ms idle gaps.
  const auto kGap = std::chrono::microseconds(2000);
  const Interleaved b2b =
      AcquireVersusEcho(daemon.socket(), std::chrono::microseconds(0), opt.iterations, false, opt.blocks);
  const Interleaved gap = AcquireVersusEcho(daemon.socket(), kGap, opt.iterations / 2, false, opt.blocks);
  const Interleaved b2b_s =
      AcquireVersusEcho(daemon.socket(), std::chrono::microseconds(0), opt.iterations, true, opt.blocks);
  const Interleaved gap_s = AcquireVersusEcho(daemon.socket(), kGap, opt.iterations / 2, true, opt.blocks);
  if (b2b.acquire.empty() || gap.acquire.empty() || b2b_s.acquire.empty() || gap_s.acquire.empty()) {
    std::fprintf(stderr, "kvtier-bench ipc: the interleaved run produced no figures\n");
    return 1;
  }
  const Interval b2b_ratio = PairedMedianRatio(b2b.acquire, b2b.echo, 1);
  const Interval gap_ratio = PairedMedianRatio(gap.acquire, gap.echo, 2);
  const Interval b2b_ping = PairedMedianRatio(b2b.acquire, b2b.ping, 3);
  const Interval gap_ping = PairedMedianRatio(gap.acquire, gap.ping, 4);
  const Interval b2b_sized = PairedMedianRatio(b2b_s.acquire, b2b_s.echo, 5);
  const Interval gap_sized = PairedMedianRatio(gap_s.acquire, gap_s.echo, 6);
  for (const auto& [what, run, bare, ping] :
       {std::tuple{"back to back", &b2b, &b2b_ratio, &b2b_ping}, {"2 ms gaps", &gap, &gap_ratio, &gap_ping}}) {
    Progress(
        "interleaved, %s: acquire p50 %.1f us; bare socket %.1f us (ratio %.2f [%.2f, %.2f]); kvtierd Ping "
        "%.1f us (ratio %.2f [%.2f, %.2f])\n",
        what, Median(run->acquire), Median(run->echo), bare->value, bare->lo, bare->hi, Median(run->ping), ping->value,
        ping->lo, ping->hi);
  }
  for (const auto& [what, run, ratio] :
       {std::tuple{"back to back", &b2b_s, &b2b_sized}, {"2 ms gaps", &gap_s, &gap_sized}}) {
    Progress(
        "interleaved, %s, an echo of the acquire's frames (%zu bytes out, %zu back): acquire p50 %.1f us; echo "
        "%.1f us (ratio %.2f [%.2f, %.2f])\n",
        what, run->request_bytes, run->reply_bytes, Median(run->acquire), Median(run->echo), ratio->value, ratio->lo,
        ratio->hi);
  }

  j.Add("acquire_b2b_p50_us", Median(b2b.acquire), 2);
  j.Add("uds_b2b_p50_us", Median(b2b.echo), 2);
  j.Add("acquire_vs_uds_b2b", b2b_ratio, 3);
  j.Add("ping_b2b_p50_us", Median(b2b.ping), 2);
  j.Add("acquire_vs_ping_b2b", b2b_ping, 3);
  j.Add("sized_b2b_p50_us", Median(b2b_s.echo), 2);
  j.Add("acquire_vs_sized_b2b", b2b_sized, 3);
  j.Add("acquire_gap_p50_us", Median(gap.acquire), 2);
  j.Add("acquire_gap_p99_us", Percentile(gap.acquire, 99), 2);
  j.Add("uds_gap_p50_us", Median(gap.echo), 2);
  j.Add("acquire_vs_uds_gap", gap_ratio, 3);
  j.Add("ping_gap_p50_us", Median(gap.ping), 2);
  j.Add("acquire_vs_ping_gap", gap_ping, 3);
  j.Add("sized_gap_p50_us", Median(gap_s.echo), 2);
  j.Add("acquire_vs_sized_gap", gap_sized, 3);
  if (!opt.interleaved_only) {
    const ReadFigures rf = ReadBench(daemon.socket(), daemon.dir(), opt.read_iterations);
    Progress("2 MiB block + one pass: redis GET %.1f us, kvtier host tier %.1f us (bytes equal: %s)\n", rf.redis_us,
             rf.kvtier_us, rf.same_bytes ? "yes" : "no");
    j.Add("redis_get_us", rf.redis_us, 1);
    j.Add("kvtier_read_us", rf.kvtier_us, 1);
    j.Add("redis_vs_kvtier_read", rf.kvtier_us > 0 && rf.redis_us > 0 ? rf.redis_us / rf.kvtier_us : -1, 2);
    j.Add("read_bytes_verified", rf.same_bytes ? "yes" : "no");
  }
  j.Add("iterations", static_cast<uint64_t>(opt.iterations));
  j.Add("blocks", static_cast<uint64_t>(opt.blocks));
  j.Add("machine", machine.cpu_model + ", " + std::to_string(machine.cores) + " cores");
  std::printf("%s\n", j.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
