// Operating a real kvtierd: the Prometheus endpoint, systemd notifications and
// configuration reloads on SIGHUP.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <filesystem>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- A plain-socket HTTP client ----

int ConnectTcp(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

void SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads until the peer closes (or `timeout`); "" if nothing came.
std::string ReadToEof(int fd, std::chrono::milliseconds timeout = 5000ms) {
  std::string out;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct HttpReply {
  int status = 0;
  std::string head;  // Status line and headers.
  std::string body;
};

HttpReply ParseReply(const std::string& raw) {
  HttpReply r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + 9);
  r.head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

// One request on a fresh connection that the server is asked to close.
HttpReply Http(int port, const std::string& method, const std::string& target) {
  const int fd = ConnectTcp(port);
  if (fd < 0) return {};
  SendAll(fd, method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  HttpReply r = ParseReply(ReadToEof(fd));
  ::close(fd);
  return r;
}

// ---- The exposition format ----

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Scrape {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // Family -> counter | gauge | histogram.
  std::set<std::string> helps;

  // The one sample of `name` whose labels include `want`; NaN if none.
  double Value(const std::string& name, const std::map<std::string, std::string>& want = {}) const {
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : want) {
        auto it = s.labels.find(k);
        match = match && it != s.labels.end() && it->second == v;
      }
      if (match) return s.value;
    }
    return NAN;
  }
};

bool IsNameChar(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

// Parses every line: "# HELP name text", "# TYPE name type", or
// `name{label="value",...} value`. Any other line is a failure naming it.
Result<Scrape> Parse(const std::string& text) {
  Scrape out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) return InvalidArgument("the exposition does not end with a newline");
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    auto bad = [&](const std::string& why) { return InvalidArgument(why + ": '" + line + "'"); };
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const size_t sp = line.find(' ', 7);
      if (sp == std::string::npos) return bad("a comment without text");
      const std::string family = line.substr(7, sp - 7);
      if (line[2] == 'H') {
        out.helps.insert(family);
      } else {
        const std::string type = line.substr(sp + 1);
        if (type != "counter" && type != "gauge" && type != "histogram") return bad("unknown type");
        if (!out.types.emplace(family, type).second) return bad("a second TYPE line");
      }
      continue;
    }
    if (line.empty() || line[0] == '#') return bad("an unexpected line");
    Sample s;
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i], i == 0)) ++i;
    if (i == 0) return bad("no metric name");
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t key_start = i;
        while (i < line.size() && IsNameChar(line[i], i == key_start)) ++i;
        const std::string key = line.substr(key_start, i - key_start);
        if (key.empty() || line.compare(i, 2, "=\"") != 0) return bad("a malformed label");
        i += 2;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        if (i == line.size()) return bad("an unterminated label value");
        ++i;
        s.labels[key] = value;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i == line.size()) return bad("unterminated labels");
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') return bad("no space before the value");
    const std::string value = line.substr(i + 1);
    if (value == "+Inf") {
      s.value = INFINITY;
    } else if (value == "-Inf") {
      s.value = -INFINITY;
    } else if (value == "NaN") {
      s.value = NAN;
    } else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') return bad("a value that is not a number");
    }
    out.samples.push_back(s);
  }
  return out;
}

// The format's and the naming conventions' rules that hold for every scrape.
void ExpectWellFormed(const Scrape& x) {
  EXPECT_GE(x.types.size(), 20u);
  for (const auto& [family, type] : x.types) {
    EXPECT_EQ(family.rfind("kvtier_", 0), 0u) << family;
    EXPECT_TRUE(x.helps.count(family)) << family << " has no HELP";
    const bool total = family.size() > 6 && family.compare(family.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(total, type == "counter") << family << " is a " << type;
  }
  for (const Sample& s : x.samples) {
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (!x.types.count(family) && family.size() > sfx.size() &&
          family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0) {
        family.resize(family.size() - sfx.size());
      }
    }
    ASSERT_TRUE(x.types.count(family)) << s.name << " has no TYPE line";
    if (x.types.at(family) == "counter") {
      EXPECT_GE(s.value, 0) << s.name;
    }
    if (x.types.at(family) == "histogram" && s.name == family + "_bucket") {
      EXPECT_TRUE(s.labels.count("le")) << s.name;
    }
  }
}

