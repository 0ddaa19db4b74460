// cachectl against a real kvtierd: every command, --json output, exit codes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kConfig = kSmallDaemonConfig;
constexpr int kPermissionExit = 5;  // cachectl: permission denied.

struct CtlRun {
  int rc = -1;
  std::vector<std::string> lines;
  std::string err;  // stderr
  std::string out() const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
  json Json() const { return lines.empty() ? json() : json::parse(lines.front()); }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs cachectl with `args` (the socket first when given), reads all of its stdout.
// `as`: a command line that runs what follows as another user (setpriv ...).
CtlRun Ctl(const std::string& socket, const std::vector<std::string>& args, const std::vector<std::string>& as = {}) {
  CtlRun run;
  std::vector<std::string> argv = as;
  argv.push_back(CACHECTL_PATH);
  if (!socket.empty()) {
    argv.push_back("--socket");
    argv.push_back(socket);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  char tmpl[] = "/tmp/cachectl-test-err-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  const std::string err_path = tmpl;
  {
    auto p = Process::Spawn(argv, err_path);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return run;
    for (;;) {
      auto line = p->ReadLine(20s);
      if (!line.ok()) {
        EXPECT_EQ(line.status().code(), StatusCode::kNotFound) << line.status().ToString();
        break;
      }
      run.lines.push_back(*line);
    }
    auto rc = p->Wait(20s);
    EXPECT_TRUE(rc.ok()) << rc.status().ToString();
    if (rc.ok()) run.rc = *rc;
  }
  run.err = ReadFile(err_path);
  unlink(err_path.c_str());
  return run;
}

Result<std::string> RunWorker(const std::string& socket, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {WorkerPath(), socket};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Process::Spawn(argv);
  if (!p.ok()) return p.status();
  auto line = p->ReadLine(20s);
  auto rc = p->Wait(20s);
  if (!line.ok()) return line.status();
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return Internal("worker exited " + std::to_string(*rc) + ": " + *line);
  return line;
}

const json* FindSession(const json& list, const std::string& id) {
  for (const json& s : list["sessions"]) {
    if (s["id"] == id) return &s;
  }
  return nullptr;
}

// ---- Without a daemon ----

TEST(CachectlUsage, BadUsageExits2) {
  const std::string sock = "/tmp/cachectl-test-nobody.sock";
  EXPECT_EQ(Ctl(sock, {}).rc, 2);                                  // no command
  EXPECT_EQ(Ctl(sock, {"frobnicate"}).rc, 2);                      // unknown command
  EXPECT_EQ(Ctl(sock, {"session"}).rc, 2);                         // missing ID
  EXPECT_EQ(Ctl(sock, {"pin", "x", "--priority", "9"}).rc, 2);     // out of range
  EXPECT_EQ(Ctl(sock, {"pin", "x", "--priority", "0"}).rc, 2);
  for (const char* ttl : {"5x", "0s", "", "s", "1.5h", "10", "-3s", "9999999999d9999999999d9999999999d"}) {
    auto r = Ctl(sock, {"pin", "x", "--ttl", ttl});
    EXPECT_EQ(r.rc, 2) << "--ttl '" << ttl << "'";
    EXPECT_NE(r.err.find("--ttl"), std::string::npos) << r.err;
  }
  EXPECT_EQ(Ctl(sock, {"sessions", "--sort", "color"}).rc, 2);
  EXPECT_EQ(Ctl(sock, {"--timeout", "soon", "status"}).rc, 2);
  EXPECT_EQ(Ctl(sock, {"evict"}).rc, 2);                           // nothing to evict
  EXPECT_EQ(Ctl(sock, {"evict", "x", "--all"}).rc, 2);             // two targets
  EXPECT_EQ(Ctl(sock, {"stats", "--count", "2"}).rc, 2);           // --count needs --watch
}

TEST(CachectlUsage, HelpForEveryCommand) {
  auto top = Ctl("", {"--help"});
  EXPECT_EQ(top.rc, 0);
  for (const char* cmd :
       {"status", "sessions", "session", "evict", "demote", "prefetch", "pin", "unpin", "stats", "config"}) {
    EXPECT_NE(top.out().find(cmd), std::string::npos) << cmd;
    auto r = Ctl("", {cmd, "--help"});
    EXPECT_EQ(r.rc, 0) << cmd;
    EXPECT_FALSE(r.lines.empty()) << cmd;
  }
}

TEST(CachectlUsage, NoDaemonExits3) {
  char dir[] = "/tmp/cachectl-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string sock = std::string(dir) + "/nothing.sock";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"status"}, {"sessions", "--json"}, {"stats"}, {"evict", "--all"}}) {
    std::vector<std::string> a = {"--timeout", "200"};
    a.insert(a.end(), args.begin(), args.end());
    auto r = Ctl(sock, a);
    EXPECT_EQ(r.rc, 3) << args[0];
    EXPECT_TRUE(r.lines.empty()) << args[0];
    EXPECT_EQ(r.err.rfind("cachectl: ", 0), 0u) << r.err;
  }
  // The socket can also come from the environment.
  setenv("KVTIER_SOCKET", sock.c_str(), 1);
  EXPECT_EQ(Ctl("", {"--timeout", "200", "status"}).rc, 3);
  unsetenv("KVTIER_SOCKET");
  rmdir(dir);
}

// ---- With a daemon ----

class CachectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
    // Two sessions of the default tenant, one of tenant "acme".
    auto a = RunWorker(daemon_.socket(), {"commit", "chat-a", "11", "8"});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = RunWorker(daemon_.socket(), {"commit", "chat-b", "12", "4"});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ClientOptions o;
    o.socket_path = daemon_.socket();
    o.client_name = "cachectl-test";
    o.tenant = "acme";
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<TokenId> tokens(3 * (*c)->block_tokens());
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(1000 + i);
    auto w = (*c)->Allocate(3);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto r = (*c)->Commit(*w, "acme-1", BlockKey{}, 0, tokens);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->stored, 3u);
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  CtlRun Run(const std::vector<std::string>& args) { return Ctl(daemon_.socket(), args); }

  DaemonProcess daemon_{kConfig};
};