// Buckets of one histogram series: cumulative, ending in +Inf == _count.
void ExpectHistogram(const Scrape& x, const std::string& family, const std::map<std::string, std::string>& labels) {
  double last = 0;
  double inf = -1;
  int buckets = 0;
  for (const Sample& s : x.samples) {
    if (s.name != family + "_bucket") continue;
    bool match = true;
    for (const auto& [k, v] : labels) match = match && s.labels.count(k) && s.labels.at(k) == v;
    if (!match) continue;
    ++buckets;
    EXPECT_GE(s.value, last) << "buckets must be cumulative";
    last = s.value;
    if (s.labels.at("le") == "+Inf") inf = s.value;
  }
  EXPECT_GE(buckets, 10);
  EXPECT_EQ(inf, x.Value(family + "_count", labels));
  EXPECT_GE(x.Value(family + "_sum", labels), 0);
}

// ---- Helpers ----

std::unique_ptr<Client> Connect(const std::string& socket) {
  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "ops-test";
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::vector<TokenId> Tokens(uint32_t seed, size_t n) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>(seed * 7919 + i);
  return t;
}

// Waits until `log()` holds `needle` `count` times (10 s at most).
bool WaitForLog(const DaemonProcess& d, const std::string& needle, int count = 1) {
  const auto deadline = Clock::now() + 10s;
  while (Clock::now() < deadline) {
    const std::string log = d.log();
    int n = 0;
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
    if (n >= count) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// The port of "metrics: serving http://127.0.0.1:PORT/metrics" in the log.
int MetricsPort(const DaemonProcess& d) {
  const std::string log = d.log();
  const std::string needle = "metrics: serving http://127.0.0.1:";
  const size_t at = log.find(needle);
  return at == std::string::npos ? -1 : std::atoi(log.c_str() + at + needle.size());
}

// A sanitizer build's daemon reports into its log, which the test owns.
void ExpectNoSanitizerReport(const std::string& log) {
  for (const char* bad : {"ThreadSanitizer", "AddressSanitizer", "LeakSanitizer", "runtime error:"}) {
    EXPECT_EQ(log.find(bad), std::string::npos) << "kvtierd's log reports " << bad;
  }
}

class OpsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const std::string log = daemon_.log();
    ExpectNoSanitizerReport(log);
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", log.c_str());
  }
  DaemonProcess daemon_{kSmallDaemonConfig};
};

// ---- The metrics endpoint ----

TEST_F(OpsTest, MetricsEndpointCountsTraffic) {
  ASSERT_TRUE(daemon_.Start({"--metrics-listen", "127.0.0.1:0"}).ok()) << daemon_.log();
  const int port = MetricsPort(daemon_);
  ASSERT_GT(port, 0) << daemon_.log();

  auto before = Parse(Http(port, "GET", "/metrics").body);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ExpectWellFormed(*before);
  EXPECT_EQ(before->Value("kvtier_lookup_blocks_total", {{"profile", "it"}, {"result", "hit"}}), 0);
  EXPECT_EQ(before->Value("kvtier_clients"), 0);
  EXPECT_EQ(before->Value("kvtier_tier_slots", {{"profile", "it"}, {"tier", "gpu"}}), 256);
  EXPECT_EQ(before->Value("kvtier_tier_capacity_bytes", {{"profile", "it"}, {"tier", "host"}}), 1024 * 8192);
  EXPECT_EQ(before->types.at("kvtier_rpc_duration_seconds"), "histogram");
  EXPECT_EQ(before->types.at("kvtier_moved_bytes_total"), "counter");
  EXPECT_EQ(before->types.at("kvtier_tier_used_slots"), "gauge");
  EXPECT_EQ(before->Value("kvtier_build_info", {{"backend", "host"}}), 1);

  // Traffic: commit 4 blocks, hit them from another session, miss 3 others,
  // demote them, evict one session.
  auto c = Connect(daemon_.socket());
  ASSERT_NE(c, nullptr);
  const std::vector<TokenId> prompt = Tokens(1, 4 * 16);
  {
    auto w = c->Allocate(4);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto r = c->Commit(*w, "s1", BlockKey{}, 0, prompt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->stored, 4u);
  }
  {
    auto hit = c->Acquire("s2", prompt);
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    EXPECT_EQ(hit->matched(), 4u);
    auto miss = c->Acquire("", Tokens(2, 3 * 16));
    ASSERT_TRUE(miss.ok()) << miss.status().ToString();
    EXPECT_EQ(miss->matched(), 0u);
  }
  ASSERT_TRUE(c->Demote("s1").ok());
  const auto deadline = Clock::now() + 10s;
  for (;;) {
    auto s = c->Stats();
    ASSERT_TRUE(s.ok());
    double demoted = 0;
    for (const auto& [k, v] : *s) demoted = k == "demoted_blocks" ? v : demoted;
    if (demoted == 4 || Clock::now() > deadline) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(c->Evict("s2").ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->Ping().ok());

  auto after = Parse(Http(port, "GET", "/metrics?from=test").body);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ExpectWellFormed(*after);
  const std::map<std::string, std::string> it = {{"profile", "it"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(it.begin(), it.end());
    return extra;
  };
  EXPECT_EQ(after->Value("kvtier_lookup_blocks_total", with({{"result", "hit"}})), 4);
  EXPECT_EQ(after->Value("kvtier_lookup_blocks_total", with({{"result", "miss"}})), 3);
  EXPECT_EQ(after->Value("kvtier_lookup_tokens_total", with({{"result", "hit"}})), 4 * 16);
  EXPECT_EQ(after->Value("kvtier_lookup_tokens_total", with({{"result", "miss"}})), 3 * 16);
  EXPECT_EQ(after->Value("kvtier_committed_blocks_total", it), 4);
  EXPECT_EQ(after->Value("kvtier_moved_blocks_total", with({{"direction", "gpu_to_host"}})), 4);
  EXPECT_EQ(after->Value("kvtier_moved_bytes_total", with({{"direction", "gpu_to_host"}})), 4 * 8192);
  EXPECT_EQ(after->Value("kvtier_moved_blocks_total", with({{"direction", "host_to_gpu"}})), 0);
  EXPECT_EQ(after->Value("kvtier_copy_bytes_total", {{"direction", "gpu_to_host"}}), 4 * 8192);
  EXPECT_GT(after->Value("kvtier_copy_seconds_total", {{"direction", "gpu_to_host"}}), 0);
  EXPECT_GE(after->Value("kvtier_copy_batches_total", {{"direction", "gpu_to_host"}}), 1);
  EXPECT_EQ(after->Value("kvtier_tier_used_slots", with({{"tier", "host"}})), 4);
  EXPECT_EQ(after->Value("kvtier_tier_used_slots", with({{"tier", "gpu"}})), 0);
  EXPECT_EQ(after->Value("kvtier_tier_used_bytes", with({{"tier", "host"}})), 4 * 8192);
  EXPECT_EQ(after->Value("kvtier_evicted_sessions_total", it), 1);
  EXPECT_EQ(after->Value("kvtier_sessions", it), 1);
  EXPECT_EQ(after->Value("kvtier_leases", with({{"kind", "read"}})), 0);
  EXPECT_EQ(after->Value("kvtier_clients"), 1);
  EXPECT_EQ(after->Value("kvtier_client_connections_total"), 1);
  EXPECT_EQ(after->Value("kvtier_rpc_duration_seconds_count", {{"type", "AcquireRequest"}}), 2);
  EXPECT_EQ(after->Value("kvtier_rpc_duration_seconds_count", {{"type", "CommitRequest"}}), 1);
  EXPECT_EQ(after->Value("kvtier_rpc_duration_seconds_count", {{"type", "Ping"}}), 3);
  EXPECT_EQ(after->Value("kvtier_rpc_errors_total", {{"type", "AcquireRequest"}}), 0);
  ExpectHistogram(*after, "kvtier_rpc_duration_seconds", {{"type", "AcquireRequest"}});
  EXPECT_GE(after->Value("kvtier_uptime_seconds"), before->Value("kvtier_uptime_seconds"));

  // An error is counted under its request type.
  EXPECT_EQ(c->Evict("no-such-session").status().code(), StatusCode::kNotFound);
  auto last = Parse(Http(port, "GET", "/metrics").body);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->Value("kvtier_rpc_errors_total", {{"type", "EvictRequest"}}), 1);
}

// What a store counts itself reaches /metrics: its running counts as
// kvtier_store_counter_total, its levels as kvtier_store_level, by counter.
TEST_F(OpsTest, MetricsShowAStoresOwnCounters) {
  char dir[] = "/tmp/kvtier-ops-disk-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  DaemonProcess d(std::string(kSmallDaemonConfig) + "metrics:\n  listen: 127.0.0.1:0\nstores:\n  tiers:\n" +
                  "    - kind: disk\n      path: " + dir + "\n      max_bytes: 1MiB\n");
  ASSERT_TRUE(d.Start().ok()) << d.log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.log();
  auto x = Parse(Http(port, "GET", "/metrics").body);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ExpectWellFormed(*x);
  EXPECT_EQ(x->types.at("kvtier_store_counter_total"), "counter");
  EXPECT_EQ(x->types.at("kvtier_store_level"), "gauge");
  EXPECT_EQ(x->Value("kvtier_store_level", {{"store", "disk"}, {"kind", "disk"}, {"counter", "files"}}), 0);
  EXPECT_EQ(x->Value("kvtier_store_counter_total", {{"store", "disk"}, {"counter", "evicted_files"}}), 0);
  EXPECT_TRUE(std::isnan(x->Value("kvtier_store_level", {{"counter", "evicted_files"}})))
      << "a running count is not a level";
  d.Kill(SIGTERM);
  std::filesystem::remove_all(dir);
}