TEST_F(CachectlTest, Status) {
  auto text = Run({"status"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out().find("backend:"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("host"), std::string::npos) << text.out();

  auto r = Run({"status", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(r.lines.size(), 1u);
  const json j = r.Json();
  EXPECT_EQ(j["backend"], "host");
  EXPECT_EQ(j["profile"], "it");
  EXPECT_EQ(j["block_tokens"], 16);
  EXPECT_EQ(j["instance_id"].get<std::string>().size(), 16u);
  EXPECT_EQ(j["pools"]["gpu"]["slots"], 256);
  EXPECT_EQ(j["pools"]["gpu"]["used"], 15);
  EXPECT_EQ(j["pools"]["host"]["slots"], 1024);
  EXPECT_EQ(j["sessions"], 3);
  EXPECT_EQ(j["blocks"], 15);
  EXPECT_GE(j["clients"].get<int>(), 1);  // cachectl itself
  EXPECT_GE(j["uptime_s"].get<double>(), 0.0);
}

TEST_F(CachectlTest, Sessions) {
  auto text = Run({"sessions"});
  ASSERT_EQ(text.rc, 0) << text.err;
  ASSERT_EQ(text.lines.size(), 4u) << text.out();  // header + 3
  EXPECT_NE(text.lines[1].find("acme-1"), std::string::npos) << text.out();

  auto r = Run({"sessions", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = r.Json();
  EXPECT_EQ(j["count"], 3);
  ASSERT_EQ(j["sessions"].size(), 3u);
  const json* a = FindSession(j, "chat-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ((*a)["blocks"], 8);
  EXPECT_EQ((*a)["gpu_blocks"], 8);
  EXPECT_EQ((*a)["host_blocks"], 0);
  EXPECT_EQ((*a)["tokens"], 8 * 16);
  EXPECT_EQ((*a)["priority"], 0);
  EXPECT_TRUE((*a)["idle_ms"].is_number());
  const json* acme = FindSession(j, "acme-1");
  ASSERT_NE(acme, nullptr);
  EXPECT_EQ((*acme)["tenant"], "acme");
  EXPECT_EQ((*acme)["blocks"], 3);

  auto t = Run({"sessions", "--tenant", "acme", "--json"}).Json();
  EXPECT_EQ(t["count"], 1);
  EXPECT_EQ(t["sessions"][0]["id"], "acme-1");

  auto top = Run({"--json", "sessions", "--sort", "blocks", "--limit", "2"}).Json();
  ASSERT_EQ(top["count"], 2);
  EXPECT_EQ(top["sessions"][0]["id"], "chat-a");
  EXPECT_EQ(top["sessions"][1]["id"], "chat-b");

  auto by_tokens = Run({"sessions", "--sort", "tokens", "--json"}).Json();
  EXPECT_EQ(by_tokens["sessions"][2]["id"], "acme-1");
  EXPECT_EQ(Run({"sessions", "--sort", "idle"}).rc, 0);
}

// More sessions than one reply of kvtierd holds (a page is at most 4,096):
// libkvtier fetches every page, and cachectl lists each session once.
TEST_F(CachectlTest, SessionsOfMoreThanOnePage) {
  ClientOptions o;
  o.socket_path = daemon_.socket();
  o.tenant = "acme";
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<TokenId> tokens(3 * (*c)->block_tokens());
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(1000 + i);
  constexpr int kMore = 4500;
  for (int i = 0; i < kMore; ++i) {
    auto lease =
        (*c)->Acquire("page-" + std::to_string(i), tokens, kvtier::Promote::kNo);  // acme-1's blocks: a new session.
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    ASSERT_EQ(lease->matched(), 3u);
  }
  auto page = (*c)->ListSessionsPage("", nullptr, 100);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  EXPECT_EQ(page->sessions.size(), 100u);
  EXPECT_TRUE(page->more);
  auto next = (*c)->ListSessionsPage("", &page->sessions.back(), 100);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(next->sessions.front().id, page->sessions.back().id) << "one tenant's page is in id order";

  auto all = Run({"sessions", "--json"});
  ASSERT_EQ(all.rc, 0) << all.err;
  const json j = all.Json();
  EXPECT_EQ(j["count"], 3 + kMore);
  std::set<std::string> seen;
  for (const json& s : j["sessions"]) {
    EXPECT_TRUE(seen.insert(s["tenant"].get<std::string>() + "/" + s["id"].get<std::string>()).second) << s;
  }
  EXPECT_EQ(seen.size(), size_t{3 + kMore});
  EXPECT_EQ(Run({"sessions", "--tenant", "acme", "--json"}).Json()["count"], 1 + kMore);
  auto text = Run({"sessions", "--limit", "5"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_EQ(text.lines.size(), 6u) << text.out();
}

TEST_F(CachectlTest, SessionShowsItsChain) {
  auto text = Run({"session", "chat-b"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out().find("chat-b"), std::string::npos);
  EXPECT_EQ(text.lines.size(), 8u + 4u) << text.out();  // 7 summary lines + header + 4 blocks
  EXPECT_NE(text.out().find("model:    - (no identity given)"), std::string::npos) << text.out();

  auto j = Run({"session", "chat-a", "--json"}).Json();
  EXPECT_EQ(j["id"], "chat-a");
  EXPECT_EQ(j["blocks"], 8);
  ASSERT_EQ(j["chain"].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(j["chain"][i]["index"], i);
    EXPECT_EQ(j["chain"][i]["key"].get<std::string>().size(), 32u);
    EXPECT_EQ(j["chain"][i]["tier"], "gpu");
  }
}

// A disk tier below a 16-block host tier: chat-b's demotion drops chat-a's
// tail there, and `session` says where each of its blocks is.
TEST(CachectlStoresTest, SessionShowsTheBlocksDroppedIntoTheStores) {
  char dir[] = "/tmp/cachectl-disk-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string config = kConfig;
  config.replace(config.find("host_blocks: 1024"), 17, "host_blocks: 16");
  config += "tiering:\n  host_high_watermark: 1.0\n  host_low_watermark: 1.0\n";
  config += "stores:\n  tiers:\n    - kind: disk\n      path: " + std::string(dir) +
            "/blocks\n      max_bytes: 64MiB\n      write: back\n";
  DaemonProcess daemon(config);
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  auto run = [&](const std::vector<std::string>& args) { return Ctl(daemon.socket(), args); };
  auto demote = [&](const std::string& id, int blocks) {
    // The copies are asynchronous: poll until every block is in the host tier.
    for (int i = 0; i < 200; ++i) {
      ASSERT_EQ(run({"demote", id}).rc, 0);
      if ((*FindSession(run({"sessions", "--json"}).Json(), id))["host_blocks"] == blocks) return;
      std::this_thread::sleep_for(20ms);
    }
    FAIL() << id << " was not demoted";
  };
  ASSERT_TRUE(RunWorker(daemon.socket(), {"commit", "chat-a", "11", "12"}).ok());
  demote("chat-a", 12);
  ASSERT_TRUE(RunWorker(daemon.socket(), {"commit", "chat-b", "12", "12"}).ok());
  demote("chat-b", 12);
  json j;
  for (int i = 0; i < 500; ++i) {  // Written back by the stores' thread.
    j = run({"session", "chat-a", "--json"}).Json();
    if (j["chain"].size() == 12u && j["chain"][11]["tier"] == "disk") break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(j["blocks"], 4) << j.dump();
  EXPECT_EQ(j["dropped_blocks"], 8) << j.dump();
  ASSERT_EQ(j["chain"].size(), 12u) << j.dump();
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(j["chain"][i]["tier"], i < 4 ? "host" : "disk") << i;
    EXPECT_EQ(j["chain"][i]["own"], i < 4) << i;
  }
  auto text = run({"session", "chat-a"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out().find("blocks:   4 (gpu 0, host 4, moving 0)"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("dropped:  8 more, into the stores (now: disk 8)"), std::string::npos) << text.out();
  EXPECT_EQ(text.lines.size(), 9u + 12u) << text.out();  // 8 summary lines + header + 12 blocks
  if (::testing::Test::HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon.log().c_str());
  daemon.Kill(SIGTERM);
  EXPECT_TRUE(daemon.Wait(15s).ok());
  std::filesystem::remove_all(dir);
}

TEST_F(CachectlTest, UnknownSessionExits4) {
  for (const char* cmd : {"session", "evict", "demote", "prefetch", "unpin"}) {
    auto r = Run({cmd, "no-such-session"});
    EXPECT_EQ(r.rc, 4) << cmd << ": " << r.err;
    EXPECT_EQ(r.err.rfind("cachectl: ", 0), 0u) << r.err;
    EXPECT_TRUE(r.lines.empty()) << cmd;
  }
  EXPECT_EQ(Run({"pin", "no-such-session", "--priority", "3"}).rc, 4);
}

TEST_F(CachectlTest, PinAndUnpin) {
  auto r = Run({"pin", "chat-b", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["priority"], 7);
  EXPECT_EQ((*FindSession(Run({"sessions", "--json"}).Json(), "chat-b"))["priority"], 7);
  ASSERT_EQ(Run({"pin", "chat-b", "--priority", "3"}).rc, 0);
  EXPECT_EQ((*FindSession(Run({"sessions", "--json"}).Json(), "chat-b"))["priority"], 3);
  ASSERT_EQ(Run({"unpin", "chat-b"}).rc, 0);
  EXPECT_EQ((*FindSession(Run({"sessions", "--json"}).Json(), "chat-b"))["priority"], 0);
}

// The daemon reverts a pin with a TTL on its own, after cachectl has exited.
TEST_F(CachectlTest, PinWithTtlRevertsToZero) {
  auto priority = [&](const std::string& id) {
    return (*FindSession(Run({"sessions", "--json"}).Json(), id))["priority"].get<int>();
  };
  const auto start = std::chrono::steady_clock::now();
  auto r = Run({"pin", "chat-b", "--priority", "5", "--ttl", "1s", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["priority"], 5);
  EXPECT_EQ(r.Json()["ttl_ms"], 1000);
  auto text = Run({"pin", "chat-a", "--priority", "3", "--ttl", "500ms"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_EQ(text.out(), "chat-a: priority 3 for 500ms, then 0\n");
  ASSERT_EQ(Run({"pin", "chat-a", "--priority", "4"}).rc, 0);  // No TTL: cancels the one before.
  EXPECT_EQ(priority("chat-b"), 5);

  int b = 5;
  while (b != 0 && std::chrono::steady_clock::now() - start < 10s) {
    std::this_thread::sleep_for(50ms);
    b = priority("chat-b");
  }
  EXPECT_EQ(b, 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_EQ(priority("chat-a"), 4);
  EXPECT_EQ(Run({"stats", "--json"}).Json()["expired_priorities"], 1);
  // The daemon bounds the TTL.
  auto too_long = Run({"pin", "chat-a", "--ttl", "31d"});
  EXPECT_EQ(too_long.rc, 1);
  EXPECT_NE(too_long.err.find("ttl"), std::string::npos) << too_long.err;
}

TEST_F(CachectlTest, DemoteThenPrefetch) {
  auto d = Run({"demote", "chat-a", "--json"});
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_EQ(d.Json()["session"], "chat-a");
  EXPECT_TRUE(d.Json()["demoted"].is_number());
  // The copy is asynchronous: poll.
  json a;
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  for (;;) {
    a = *FindSession(Run({"sessions", "--json"}).Json(), "chat-a");
    if (a["host_blocks"].get<int>() > 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GT(a["host_blocks"].get<int>(), 0) << a.dump();
  EXPECT_EQ(a["blocks"], 8);

  auto p = Run({"prefetch", "chat-a", "--json"});
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_TRUE(p.Json()["prefetched"].is_number());
  EXPECT_EQ(Run({"prefetch", "chat-a"}).rc, 0);
}

TEST_F(CachectlTest, Evict) {
  auto r = Run({"evict", "chat-a", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.Json()["evicted"], 1);
  auto after = Run({"sessions", "--json"}).Json();
  EXPECT_EQ(after["count"], 2);
  EXPECT_EQ(FindSession(after, "chat-a"), nullptr);
  EXPECT_EQ(Run({"session", "chat-a"}).rc, 4);
  EXPECT_EQ(Run({"stats", "--json"}).Json()["blocks"], 7);

  auto t = Run({"evict", "--tenant", "acme", "--json"});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(t.Json()["evicted"], 1);
  EXPECT_EQ(Run({"sessions", "--json"}).Json()["count"], 1);

  auto all = Run({"evict", "--all"});
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_NE(all.out().find("evicted 1 session"), std::string::npos) << all.out();
  auto empty = Run({"sessions", "--json"}).Json();
  EXPECT_EQ(empty["count"], 0);
  EXPECT_EQ(Run({"stats", "--json"}).Json()["blocks"], 0);
}

TEST_F(CachectlTest, Stats) {
  auto text = Run({"stats"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out().find("gpu_slots"), std::string::npos) << text.out();
  // The summary first: hit rates, where the tokens came from, bytes moved, copy
  // speed, latency percentiles, evictions.
  ASSERT_GE(text.lines.size(), 7u);
  EXPECT_EQ(text.lines[0].rfind("hit rate:     blocks ", 0), 0u) << text.out();
  EXPECT_NE(text.lines[0].find(", tokens "), std::string::npos) << text.out();
  EXPECT_EQ(text.lines[1].rfind("tokens from:  gpu ", 0), 0u) << text.out();
  EXPECT_NE(text.lines[1].find(", stores 0.0%, missed "), std::string::npos) << text.out();
  EXPECT_EQ(text.lines[2].rfind("moved:        gpu->host 0 B (0 blocks), host->gpu 0 B (0 blocks)", 0), 0u)
      << text.out();
  EXPECT_EQ(text.lines[3], "copy speed:   gpu->host -, host->gpu -") << text.out();
  EXPECT_EQ(text.lines[4].rfind("rpc latency:  p50 ", 0), 0u) << text.out();
  EXPECT_NE(text.lines[4].find(", p99 "), std::string::npos) << text.out();
  EXPECT_EQ(text.lines[5], "evictions:    0 sessions evicted, 0 blocks dropped under pressure") << text.out();
  EXPECT_EQ(text.lines[6],
            "leases:       0 held (0 read, 0 write on 0 gpu slots), oldest -; 0 expired (0 write, 0 read)")
      << text.out();

  auto r = Run({"stats", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(r.lines.size(), 1u);
  const json j = r.Json();
  EXPECT_EQ(j["sessions"], 3);
  EXPECT_EQ(j["blocks"], 15);
  EXPECT_EQ(j["gpu_slots"], 256);
  EXPECT_EQ(j["host_slots"], 1024);
  EXPECT_EQ(j["committed_blocks"], 15);
  EXPECT_TRUE(j["uptime_s"].is_number());
  EXPECT_TRUE(j.contains("allocation_failures"));
  EXPECT_EQ(j["leases_expired"], 0);
  EXPECT_EQ(j["leased_slots"], 0);
  EXPECT_EQ(j["oldest_lease_age_s"], 0) << "no lease is held";
  // The workers' commits looked their prompts up first: all misses.
  const double hits = j["hit_blocks"], misses = j["miss_blocks"];
  EXPECT_EQ(misses, 12);
  EXPECT_EQ(j["hit_rate_blocks"].get<double>(), hits / (hits + misses));
  EXPECT_EQ(j["miss_tokens"], 12 * 16);
  EXPECT_EQ(j["hit_rate_tokens"].get<double>(), j["hit_rate_blocks"].get<double>());
  // Nothing was cached when these acquires asked: every token missed.
  EXPECT_EQ(j["tokens_missed"].get<double>() + j["tokens_from_gpu"].get<double>() +
                j["tokens_from_host"].get<double>() + j["tokens_from_stores"].get<double>(),
            1.0);
  EXPECT_TRUE(j["copy_gpu_to_host_bytes_per_s"].is_null()) << "nothing copied yet";
  EXPECT_GT(j["rpc_latency_p50_s"].get<double>(), 0);
  EXPECT_GE(j["rpc_latency_p99_s"].get<double>(), j["rpc_latency_p90_s"].get<double>());
  EXPECT_GE(j["rpc_latency_p90_s"].get<double>(), j["rpc_latency_p50_s"].get<double>());

  // After a demotion the bytes moved and the copy speed show.
  ASSERT_EQ(Run({"demote", "chat-a"}).rc, 0);
  json moved;
  for (const auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    moved = Run({"stats", "--json"}).Json();
    if (moved["demoted_blocks"] == 8) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(moved["demoted_bytes"], 8 * 8192);
  EXPECT_EQ(moved["copy_gpu_to_host_bytes"], 8 * 8192);
  EXPECT_GT(moved["copy_gpu_to_host_bytes_per_s"].get<double>(), 0);
  auto after = Run({"stats"});
  EXPECT_EQ(after.lines[2].rfind("moved:        gpu->host 64.0 KiB (8 blocks)", 0), 0u) << after.out();
  EXPECT_EQ(after.lines[3].find("gpu->host -"), std::string::npos) << after.out();

  auto w = Run({"stats", "--watch", "0.1", "--count", "2", "--json"});
  ASSERT_EQ(w.rc, 0) << w.err;
  ASSERT_EQ(w.lines.size(), 2u) << w.out();
  for (const auto& line : w.lines) {
    const json x = json::parse(line);
    EXPECT_EQ(x["blocks"], 15);
  }
  EXPECT_LE(json::parse(w.lines[0])["uptime_s"].get<double>(), json::parse(w.lines[1])["uptime_s"].get<double>());

  auto wt = Run({"stats", "--watch", "0.05", "--count", "3"});
  ASSERT_EQ(wt.rc, 0) << wt.err;
  EXPECT_EQ(wt.lines.size(), 3 * text.lines.size() + 2) << wt.out();  // blank line between reports
}

TEST_F(CachectlTest, Config) {
  auto text = Run({"config"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out().find("it"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("block_tokens"), std::string::npos) << text.out();

  auto r = Run({"config", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(r.lines.size(), 1u);
  std::string yaml = r.Json()["yaml"].get<std::string>();
  if (!yaml.empty() && yaml.back() != '\n') yaml += '\n';
  EXPECT_EQ(yaml, text.out());
}

// ---- Tenants and permissions ----

constexpr uint32_t kAliceUid = 4243;  // Tenant "a", not an admin.

class CachectlTenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
    chmod(daemon_.dir().c_str(), 0755);
    for (const auto& [tenant, blocks] : {std::pair<std::string, uint32_t>{"a", 2}, {"b", 3}}) {
      ClientOptions o;
      o.socket_path = daemon_.socket();
      o.tenant = tenant;  // The test runs as root: an admin may act as any tenant.
      auto c = Client::Connect(o);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      std::vector<TokenId> tokens(blocks * (*c)->block_tokens(), 7);
      auto w = (*c)->Allocate(blocks);
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*c)->Commit(*w, "chat", BlockKey{}, 0, tokens).ok());
    }
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  CtlRun Run(const std::vector<std::string>& args) { return Ctl(daemon_.socket(), args); }
  CtlRun RunAs(uint32_t uid, const std::vector<std::string>& args, uint32_t gid = 4242) {
    return Ctl(daemon_.socket(), args,
               {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(gid),
                "--clear-groups"});
  }
  static bool Root() { return geteuid() == 0; }

  DaemonProcess daemon_{std::string(kConfig) +
                        "access:\n  group: \"4242\"\n"
                        "tenants:\n  - name: a\n    users: [\"4243\"]\n    gpu_blocks: 8\n"
                        "  - name: b\n    users: [\"4244\"]\n"};
};

TEST_F(CachectlTenantTest, AnAdminSeesEveryTenantAndFiltersByOne) {
  {  // Tenant a loads its prefix twice: once released, once gone with its client.
    ClientOptions o;
    o.socket_path = daemon_.socket();
    o.tenant = "a";
    auto reader = Client::Connect(o);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const std::vector<TokenId> tokens(2 * (*reader)->block_tokens(), 7);
    auto lease = (*reader)->Acquire("", tokens);  // Outside any session.
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    ASSERT_EQ(lease->size(), 2u);
    ASSERT_TRUE(lease->Release().ok());
    auto dropped = (*reader)->Acquire("", tokens);
    ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
    auto disconnected = std::move(*reader);  // Goes with its lease unreleased.
  }
  auto all = Run({"--json", "sessions"});
  ASSERT_EQ(all.rc, 0) << all.err;
  const json j = all.Json();
  ASSERT_EQ(j["count"], 2) << "the same session id in two tenants is two sessions";
  EXPECT_NE(j["sessions"][0]["tenant"], j["sessions"][1]["tenant"]);
  auto stats = Run({"--json", "stats", "--tenant", "a"});
  ASSERT_EQ(stats.rc, 0) << stats.err;
  const json s = stats.Json();
  ASSERT_TRUE(s["tenants"].contains("a")) << s.dump();
  EXPECT_FALSE(s["tenants"].contains("b"));
  EXPECT_EQ(s["tenants"]["a"]["gpu_blocks"], 2);
  EXPECT_EQ(s["tenants"]["a"]["gpu_quota"], 8);
  EXPECT_EQ(s["tenants"]["a"]["leased_blocks"], 0) << "its write lease was committed and released";
  EXPECT_EQ(s["tenants"]["a"]["saved_blocks"], 2);
  EXPECT_EQ(s["tenants"]["a"]["read_blocks"], 4) << "two leases of its two blocks";
  EXPECT_EQ(s["tenants"]["a"]["read_leases"], 1) << "one released";
  EXPECT_EQ(s["tenants"]["a"]["read_errors"], 1) << "one gone with its client";
  EXPECT_GE(s["tenants"]["a"]["read_seconds"], 0);
  auto text = Run({"stats"});
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out().find("tenant b"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("read 4 blocks in 1 leases"), std::string::npos) << text.out();
  EXPECT_NE(text.out().find("1 read errors; saved 2 blocks"), std::string::npos) << text.out();
  // An admin addresses another tenant's session with --tenant.
  auto ev = Run({"--json", "evict", "chat", "--tenant", "b"});
  ASSERT_EQ(ev.rc, 0) << ev.err;
  auto left = Run({"--json", "sessions", "--tenant", "a"}).Json();
  EXPECT_EQ(left["count"], 1);
}

TEST_F(CachectlTenantTest, ANonAdminActingOnAnotherTenantGetsExitCode5) {
  if (!Root()) GTEST_SKIP() << "needs root to run cachectl as another uid (setpriv)";
  auto mine = RunAs(kAliceUid, {"--json", "sessions"});
  ASSERT_EQ(mine.rc, 0) << mine.err;
  ASSERT_EQ(mine.Json()["count"], 1);
  EXPECT_EQ(mine.Json()["sessions"][0]["tenant"], "a");
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"sessions", "--tenant", "b"},
                                             {"evict", "--tenant", "b"},
                                             {"evict", "chat", "--tenant", "b"},
                                             {"evict", "--all"},
                                             {"stats", "--tenant", "b"},
                                             {"config"}}) {
    auto r = RunAs(kAliceUid, args);
    EXPECT_EQ(r.rc, kPermissionExit) << args[0] << " " << args.back() << ": " << r.err;
    EXPECT_NE(r.err.find("not an admin"), std::string::npos) << r.err;
  }
  auto stats = RunAs(kAliceUid, {"--json", "stats"});
  ASSERT_EQ(stats.rc, 0) << stats.err;
  EXPECT_TRUE(stats.Json()["tenants"].contains("a"));
  EXPECT_FALSE(stats.Json()["tenants"].contains("b")) << "another tenant's figures are not shown";
  // Its own "chat" is a's; b's stays.
  auto ev = RunAs(kAliceUid, {"evict", "chat"});
  ASSERT_EQ(ev.rc, 0) << ev.err;
  auto left = Run({"--json", "sessions"}).Json();
  ASSERT_EQ(left["count"], 1);
  EXPECT_EQ(left["sessions"][0]["tenant"], "b");
}

TEST_F(CachectlTenantTest, APeerNotAllowedGetsExitCode5) {
  if (!Root()) GTEST_SKIP() << "needs root to run cachectl as another uid (setpriv)";
  auto r = RunAs(4246, {"status"});
  EXPECT_EQ(r.rc, kPermissionExit) << r.err;
  EXPECT_NE(r.err.find("uid 4246"), std::string::npos) << r.err;
}

TEST_F(CachectlTenantTest, APeerOutsideTheSocketsGroupGetsExitCode5NamingModeAndGroup) {
  if (!Root()) GTEST_SKIP() << "needs root to run cachectl as another uid (setpriv)";
  // gid 4247 is not the socket's group (4242), so connect() itself is refused.
  auto r = RunAs(4246, {"status"}, 4247);
  EXPECT_EQ(r.rc, kPermissionExit) << r.err;
  EXPECT_NE(r.err.find("mode 0660"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("4242"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("uid 4246"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("is kvtierd running"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvtier::testing