TEST_F(OpsTest, MetricsEndpointAnswersOnlyGetMetricsAndSurvivesBadRequests) {
  DaemonProcess d(std::string(kSmallDaemonConfig) + "metrics:\n  listen: 127.0.0.1:0\n");
  ASSERT_TRUE(d.Start().ok()) << d.log();
  const int port = MetricsPort(d);
  ASSERT_GT(port, 0) << d.log();

  const HttpReply ok = Http(port, "GET", "/metrics");
  EXPECT_EQ(ok.status, 200) << ok.head;
  EXPECT_NE(ok.head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok.head;
  EXPECT_EQ(Http(port, "GET", "/").status, 404);
  EXPECT_EQ(Http(port, "GET", "/metricsx").status, 404);
  const HttpReply post = Http(port, "POST", "/metrics");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.head.find("Allow: GET"), std::string::npos) << post.head;
  EXPECT_EQ(Http(port, "HEAD", "/metrics").status, 405);
  EXPECT_EQ(Http(port, "DELETE", "/").status, 405);

  auto raw = [&](const std::string& bytes) {
    const int fd = ConnectTcp(port);
    EXPECT_GE(fd, 0);
    SendAll(fd, bytes);
    HttpReply r = ParseReply(ReadToEof(fd));
    ::close(fd);
    return r;
  };
  const char garbage[] = "\x00\x01\x02 garbage\r\n\r\n";
  EXPECT_EQ(raw(std::string(garbage, sizeof garbage - 1)).status, 400);
  EXPECT_EQ(raw("GET /metrics HTTP/9.9\r\n\r\n").status, 400);
  EXPECT_EQ(raw("GET /metrics HTTP/1.1\r\nX-Big: " + std::string(16 * 1024, 'a') + "\r\n\r\n").status, 400);
  EXPECT_EQ(raw("POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + std::string(100, 'x')).status, 400);
  EXPECT_EQ(raw("GET /metrics HTTP/1.1\r\nContent-Length: -5\r\n\r\n").status, 400);
  // Peers that vanish mid-request, or never send anything.
  for (const char* partial : {"", "GET /met", "GET /metrics HTTP/1.1\r\nHost"}) {
    const int fd = ConnectTcp(port);
    ASSERT_GE(fd, 0);
    SendAll(fd, partial);
    ::close(fd);
  }
  // More idle connections than the endpoint serves at once: the extra ones are
  // closed at once, and the daemon goes on.
  std::vector<int> idle;
  for (int i = 0; i < 24; ++i) idle.push_back(ConnectTcp(port));
  auto client = Connect(d.socket());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Ping().ok());
  for (int fd : idle) {
    if (fd >= 0) ::close(fd);
  }
  // The endpoint notices the closes in its own time.
  HttpReply again;
  for (const auto deadline = Clock::now() + 10s; again.status != 200 && Clock::now() < deadline;) {
    again = Http(port, "GET", "/metrics");
  }
  EXPECT_EQ(again.status, 200);

  // Two requests on one kept-alive connection.
  const int fd = ConnectTcp(port);
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
  const std::string both = ReadToEof(fd);
  ::close(fd);
  size_t replies = 0;
  for (size_t at = both.find("HTTP/1.1 200"); at != std::string::npos; at = both.find("HTTP/1.1 200", at + 1)) {
    ++replies;
  }
  EXPECT_EQ(replies, 2u);

  // Still serving both its clients and scrapes.
  EXPECT_TRUE(client->Ping().ok());
  auto x = Parse(Http(port, "GET", "/metrics").body);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(x->Value("kvtier_clients"), 1);
  EXPECT_EQ(x->Value("kvtier_rpc_duration_seconds_count", {{"type", "Ping"}}), 2);
  d.Kill(SIGTERM);
  auto rc = d.Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
  ExpectNoSanitizerReport(d.log());
  if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", d.log().c_str());
}

TEST_F(OpsTest, AnUnusableMetricsAddressStopsTheStart) {
  // Take a port, then ask kvtierd for it.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const Status st = daemon_.Start({"--metrics-listen", taken});
  ::close(fd);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(daemon_.log().find("cannot serve metrics on " + taken), std::string::npos) << daemon_.log();

  auto bad = Process::Spawn({KvtierdPath(), "--config", daemon_.config_path(), "--metrics-listen", "localhost:1"});
  ASSERT_TRUE(bad.ok());
  auto rc = bad->Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2) << "a malformed flag is a usage error";
}

// ---- systemd notifications ----

// A Unix datagram socket standing in for systemd's notification socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ::unlink(path.c_str());
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool ok() const { return bound_; }

  // Messages received until one contains `needle` (kept, in order); false on timeout.
  bool WaitFor(const std::string& needle, std::chrono::milliseconds timeout = 10000ms) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) continue;
      messages.emplace_back(buf, static_cast<size_t>(n));
      if (messages.back().find(needle) != std::string::npos) return true;
    }
  }
  int Count(const std::string& needle) const {
    int n = 0;
    for (const auto& m : messages) n += m.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }

  std::vector<std::string> messages;

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST_F(OpsTest, NotifiesSystemdOfReadinessStatusWatchdogReloadAndStop) {
#ifndef KVTIER_HAVE_SYSTEMD
  GTEST_SKIP() << "kvtierd was built without libsystemd (KVTIER_WITH_SYSTEMD=OFF)";
#endif
  NotifySocket notify(daemon_.dir() + "/notify.sock");
  ASSERT_TRUE(notify.ok());
  // The daemon inherits these; WATCHDOG_PID stays unset, so the interval is for whoever reads it.
  ::setenv("NOTIFY_SOCKET", (daemon_.dir() + "/notify.sock").c_str(), 1);
  ::setenv("WATCHDOG_USEC", "200000", 1);
  const Status started = daemon_.Start();
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(started.ok()) << daemon_.log();

  ASSERT_TRUE(notify.WaitFor("READY=1")) << daemon_.log();
  const std::string ready = notify.messages.back();
  EXPECT_NE(ready.find("STATUS=serving 0 clients, gpu 0% host 0%"), std::string::npos) << ready;
  EXPECT_NE(daemon_.log().find("systemd watchdog: pinging every 100 ms"), std::string::npos) << daemon_.log();
  // Pings every 100 ms.
  const auto t0 = Clock::now();
  ASSERT_TRUE(notify.WaitFor("WATCHDOG=1"));
  ASSERT_TRUE(notify.WaitFor("WATCHDOG=1"));
  ASSERT_TRUE(notify.WaitFor("WATCHDOG=1"));
  EXPECT_LT(Clock::now() - t0, 2s);
  // The status line follows what changes (checked every 5 s).
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(notify.WaitFor("STATUS=serving 1 client, gpu 0% host 0%")) << daemon_.log();
  EXPECT_EQ(notify.messages.back(), "STATUS=serving 1 client, gpu 0% host 0%");

  daemon_.Kill(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("RELOADING=1"));
  EXPECT_NE(notify.messages.back().find("MONOTONIC_USEC="), std::string::npos) << notify.messages.back();
  ASSERT_TRUE(notify.WaitFor("READY=1"));
  EXPECT_EQ(notify.Count("READY=1"), 2);

  daemon_.Kill(SIGTERM);
  ASSERT_TRUE(notify.WaitFor("STOPPING=1"));
  EXPECT_NE(notify.messages.back().find("STATUS=stopping (SIGTERM)"), std::string::npos) << notify.messages.back();
  auto rc = daemon_.Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
}

TEST_F(OpsTest, SighupWithAnUnchangedFileChangesNothing) {
  ASSERT_EQ(std::getenv("NOTIFY_SOCKET"), nullptr);
  ASSERT_EQ(std::getenv("WATCHDOG_USEC"), nullptr);
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  daemon_.Kill(SIGHUP);
  ASSERT_TRUE(WaitForLog(daemon_, "reload: nothing to change"));
  EXPECT_EQ(daemon_.log().find("watchdog"), std::string::npos);
  auto c = Connect(daemon_.socket());
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->Ping().ok());
}

// ---- Reload on SIGHUP ----

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST_F(OpsTest, SighupReloadsWhatCanChangeAndKeepsTheRest) {
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  auto c = Connect(daemon_.socket());
  ASSERT_NE(c, nullptr);
  auto initial = c->Config();
  ASSERT_TRUE(initial.ok());
  EXPECT_NE(initial->find("gpu_high_watermark: 0.9\n"), std::string::npos) << *initial;
  std::string file;
  {
    std::ifstream in(daemon_.config_path());
    file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto rewrite = [&](const std::string& text) { std::ofstream(daemon_.config_path(), std::ios::trunc) << text; };

  // New watermarks, tick, limits and log level: applied.
  const std::string tuned =
      Replace(file, "log_level: info", "log_level: warn") +
      "tiering:\n  gpu_high_watermark: 0.8\n  gpu_low_watermark: 0.6\n  tick_ms: 40\nlimits:\n  max_clients: 9\n";
  rewrite(tuned);
  daemon_.Kill(SIGHUP);
  ASSERT_TRUE(WaitForLog(daemon_, "reload: applied")) << daemon_.log();
  EXPECT_NE(daemon_.log().find("log_level: info -> warn"), std::string::npos) << daemon_.log();
  EXPECT_NE(daemon_.log().find("tiering.gpu_high_watermark: 0.9 -> 0.8"), std::string::npos) << daemon_.log();
  auto reloaded = c->Config();
  ASSERT_TRUE(reloaded.ok());
  for (const char* line : {"log_level: warn\n", "gpu_high_watermark: 0.8\n", "gpu_low_watermark: 0.6\n",
                           "tick_ms: 40\n", "max_clients: 9\n"}) {
    EXPECT_NE(reloaded->find(line), std::string::npos) << line << " in\n" << *reloaded;
  }
  // At warn, a new client is no longer logged (it was at info).
  const auto connected = [&] {
    const std::string log = daemon_.log();
    int n = 0;
    for (size_t at = log.find(" connected: "); at != std::string::npos; at = log.find(" connected: ", at + 1)) ++n;
    return n;
  };
  const int before_quiet = connected();
  EXPECT_GE(before_quiet, 1);
  ASSERT_NE(Connect(daemon_.socket()), nullptr);
  EXPECT_EQ(connected(), before_quiet);

  // A profile size cannot change while running: a warning, the old value stays,
  // and the settings that can change still do.
  rewrite(Replace(Replace(tuned, "gpu_blocks: 256", "gpu_blocks: 512"), "tick_ms: 40", "tick_ms: 30"));
  daemon_.Kill(SIGHUP);
  ASSERT_TRUE(WaitForLog(daemon_, "warn: reload: profiles[0].gpu_blocks: 256 -> 512 cannot change while kvtierd runs"))
      << daemon_.log();
  // The warning comes first; the config is swapped in the same turn of the loop.
  auto kept = c->Config();
  ASSERT_TRUE(kept.ok());
  EXPECT_NE(kept->find("gpu_blocks: 256 "), std::string::npos) << *kept;
  EXPECT_NE(kept->find("tick_ms: 30\n"), std::string::npos) << *kept;
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  for (const auto& [k, v] : *stats) {
    if (k == "gpu_slots") {
      EXPECT_EQ(v, 256);
    }
  }

  // A file that does not parse is rejected whole; the daemon serves on.
  rewrite("profiles: [\n  - {name: p\n");
  daemon_.Kill(SIGHUP);
  ASSERT_TRUE(WaitForLog(daemon_, "reload rejected, the running configuration stays")) << daemon_.log();
  rewrite(Replace(tuned, "gpu_high_watermark: 0.8", "gpu_high_watermark: 7"));
  daemon_.Kill(SIGHUP);
  ASSERT_TRUE(WaitForLog(daemon_, "tiering.gpu_high_watermark: must be in", 1)) << daemon_.log();
  EXPECT_TRUE(c->Ping().ok());
  auto after = c->Config();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, *kept);
  auto other = Connect(daemon_.socket());
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(other->Ping().ok());
}

}  // namespace
}  // namespace kvtier::testing
